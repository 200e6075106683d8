// autobatch._core.TrialEvidence (bindings.h): plain data in and out. A failure's type is
// "out-of-memory" (torch.OutOfMemoryError), "bad-alloc" (MemoryError), "other" (any other
// Exception) or "non-std"; outcomes are the TrialOutcome names ("fits", "out-of-memory",
// "size-limit"); kinds the FailureKind names ("out-of-memory", "size-limit", "rethrow",
// "possible-out-of-memory"). An unknown name is an error, never a default.
#include "python/bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/trial.h"
#include "probes/trial_evidence.h"

namespace py = pybind11;

namespace autobatch::python {
namespace {

using detail::RerunOutcome;
using detail::TrialEvidence;
using detail::Verdict;

ExceptionType exceptionType(const std::string& name) {
  if (name == "out-of-memory") return ExceptionType::kOutOfMemoryError;
  if (name == "bad-alloc") return ExceptionType::kBadAlloc;
  if (name == "other") return ExceptionType::kOther;
  if (name == "non-std") return ExceptionType::kNonStd;
  throw Error(
      "TrialEvidence: expected an exception type \"out-of-memory\", \"bad-alloc\", "
      "\"other\" or \"non-std\", but got \"" +
      name + "\"");
}

FailureKind failureKind(const std::string& name) {
  for (const FailureKind kind : {FailureKind::kOutOfMemory, FailureKind::kSizeLimit,
                                 FailureKind::kRethrow, FailureKind::kPossibleOutOfMemory}) {
    if (toString(kind) == name) return kind;
  }
  throw Error(
      "TrialEvidence: expected a failure kind \"out-of-memory\", \"size-limit\", "
      "\"rethrow\" or \"possible-out-of-memory\", but got \"" +
      name + "\"");
}

TrialOutcome trialOutcome(const std::string& name) {
  for (const TrialOutcome outcome :
       {TrialOutcome::kFits, TrialOutcome::kOutOfMemory, TrialOutcome::kSizeLimit}) {
    if (toString(outcome) == name) return outcome;
  }
  throw Error(
      "TrialEvidence: expected an outcome \"fits\", \"out-of-memory\" or \"size-limit\", "
      "but got \"" +
      name + "\"");
}

py::dict failureDict(const FailureClass& c) {
  py::dict out;
  out["kind"] = std::string(toString(c.kind));
  out["reason"] = c.reason;
  out["failed_request_bytes"] = c.failed_request_bytes;
  out["failed_in_use_bytes"] = c.failed_in_use_bytes;
  return out;
}

// A dict with exactly the keys FailureClass has (failureDict's); any other key is an error.
FailureClass failureFromDict(const py::dict& d) {
  FailureClass c;
  for (const auto& item : d) {
    const auto key = item.first.cast<std::string>();
    if (key == "kind") {
      c.kind = failureKind(item.second.cast<std::string>());
    } else if (key == "reason") {
      c.reason = item.second.cast<std::string>();
    } else if (key == "failed_request_bytes") {
      c.failed_request_bytes = item.second.cast<std::int64_t>();
    } else if (key == "failed_in_use_bytes") {
      c.failed_in_use_bytes = item.second.cast<std::int64_t>();
    } else {
      throw Error("TrialEvidence.judge: unknown key \"" + key +
                  "\" in the failure; expected "
                  "kind, reason, failed_request_bytes, failed_in_use_bytes (classify's dict)");
    }
  }
  return c;
}

// The re-run's answer: {"raised": True, "raised_kind": kind} or {"outcome": outcome}.
RerunOutcome rerunFromDict(const py::dict& d) {
  RerunOutcome r;
  for (const auto& item : d) {
    const auto key = item.first.cast<std::string>();
    if (key == "raised") {
      r.raised = item.second.cast<bool>();
    } else if (key == "raised_kind") {
      r.raised_kind = failureKind(item.second.cast<std::string>());
    } else if (key == "outcome") {
      r.outcome = trialOutcome(item.second.cast<std::string>());
    } else {
      throw Error("TrialEvidence.judge: unknown key \"" + key +
                  "\" in the re-run's answer; "
                  "expected raised, raised_kind, outcome");
    }
  }
  return r;
}

}  // namespace

void defineTrialEvidence(py::module_& m) {
  py::class_<TrialEvidence>(m, "TrialEvidence",
                            "What a kind of trial taught the next ones, and the verdict on a "
                            "failed trial (src/probes/trial_evidence.h): the C++ runner's rule.")
      .def(py::init<>())
      .def(
          "learn",
          [](TrialEvidence& e, std::int64_t micro_batch, int micro_batches,
             const std::string& outcome, bool cancelled) {
            e.learnFrom(micro_batch, micro_batches, trialOutcome(outcome), cancelled);
          },
          py::arg("micro_batch"), py::arg("micro_batches"), py::arg("outcome"),
          py::arg("cancelled") = false, "Learns from a finished single-batch trial.")
      .def("after_larger_oom", &TrialEvidence::afterLargerOom, py::arg("micro_batch"))
      .def("forget_out_of_memory", &TrialEvidence::forgetOutOfMemory)
      .def("forget_trials", &TrialEvidence::forgetTrials)
      .def_property_readonly("classifying", &TrialEvidence::classifying)
      .def(
          "classify",
          [](const TrialEvidence& e, const std::string& type, const std::string& message,
             std::int64_t micro_batch, std::int64_t peak_bytes,
             const TrialEvidence::ProcessLimitNear& near) {
            bool near_out = false;
            py::dict out = failureDict(
                e.classify(exceptionType(type), message, micro_batch, peak_bytes, near, near_out));
            out["process_limit_near"] = near_out;
            return out;
          },
          py::arg("type"), py::arg("message"), py::arg("micro_batch"), py::arg("peak_bytes"),
          py::arg("process_limit_near"),
          "The failure's classification with the evidence: {kind, reason, failed_request_bytes, "
          "failed_in_use_bytes, process_limit_near}. process_limit_near(peak, request) -> bool.")
      .def(
          "judge",
          [](TrialEvidence& e, const py::dict& failure, std::int64_t micro_batch,
             bool process_limit_near, bool limit_set, const py::function& rerun) {
            const Verdict v =
                e.judge(failureFromDict(failure), micro_batch, process_limit_near, limit_set,
                        [&rerun](std::int64_t batch, int micro_batches) {
                          return rerunFromDict(rerun(batch, micro_batches).cast<py::dict>());
                        });
            py::dict out = failureDict(v.failure);
            out["rerun_listed"] = v.rerun_listed;
            out["rerun_reason"] = v.rerun_reason;
            out["warning"] = v.warning;
            return out;
          },
          py::arg("failure"), py::arg("micro_batch"), py::arg("process_limit_near"),
          py::arg("limit_set"), py::arg("rerun"),
          "The verdict on a classified failure (an ambiguous one re-run through rerun(micro_batch, "
          "micro_batches) -> {'outcome'} or {'raised', 'raised_kind'}): the failure's dict with "
          "rerun_listed, rerun_reason and warning.");
}

}  // namespace autobatch::python
