// CLI JSON goldens (issue 28, tests/golden/README.md): a CPU-budget run of the CLI reduced to what
// it measured and answered, compared with tests/golden/cli/<case>.json (golden.h; update mode
// AUTOBATCH_UPDATE_GOLDEN=1).
//
// Kept: status, exit_code, error, the model's memory breakdown ("model"), every trial (batch,
// micro-batches per step, outcome, reason, peak allocated / reserved / compared bytes, phase
// peaks, peak phase, failed phase, request and in-use bytes, output bytes, steps completed), the
// result (max and safe micro-batch, capped_by, limit, margin, fit, plans), the check, warnings.
// Dropped, and why:
//   - "autobatch" (autobatch / LibTorch / CUDA versions) and "fingerprint" (the same versions,
//     the model's SHA-1 and size, which change with the LibTorch that saved the archive): an
//     upgrade is no change of behaviour;
//   - "device" (the host's device description; its memory limit is kept in "result"/trials) and
//     "options" (the model's path under the build folder; the flags are in the test itself);
//   - trials' step_ms and samples_per_second, result's elapsed_s and fastest_micro_batch (the
//     trial with the most samples per second), plans' predicted_samples_per_second (from step
//     times), and warnings that quote samples per second ("batch 2291 trains 37423.3 samples/s,
//     more than the largest batch ..."): wall-clock figures;
//   - in a CPU budget out-of-memory reason, the host's memory after "; the whole process is kept"
//     (MemAvailable and the process's resident bytes at start; they moved by ~40 MB between two
//     runs here): replaced by "; <host memory>)". The bytes asked, in use and the limit before it
//     are kept.
//
// The runs pin OMP_NUM_THREADS=2 (ThreadsForGolden): ATen's CPU backward of a conv net allocates
// more with more than one thread (convbn_tiny, as a package or as TorchScript: +29,952 bytes in
// backward at batch 4 and 16 with 2, 3, 4, 8 or 16 threads than with 1; measured here), so an
// unpinned golden would depend on the machine's core count.
#pragma once

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace autobatch::testing {

/// Sets OMP_NUM_THREADS=2 for the CLI processes started while it lives; restores it after.
class ThreadsForGolden {
 public:
  ThreadsForGolden() {
    if (const char* value = std::getenv("OMP_NUM_THREADS")) old_ = value;
    ::setenv("OMP_NUM_THREADS", "2", 1);
  }
  ~ThreadsForGolden() {
    if (old_) {
      ::setenv("OMP_NUM_THREADS", old_->c_str(), 1);
    } else {
      ::unsetenv("OMP_NUM_THREADS");
    }
  }
  ThreadsForGolden(const ThreadsForGolden&) = delete;
  ThreadsForGolden& operator=(const ThreadsForGolden&) = delete;

 private:
  std::optional<std::string> old_;
};

/// The CLI's JSON report `doc` without the fields listed above, pretty-printed as toJson is.
inline std::string normalisedCliJson(nlohmann::json doc) {
  for (const char* key : {"autobatch", "fingerprint", "device", "options"}) doc.erase(key);
  for (auto& trial : doc["trials"]) {
    trial.erase("step_ms");
    trial.erase("samples_per_second");
    std::string reason = trial["reason"];
    const auto host = reason.find("; the whole process is kept");
    if (host != std::string::npos) trial["reason"] = reason.substr(0, host) + "; <host memory>)";
  }
  nlohmann::json warnings = nlohmann::json::array();
  for (const auto& w : doc["warnings"]) {
    if (w.get<std::string>().find("samples/s") == std::string::npos) warnings.push_back(w);
  }
  doc["warnings"] = warnings;
  if (doc["result"].is_object()) {
    doc["result"].erase("elapsed_s");
    doc["result"].erase("fastest_micro_batch");
  }
  if (doc["plans"].is_object()) {
    doc["plans"].erase("predicted_samples_per_second");
    for (const char* kind : {"uniform", "balanced"}) {
      doc["plans"][kind].erase("predicted_samples_per_second");
    }
  }
  return doc.dump(2) + "\n";
}

}  // namespace autobatch::testing
