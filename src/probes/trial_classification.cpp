// What a trial's error was, and the re-run that decides an ambiguous one
// (trial_classification.h).
#include "probes/trial_classification.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

namespace autobatch::detail {

FailureClass classifyTrialError(std::exception_ptr& error, const MemoryPeaks& peaks,
                                const TrialEvidence& evidence, std::int64_t micro_batch,
                                const MemoryBackend& backend, bool& near_process_limit) {
  FailureClass failure;
  near_process_limit = false;
  if (!error) return failure;
  const RaisedError raised = describeException(error);
  failure = evidence.classify(
      raised.type, raised.message, micro_batch, peaks.peak_bytes,
      [&backend](std::int64_t peak, std::int64_t request) {
        return backend.processLimitNear(peak, request);
      },
      near_process_limit);
  if (failure.kind == FailureKind::kOutOfMemory || failure.kind == FailureKind::kSizeLimit) {
    error = nullptr;
  }
  return failure;
}

void fillTrialResult(TrialResult& result, const MemoryPeaks& peaks, const FailureClass& failure,
                     const StepsRun& steps) {
  result.peak_allocated_bytes = peaks.peak_allocated_bytes;
  result.peak_reserved_bytes = peaks.peak_reserved_bytes;
  result.peak_bytes = peaks.peak_bytes;
  result.allocator_retries = peaks.allocator_retries;
  result.inactive_split_peak_bytes = peaks.inactive_split_peak_bytes;
  result.outside_growth_bytes = peaks.outside_growth_bytes;
  for (const auto& p : peaks.phase_peaks) {
    result.phase_peaks.push_back({phaseKey(p.phase), p.micro_batch_index, p.peak_bytes});
  }
  result.step_ms = result.steps_completed > 0
                       ? steps.total_ms / static_cast<double>(result.steps_completed)
                       : 0.0;
  if (failure.kind == FailureKind::kOutOfMemory) {
    result.outcome = TrialOutcome::kOutOfMemory;
    result.reason = failure.reason;
    result.failed_in_use_bytes = failure.failed_in_use_bytes;
    // A request near 2^63 bytes (an input too large to count, issue 27 row 13): bounded so that
    // the sums made of it (in use + request, peak + request) stay within int64.
    result.failed_request_bytes =
        std::min(failure.failed_request_bytes,
                 std::numeric_limits<std::int64_t>::max() -
                     std::max({result.peak_bytes, result.failed_in_use_bytes, std::int64_t{0}}));
    if (steps.failed_point.phase != TrialPhase::kIdle) {
      result.failed_phase = phaseKey(steps.failed_point.phase);
      result.failed_micro_batch_index = steps.failed_point.micro_batch_index;
      result.failed_step_index = steps.failed_point.step;
    }
  } else if (failure.kind == FailureKind::kSizeLimit && !failure.reason.empty()) {
    result.outcome = TrialOutcome::kSizeLimit;
    result.reason = failure.reason;
  } else if (result.cancelled) {
    result.reason = "cancelled";
  }
}

void judgeAmbiguous(TrialEvidence& evidence, const TrialRequest& request, bool process_limit_near,
                    const MemoryBackend& backend, const RunTrial& run, FailureClass& failure,
                    std::exception_ptr& error, TrialResult& result) {
  TrialResult rerun_result;
  const TrialEvidence::Rerun rerun = [&](std::int64_t micro_batch, int micro_batches) {
    TrialRequest again;
    again.micro_batch_size = micro_batch;
    again.micro_batches_per_step = micro_batches;
    again.cancel = request.cancel;
    RerunOutcome outcome;
    try {
      rerun_result = run(again);
      outcome.outcome = rerun_result.outcome;
    } catch (...) {
      outcome.raised = true;
      outcome.raised_kind = classifyException(std::current_exception(), {true, true}).kind;
    }
    return outcome;
  };
  const Verdict verdict = evidence.judge(failure, request.micro_batch_size, process_limit_near,
                                         backend.processLimitNear(0, 1), rerun);
  failure = verdict.failure;
  if (!verdict.warning.empty()) spdlog::warn("{}", verdict.warning);
  if (verdict.rerun_listed) {
    rerun_result.reason = verdict.rerun_reason;
    result.classification_rerun = std::make_shared<const TrialResult>(std::move(rerun_result));
  }
  if (failure.kind != FailureKind::kRethrow) error = nullptr;
}

}  // namespace autobatch::detail
