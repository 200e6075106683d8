// The verdict on a failed trial, for both front doors (trial_evidence.h).
#include "probes/trial_evidence.h"

#include <algorithm>
#include <string>

namespace autobatch::detail {

void TrialEvidence::learnFrom(std::int64_t micro_batch, int micro_batches, TrialOutcome outcome,
                              bool cancelled) {
  if (outcome == TrialOutcome::kOutOfMemory) {
    last_oom_batch_ = std::max(last_oom_batch_, micro_batch);
    return;
  }
  if (outcome == TrialOutcome::kSizeLimit) return;
  last_oom_batch_ = 0;
  if (!cancelled && micro_batch >= largest_fit_batch_) {
    largest_fit_batch_ = micro_batch;
    largest_fit_micro_batches_ = micro_batches;
  }
}

void TrialEvidence::learnFrom(const TrialResult& result) {
  learnFrom(result.request.micro_batch_size, result.request.micro_batches_per_step, result.outcome,
            result.cancelled);
}

void TrialEvidence::forgetTrials() {
  last_oom_batch_ = 0;
  largest_fit_batch_ = 0;
  largest_fit_micro_batches_ = 1;
}

FailureClass TrialEvidence::classify(ExceptionType type, std::string_view message,
                                     std::int64_t micro_batch, std::int64_t peak_bytes,
                                     const ProcessLimitNear& near, bool& near_out) const {
  // The request the message names, whatever the context: a refused R-byte request says how near
  // the process was to its limit (FailureContext::process_limit_near).
  const FailureClass loose = classifyFailure(type, message, {true, true});
  FailureContext context;
  context.process_limit_near = near && near(peak_bytes, loose.failed_request_bytes);
  context.after_larger_oom = afterLargerOom(micro_batch);
  near_out = context.process_limit_near;
  return classifyFailure(type, message, context);
}

Verdict TrialEvidence::judge(const FailureClass& failure, std::int64_t micro_batch,
                             bool process_limit_near, bool limit_set, const Rerun& rerun) {
  Verdict verdict;
  verdict.failure = failure;
  if (failure.kind != FailureKind::kPossibleOutOfMemory) return verdict;
  if (classifying_) {  // the outer trial decides; the error leaves the re-run unchanged
    verdict.failure.kind = FailureKind::kRethrow;
    return verdict;
  }
  if (largest_fit_batch_ == 0) {
    verdict.failure.kind = FailureKind::kOutOfMemory;
    verdict.failure.reason += " (taken as out of memory: nothing has fitted yet to re-run)";
    return verdict;
  }
  const std::int64_t again = largest_fit_batch_;
  // Read before the re-run: a re-run that raises makes its door forget the last out of memory
  // (forgetOutOfMemory), which would leave the boundary rule below never true.
  const bool oom_seen = last_oom_batch_ > 0;
  classifying_ = true;
  RerunOutcome rerun_outcome;
  try {
    rerun_outcome = rerun(again, largest_fit_micro_batches_);
  } catch (...) {
    classifying_ = false;
    throw;
  }
  classifying_ = false;
  if (rerun_outcome.raised) {
    // Near a process limit (RLIMIT_DATA, a cgroup), a re-run that fails with a sign of
    // exhaustion again (oneDNN "could not create a primitive" after the process's heap grew
    // past where the batch fit before) says memory is tight, not that the model is broken:
    // that batch fit before. "Near": this trial came near the limit, or a process limit is set
    // and a trial has already run out of memory (the search is at the boundary).
    const bool at_the_boundary = process_limit_near || (oom_seen && limit_set);
    const bool exhausted = rerun_outcome.raised_kind == FailureKind::kOutOfMemory ||
                           rerun_outcome.raised_kind == FailureKind::kPossibleOutOfMemory;
    if (at_the_boundary && exhausted) {
      verdict.failure.kind = FailureKind::kOutOfMemory;
      verdict.failure.reason += " (taken as out of memory: the re-run at batch " +
                                std::to_string(again) +
                                ", which fit before, failed the same way; memory is tight)";
      return verdict;
    }
  }
  // A cancelled re-run returns as fitting (its steps so far ran), as a cancelled trial does.
  const bool decided =
      !rerun_outcome.raised && (rerun_outcome.outcome == TrialOutcome::kFits ||
                                rerun_outcome.outcome == TrialOutcome::kOutOfMemory);
  if (!decided) {
    verdict.failure.kind = FailureKind::kRethrow;
    verdict.warning = "batch " + std::to_string(micro_batch) + " failed with \"" + failure.reason +
                      "\", and the re-run at batch " + std::to_string(again) +
                      ", which fit before, failed too: a model or install error, not out of memory";
    return verdict;
  }
  verdict.rerun_listed = true;
  verdict.rerun_reason = "re-run to classify: " + failure.reason;
  verdict.failure.kind = FailureKind::kOutOfMemory;
  verdict.failure.reason += " (out of memory: batch " + std::to_string(again) +
                            " fit when re-run with the cache emptied)";
  return verdict;
}

}  // namespace autobatch::detail
