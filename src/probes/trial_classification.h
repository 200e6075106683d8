// trial_classification.h (internal) — what a trial's error was, and what the trial runner does
// with it: out of memory and size limits become results (with the trial's figures), an ambiguous
// failure is decided by evidence (the largest batch seen to fit, re-run), anything else is left to
// be rethrown. The runner's memory backend, steps and guards are its own (trial_runner.cpp).
// Thread safety: one thread at a time per TrialEvidence (probes/trial_evidence.h, the rule
// itself, shared with the Python trial).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/trial.h"
#include "memory/memory_backend.h"
#include "probes/trial_evidence.h"

namespace autobatch::detail {

/// What a trial's steps left behind them: the error they raised (null when none), where it was
/// raised, and the time the completed steps took.
struct StepsRun {
  std::exception_ptr error;
  TrialPoint failed_point;
  double total_ms = 0.0;
};

/// What `error` was (a trial that raised none: an empty FailureClass), weighed with `evidence`
/// (TrialEvidence::classify; the process limit asked with the trial's peak). Out of memory and
/// size limits become results: `error` is cleared, freeing it before the cleanup; anything else
/// stays to be rethrown. `near_process_limit` is set to whether the trial came near a process
/// limit.
FailureClass classifyTrialError(std::exception_ptr& error, const MemoryPeaks& peaks,
                                const TrialEvidence& evidence, std::int64_t micro_batch,
                                const MemoryBackend& backend, bool& near_process_limit);

/// Fills the trial's figures (peaks, phase peaks, step time) and outcome into `result`, once it
/// fit, ran out of memory or met a size limit. The failed request is bounded so that the sums
/// made of it stay within int64.
void fillTrialResult(TrialResult& result, const MemoryPeaks& peaks, const FailureClass& failure,
                     const StepsRun& steps);

/// Runs one single-batch trial (the runner's own), for the re-run; may throw.
using RunTrial = std::function<TrialResult(const TrialRequest&)>;

/// TrialEvidence::judge for the runner, after the failed trial's cleanup: the re-run is `run`
/// (what it throws is described, not propagated). It decides memory: `error` is cleared and the
/// re-run kept in result.classification_rerun. The model's or the install's error: `error` is
/// left unchanged and the verdict's warning logged. `failure` becomes the verdict's.
void judgeAmbiguous(TrialEvidence& evidence, const TrialRequest& request, bool process_limit_near,
                    const MemoryBackend& backend, const RunTrial& run, FailureClass& failure,
                    std::exception_ptr& error, TrialResult& result);

}  // namespace autobatch::detail
