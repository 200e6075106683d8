// search_driver.h (internal) — the search's driver (findMaxBatch, autobatch/search/search.h): one
// search over one kind of trial (micro-batches per step). It owns the bracket, the trial and time
// budgets, cancellation, retries of contradicted failures, the safe phase, the plan verification
// and the guarantees (never an unverified answer, non-monotonic memory reported, bounds kept);
// which batch comes next is a strategy's question (search_strategy.h). Its loop and bookkeeping
// are in search.cpp, the safe phase, plan verification and plan speeds in search_plan.cpp, the
// result's summary in search_finish.cpp. Thread safety: one search per object, on one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "autobatch/search/search.h"
#include "search/search_strategy.h"

namespace autobatch::detail {

/// `value` with one decimal ("2.5").
std::string oneDecimal(double value);
/// "<formatBytes> (<n> bytes)".
std::string bytesText(std::int64_t bytes);

/// The fastest batch must beat the largest by this factor before a warning (and balanced beat
/// uniform before it is chosen by PlanKind::kFastest): step times are noisy.
inline constexpr double kFasterFactor = 1.05;

class SearchDriver {
 public:
  /// `probe` and `options` (validated) must outlive the driver.
  SearchDriver(const Probe& probe, const SearchOptions& options);
  /// The maximum, then the safe batch, the plan and its speeds, then the summary.
  SearchResult run();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Stop { kNone, kTrialBudget, kTimeBudget, kCancelled };

