// bindings.h (internal) — the parts of autobatch._core defined outside core.cpp, each by concern:
// the verdict on a failed trial (evidence_binding.cpp) and the names and units of the C++
// vocabulary that the Python package reads instead of spelling them again
// (vocabulary_binding.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace autobatch::python {

/// Defines TrialEvidence (probes/trial_evidence.h, the C++ trial runner's rule) on `m`.
void defineTrialEvidence(pybind11::module_& m);

/// Defines the vocabulary's constants on `m`: STRATEGIES, PLAN_KINDS, FAILURE_KINDS,
/// TRIAL_OUTCOMES (tuples of names, in the C++ enums' order) and CUDA_ALLOCATION_UNITS
/// ({"block_bytes", "page_bytes"}: kCudaCachingAllocatorUnits, autobatch/vocabulary/trial.h).
void defineVocabulary(pybind11::module_& m);

}  // namespace autobatch::python
