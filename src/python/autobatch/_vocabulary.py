"""The names of the C++ vocabulary that the package compares against, taken once from
autobatch._core (src/python/vocabulary_binding.cpp gives each as a tuple in its C++ enum's order:
FailureKind in include/autobatch/vocabulary/failure.h, TrialOutcome in trial.h), so that no module
spells them a second time."""

from . import _core

# A failure's kind, as _core.classify and TrialEvidence name it.
OUT_OF_MEMORY, SIZE_LIMIT, RETHROW, POSSIBLE_OUT_OF_MEMORY = _core.FAILURE_KINDS
# A trial's outcome in its record and in the report.
FITS, OUTCOME_OUT_OF_MEMORY, OUTCOME_SIZE_LIMIT = _core.TRIAL_OUTCOMES