  double elapsedS() const;  // seconds since the search started
  /// Runs one trial, or none when a budget ran out or the cancel hook fired (then stop_ is set).
  /// `measuring`: TrialRequest::measure (the strategy asks for measurements only).
  const TrialResult* trial(std::int64_t batch, int micro_batches_per_step, bool measuring = false);
  /// Seconds a trial of `batch` x `micro_batches` would take, leaning short: the most steps a
  /// trial completed, each on an affine model of the measured step times, time = overhead +
  /// per-sample cost x samples, through the trial with the most samples per step and never below
  /// the one with the fewest (whose time is at least the overhead). The per-sample cost is the
  /// secant between those two, taken only when the larger took at least twice as long (its time is
  /// then mostly work per sample); otherwise, with two sizes measured, the larger's whole time per
  /// sample (an upper bound: a larger batch that stepped faster is noise, not zero cost per sample,
  /// issue 40 row 15); with one size, 0. A small trial's time is mostly fixed overhead: 1.3 ms per
  /// step at batch 1 of a Linear(5, 5) said 233.9 s at batch 91678 when scaled per sample, for a
  /// trial that took well under a second (issue 27, row 10), so batch 1 alone never scales. A
  /// prediction that comes out short costs at most one step past the deadline: the deadline hook
  /// stops a trial between its steps. 0 when no trial completed a step.
  double predictTrialSeconds(std::int64_t batch, int micro_batches) const;
  /// What a fitting trial measured, filed for the strategies (MeasuredFit).
  static MeasuredFit measure(const TrialResult& r);
  /// The budget of the maximum search: the limit in force (no budget when unknown).
  std::int64_t maxBudget() const;
  /// A fit counts under `budget` when its peak is within it; for the maximum also when the limit
  /// did not fall since it ran (a peak over the limit is a trial's own business: the allocator
  /// let it fit), but not after a fall (a CPU allocator that lost room after a failure).
  /// The safe batch's search is strict: only a peak within the budget counts.
  bool counts(const MeasuredFit& m, std::int64_t budget, bool strict) const;
  /// The largest fit that counts under `budget` (`confirmed`: a full trial's fit, never a
  /// shortened measuring trial's: an answer); 0 when none.
  std::int64_t lowUnder(std::int64_t budget, bool strict, bool confirmed = false) const;
  /// The smallest batch above `low` known not to fit under `budget` (a failure, or a fit that
  /// does not count), or the cap + 1.
  std::int64_t highAbove(std::int64_t budget, bool strict, std::int64_t low) const;
  std::int64_t lo() const;
  std::int64_t hi() const;
  bool closed(std::int64_t low, std::int64_t high) const;
  /// Tries `batch` in the search's mode and files the outcome; returns true when it fit, false
  /// when it failed or the search was stopped (check stop_). Contradictions with earlier
  /// outcomes (a failure below a fit) re-try the failed size once and are reported.
  /// `measuring`: the strategy asks for measurements only (the probe may shorten the trial).
  bool tryBatch(std::int64_t batch, bool measuring = false);
  void retryFailure(std::int64_t failed, std::int64_t fitting);
  /// The bracket of `goal`: the maximum's under the limit in force (a fit whose limit did not fall
  /// since counts), the safe batch's under `budget` (strict), below the maximum.
  Bracket bracket(SearchGoal goal, std::int64_t budget) const;
  /// The one driver loop, for the maximum (`budget` unused) and the safe batch: asks the
  /// strategy for a batch, tries it, tells the strategy the outcome, until the strategy has none
  /// or a budget or the cancel hook stops the search. When the strategy has none and the goal's
  /// answer is a shortened measuring trial's fit, a full trial of it confirms it first (a failure
  /// there reopens the bracket, and the strategy goes on).
  void drive(SearchGoal goal, std::int64_t budget);
  /// The maximum, its status and capped_by, the limit and margin in force, once its loop ends.
  void finishMax();
  /// The capped_by word of the budget or cancellation that stopped the search ("" for none).
  std::string stopName() const;
  /// What bounds lo() from above (SearchResult::capped_by).
  std::string cappedBy() const;
  /// The largest fitting batch whose measured peak <= limit - margin, searched like the maximum.
  void runSafe();
  /// Plans on the safe batch and, when the plan accumulates, verifies its largest micro-batch
  /// with 2 micro-batches per step, stepping down until it fits under the margin.
  void runPlan();
  /// After a step-down: bisects the plan's bound between `verified` (its plan fit with 2
  /// micro-batches) and `failed_x` (a largest micro-batch that did not), see search_plan.cpp.
  void refinePlanBound(std::int64_t verified, std::int64_t failed_x, std::int64_t budget);
  /// Samples per second measured at each micro-batch in the search's own mode (fitting,
  /// not cancelled; the last measurement of a size counts).
  std::map<std::int64_t, double> measuredRates() const;
  /// Samples per second at micro-batch `m`: linear between the measured batches around it, the
  /// nearest alone beyond them; 0 when no measured batch lies within 25% of m.
  static double rateAt(const std::map<std::int64_t, double>& rate, std::int64_t m);
  /// Predicts both plans' samples per second and, for PlanKind::kFastest, makes the faster one
  /// primary: balanced only when it beats uniform by at least 5% (step times are noisy, and a
  /// uniform plan suits a fixed-size data loader), else uniform.
  /// For kFastest, a plan whose micro-batch no trial came near is measured by one trial of its
  /// largest micro-batch (below the safe batch, so it fits) before the speeds are compared.
  void predictPlanSpeeds();
  /// Least squares of peak bytes against batch over the fits (points 0 when under 2).
  AffineFit fitAffine() const;
  /// The status, the stop and size-limit warnings, the fit, the fastest batch and the
  /// nothing-fits explanation, once the phases are done.
  void finish();

  const Probe& probe_;
  const SearchOptions& options_;
  Clock::time_point start_;
  SearchResult result_;
  Stop stop_ = Stop::kNone;
  std::string not_started_;         // the trial the time budget did not start, and why (else empty)
  SearchTrials trials_;             // fits, failures, bounds, cap and limit, search mode
  std::set<std::int64_t> retried_;  // failed batches re-tried once
  /// Failures seen only by shortened measuring trials (TrialResult::shortened) that the probe did
  /// not mark stands_for_full, not yet by a full trial: the maximum's bound is confirmed in full
  /// before the search ends.
  std::set<std::int64_t> unconfirmed_fails_;
};

}  // namespace autobatch::detail
