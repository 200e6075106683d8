// evidence_binding.h (internal) — autobatch._core.TrialEvidence: the verdict on a failed trial
// (probes/trial_evidence.h) for the Python trial (autobatch/_trial.py), the same object the C++
// trial runner uses.
#pragma once

#include <pybind11/pybind11.h>

namespace autobatch::python {

/// Defines TrialEvidence and the failure kinds' names on `m`.
void defineTrialEvidence(pybind11::module_& m);

}  // namespace autobatch::python
