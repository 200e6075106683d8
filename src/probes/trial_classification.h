// trial_classification.h (internal) — what a trial's error was, and what the trial runner does
// with it: out of memory and size limits become results (with the trial's figures), an ambiguous
// failure is decided by evidence (the largest batch seen to fit, re-run), anything else is left to
// be rethrown. The runner's memory backend, steps and guards are its own (trial_runner.cpp).
// Thread safety: one thread at a time per TrialEvidence.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/trial.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {

/// What a trial's steps left behind them: the error they raised (null when none), where it was
/// raised, and the time the completed steps took.
struct StepsRun {
  std::exception_ptr error;
  TrialPoint failed_point;
  double total_ms = 0.0;
};

/// What `error` was (a trial that raised none: an empty FailureClass). Out of memory and size
/// limits become results: `error` is cleared, freeing it before the cleanup; anything else stays
/// to be rethrown. `near_process_limit` is set to whether the trial came near a process limit
/// (backend.processLimitNear with the trial's peak and the refused request).
FailureClass classifyTrialError(std::exception_ptr& error, const MemoryPeaks& peaks,
                                bool after_larger_oom, const MemoryBackend& backend,
                                bool& near_process_limit);

/// Fills the trial's figures (peaks, phase peaks, step time) and outcome into `result`, once it
/// fit, ran out of memory or met a size limit. The failed request is bounded so that the sums
/// made of it stay within int64.
void fillTrialResult(TrialResult& result, const MemoryPeaks& peaks, const FailureClass& failure,
                     const StepsRun& steps);

/// What single-batch trials taught the next ones: the last out of memory (evidence for an
/// ambiguous failure at a smaller batch) and the largest fit (where one is re-run).
class TrialEvidence {
 public:
  /// Runs one single-batch trial (the runner's own), for the re-run; may throw.
  using Rerun = std::function<TrialResult(const TrialRequest&)>;

  /// Learns from a finished single-batch trial (mixed trials teach nothing).
  void learnFrom(const TrialResult& result);
  /// True when the last trial ran out of memory at a batch larger than `batch`.
  bool afterLargerOom(std::int64_t batch) const { return last_oom_batch_ > batch; }
  /// Forgets the last out of memory (a trial raised an error that leaves).
  void forgetOutOfMemory() { last_oom_batch_ = 0; }
  /// Forgets the last out of memory and the largest fit (after the warm-up step).
  void forgetTrials() {
    last_oom_batch_ = 0;
    largest_fit_batch_ = 0;
  }

  /// An ambiguous failure at `request`: re-runs the largest batch already seen to fit (with the
  /// cache emptied by the failed trial's cleanup). It fits: the failure was out of memory
  /// (`error` cleared, the re-run kept in result.classification_rerun). The error persists there:
  /// it is the model's or the install's, and `error` is left unchanged (a warning is logged).
  /// Nothing fitted yet: out of memory. Inside a re-run: nothing (the outer trial decides).
  void classifyAmbiguous(const TrialRequest& request, bool process_limit_near,
                         const MemoryBackend& backend, const Rerun& rerun, FailureClass& failure,
                         std::exception_ptr& error, TrialResult& result);

 private:
  std::int64_t last_oom_batch_ = 0;
  std::int64_t largest_fit_batch_ = 0;
  int largest_fit_micro_batches_ = 1;
  bool classifying_ = false;  // inside a re-run to classify: no nested re-run
};

}  // namespace autobatch::detail
