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
                                bool after_larger_oom, const MemoryBackend& backend,
                                bool& near_process_limit) {
  FailureClass failure;
  if (!error) return failure;
  const FailureClass loose = classifyException(error, {true, true});
  FailureContext context;
  context.process_limit_near =
      backend.processLimitNear(peaks.peak_bytes, loose.failed_request_bytes);
  near_process_limit = context.process_limit_near;
  context.after_larger_oom = after_larger_oom;
  failure = classifyException(error, context);
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

void TrialEvidence::learnFrom(const TrialResult& result) {
  const std::int64_t batch = result.request.micro_batch_size;
  if (result.outcome == TrialOutcome::kOutOfMemory) {
    last_oom_batch_ = std::max(last_oom_batch_, batch);
    return;
  }
  if (result.outcome == TrialOutcome::kSizeLimit) return;
  last_oom_batch_ = 0;
  if (!result.cancelled && batch >= largest_fit_batch_) {
    largest_fit_batch_ = batch;
    largest_fit_micro_batches_ = result.request.micro_batches_per_step;
  }
}

void TrialEvidence::classifyAmbiguous(const TrialRequest& request, bool process_limit_near,
                                      const MemoryBackend& backend, const Rerun& rerun,
                                      FailureClass& failure, std::exception_ptr& error,
                                      TrialResult& result) {
  if (largest_fit_batch_ == 0 || classifying_) {
    if (classifying_) return;  // the outer trial decides; `error` leaves the re-run unchanged
    failure.kind = FailureKind::kOutOfMemory;
    failure.reason += " (taken as out of memory: nothing has fitted yet to re-run)";
    error = nullptr;
    return;
  }
  TrialRequest again;
  again.micro_batch_size = largest_fit_batch_;
  again.micro_batches_per_step = largest_fit_micro_batches_;
  again.cancel = request.cancel;
  classifying_ = true;
  TrialResult rerun_result;
  bool persisted = false;
  bool inconclusive = false;
  try {
    rerun_result = rerun(again);
    persisted = rerun_result.outcome != TrialOutcome::kFits &&
                rerun_result.outcome != TrialOutcome::kOutOfMemory;
  } catch (const std::exception&) {
    // Near a process limit (RLIMIT_DATA, a cgroup), a re-run that fails with a sign of
    // exhaustion again (oneDNN "could not create a primitive" after the process's heap grew
    // past where the batch fit before) says memory is tight, not that the model is broken:
    // that batch fit before. "Near": this trial came near the limit, or a process limit is set
    // and this runner has already run out of memory (the search is at the boundary). Otherwise
    // it persists: the model's error.
    const FailureClass again_class = classifyException(std::current_exception(), {true, true});
    const bool at_the_boundary =
        process_limit_near || (last_oom_batch_ > 0 && backend.processLimitNear(0, 1));
    inconclusive = at_the_boundary && (again_class.kind == FailureKind::kOutOfMemory ||
                                       again_class.kind == FailureKind::kPossibleOutOfMemory);
    persisted = !inconclusive;
  }
  classifying_ = false;
  if (inconclusive) {
    failure.kind = FailureKind::kOutOfMemory;
    failure.reason += " (taken as out of memory: the re-run at batch " +
                      std::to_string(largest_fit_batch_) +
                      ", which fit before, failed the same way; memory is tight)";
    error = nullptr;
    return;
  }
  if (persisted) {
    spdlog::warn(
        "batch {} failed with \"{}\", and the re-run at batch {}, which fit before, failed "
        "too: a model or install error, not out of memory",
        request.micro_batch_size, failure.reason, largest_fit_batch_);
    return;  // `error` is rethrown by the caller
  }
  rerun_result.reason = "re-run to classify: " + failure.reason;
  result.classification_rerun = std::make_shared<const TrialResult>(std::move(rerun_result));
  failure.kind = FailureKind::kOutOfMemory;
  failure.reason += " (out of memory: batch " + std::to_string(largest_fit_batch_) +
                    " fit when re-run with the cache emptied)";
  error = nullptr;
}

}  // namespace autobatch::detail
