// trial_evidence.h (internal) — the verdict on a failed trial, for both front doors: what the
// error was, given what the trials before it taught (the last out of memory, the largest fit), and
// the re-run that decides an ambiguous failure. The C++ trial runner (trial_runner.cpp) and the
// Python trial (autobatch/_trial.py, through autobatch._core.TrialEvidence) each run the steps,
// catch what they raise and clean up; what the failure means is decided here, once.
// LibTorch-free and spdlog-free (it is part of autobatch._core, which links neither): a warning
// comes back as text in the Verdict for the door to log.
// Thread safety: one thread at a time per TrialEvidence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch::detail {

/// How a re-run to classify ended, as the door saw it.
struct RerunOutcome {
  /// The re-run raised an error that leaves (its own verdict: the model's or the install's).
  bool raised = false;
  /// When raised: the loose classification of that error (classifyFailure with every context
  /// flag set), which tells whether it was a sign of exhaustion again.
  FailureKind raised_kind = FailureKind::kRethrow;
  /// When it returned: its outcome (a cancelled re-run returns kFits, as a cancelled trial does).
  TrialOutcome outcome = TrialOutcome::kFits;
};

/// What a failed trial is, once the evidence has been weighed.
struct Verdict {
  /// kOutOfMemory or kSizeLimit: a result; kRethrow: the error leaves unchanged.
  FailureClass failure;
  /// The re-run to classify that decided it ran and returned (fits or out of memory): the door
  /// lists it before the failed trial, with its reason set to `rerun_reason`.
  bool rerun_listed = false;
  std::string rerun_reason;
  /// A warning for the door to log (empty: none).
  std::string warning;
};

/// What single-batch trials taught the next ones: the last out of memory (evidence for an
/// allocation failure at a smaller batch) and the largest fit (where an ambiguous failure is
/// re-run). One per kind of trial (the training trials and the evaluation trials learn apart).
class TrialEvidence {
 public:
  /// Whether a process limit (RLIMIT_DATA, a cgroup) is near: the door's memory backend's
  /// processLimitNear(peak bytes, failed request bytes).
  using ProcessLimitNear = std::function<bool(std::int64_t, std::int64_t)>;
  /// Runs one single-batch trial (micro-batch, micro-batches per step), for the re-run. Must not
  /// throw: an error it raises is reported as RerunOutcome::raised.
  using Rerun = std::function<RerunOutcome(std::int64_t, int)>;

  /// Learns from a finished single-batch trial (mixed trials teach nothing): an out of memory is
  /// remembered (the largest since the last fit), a fit forgets it and may be the largest fit, a
  /// size limit teaches nothing, a cancelled trial forgets the out of memory only.
  void learnFrom(std::int64_t micro_batch, int micro_batches, TrialOutcome outcome, bool cancelled);
  void learnFrom(const TrialResult& result);
  /// True when the last trial ran out of memory at a batch larger than `micro_batch`.
  bool afterLargerOom(std::int64_t micro_batch) const { return last_oom_batch_ > micro_batch; }
  /// Forgets the last out of memory (a trial raised an error that leaves).
  void forgetOutOfMemory() { last_oom_batch_ = 0; }
  /// Forgets the last out of memory and the largest fit (after the warm-up step).
  void forgetTrials();
  /// True while a re-run to classify is in progress (no nested re-run).
  bool classifying() const { return classifying_; }

  /// The classification of a trial's error at `micro_batch` (classifyFailure), with the evidence
  /// as its context: after_larger_oom from the last out of memory, process_limit_near from
  /// `near(peak_bytes, the request the message names)`. `near_out` is set to the latter.
  FailureClass classify(ExceptionType type, std::string_view message, std::int64_t micro_batch,
                        std::int64_t peak_bytes, const ProcessLimitNear& near,
                        bool& near_out) const;

  /// The verdict on `failure` at `micro_batch`. Anything but kPossibleOutOfMemory is returned as
  /// it is. An ambiguous failure re-runs the largest batch already seen to fit (the door has
  /// emptied the cache): it fits or runs out of memory, so the failure was memory; it raises a
  /// sign of exhaustion again where a process limit is near (this trial came near it, or one is
  /// set and a trial has already run out of memory: `limit_set` is near(0, 1)), memory again;
  /// it raises anything else: the model's or the install's error (kRethrow, with a warning).
  /// Nothing fitted yet: out of memory. Inside a re-run: kRethrow, no warning (the outer trial
  /// decides).
  Verdict judge(const FailureClass& failure, std::int64_t micro_batch, bool process_limit_near,
                bool limit_set, const Rerun& rerun);

 private:
  std::int64_t last_oom_batch_ = 0;
  std::int64_t largest_fit_batch_ = 0;
  int largest_fit_micro_batches_ = 1;
  bool classifying_ = false;  // inside a re-run to classify: no nested re-run
};

}  // namespace autobatch::detail
