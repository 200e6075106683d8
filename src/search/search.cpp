// The search's driver: it owns the bracket, the trial and time budgets, cancellation, retries of
// contradicted failures, the safe phase, the plan verification and the guarantees (never an
// unverified answer, non-monotonic memory reported, bounds kept). Which batch comes next is the
// strategy's question (search_strategy.h).
#include "autobatch/search/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "search/search_driver.h"
#include "search/search_strategy.h"

namespace autobatch {
namespace {

using detail::SearchGoal;
using detail::SearchStrategy;

void validate(const SearchOptions& o) {
  auto expect = [](bool ok, const std::string& message) {
    if (!ok) throw Error(message);
  };
  expect(o.min_batch >= 1, "min batch: expected >= 1, but got " + std::to_string(o.min_batch));
  expect(o.max_batch == 0 || o.max_batch >= o.min_batch,
         "max batch: expected 0 (no bound) or >= the min batch " + std::to_string(o.min_batch) +
             ", but got " + std::to_string(o.max_batch));
  expect(o.dataset_size == 0 || o.dataset_size >= o.min_batch,
         "dataset size: expected 0 (unknown) or >= the min batch " + std::to_string(o.min_batch) +
             ", but got " + std::to_string(o.dataset_size));
  expect(
      o.margin_fraction >= 0.0 && o.margin_fraction < 1.0,
      "margin fraction: expected a value in [0, 1), but got " + std::to_string(o.margin_fraction));
  expect(o.relative_tolerance >= 0.0,
         "relative tolerance: expected >= 0, but got " + std::to_string(o.relative_tolerance));
  expect(o.micro_batches_per_step == 1 || o.micro_batches_per_step == 2,
         "micro-batches per step: expected 1 or 2, but got " +
             std::to_string(o.micro_batches_per_step));
  expect(o.max_trials >= 0,
         "max trials: expected >= 0 (0: no budget), but got " + std::to_string(o.max_trials));
  expect(o.time_limit_s >= 0.0,
         "time limit: expected >= 0 seconds (0: none), but got " + std::to_string(o.time_limit_s));
  expect(o.target_batch >= 0,
         "target batch: expected >= 0 (0: no plan), but got " + std::to_string(o.target_batch));
  expect(o.allocation_units.block_bytes >= 1 && o.allocation_units.page_bytes >= 1,
         "allocation units: expected blocks and pages of >= 1 byte, but got " +
             std::to_string(o.allocation_units.block_bytes) + " and " +
             std::to_string(o.allocation_units.page_bytes));
  if (o.target_batch > 0) planAccumulation(1, o.target_batch, o.world_size);  // throws its message
}

/// The strategy for `goal` of a search (the one place it is chosen).
std::unique_ptr<SearchStrategy> makeStrategy(const SearchOptions& options, SearchGoal goal) {
  switch (options.strategy) {
    case Strategy::kGuided:
      return detail::makeGuidedStrategy(options, goal);
    case Strategy::kBinsearch:
      return detail::makeDoublingStrategy(options, goal, true);
    case Strategy::kPower:
      return detail::makeDoublingStrategy(options, goal, false);
  }
  throw Error("strategy: expected guided, binsearch or power, but got value " +
              std::to_string(static_cast<int>(options.strategy)));
}

}  // namespace

namespace detail {

std::string oneDecimal(double value) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << value;
  return out.str();
}

std::string bytesText(std::int64_t bytes) {
  return formatBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

SearchDriver::SearchDriver(const Probe& probe, const SearchOptions& options)
    : probe_(probe), options_(options), start_(Clock::now()) {
  trials_.cap = kUnbounded - 1;
  if (options.max_batch > 0) trials_.cap = std::min(trials_.cap, options.max_batch);
  if (options.dataset_size > 0) trials_.cap = std::min(trials_.cap, options.dataset_size);
  result_.micro_batches_per_step = options.micro_batches_per_step;
}

SearchResult SearchDriver::run() {
  drive(SearchGoal::kMaximum, 0);
  finishMax();
  if (result_.max_micro_batch > 0) runSafe();
  if (options_.target_batch > 0 && result_.max_micro_batch > 0) {
    runPlan();
    predictPlanSpeeds();
  }
  finish();
  return std::move(result_);
}

double SearchDriver::elapsedS() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

const TrialResult* SearchDriver::trial(std::int64_t batch, int micro_batches_per_step,
                                       bool measuring) {
  if (stop_ != Stop::kNone) return nullptr;
  if (options_.cancel && options_.cancel()) {
    stop_ = Stop::kCancelled;
  } else if (options_.max_trials > 0 &&
             result_.trials.size() >= static_cast<std::size_t>(options_.max_trials)) {
    stop_ = Stop::kTrialBudget;
  } else if (options_.time_limit_s > 0.0 && elapsedS() >= options_.time_limit_s) {
    stop_ = Stop::kTimeBudget;
  } else if (options_.time_limit_s > 0.0) {
    // A trial that the trials so far say cannot end before the deadline is not started.
    const double predicted = predictTrialSeconds(batch, micro_batches_per_step);
    const double left = options_.time_limit_s - elapsedS();
    if (predicted > left) {
      stop_ = Stop::kTimeBudget;
      not_started_ = "batch " + std::to_string(batch) + " would take about " +
                     oneDecimal(predicted) + " s, and " + oneDecimal(left) + " s were left";
    }
  }
  if (stop_ != Stop::kNone) return nullptr;
  TrialRequest request;
  request.micro_batch_size = batch;
  request.micro_batches_per_step = micro_batches_per_step;
  request.measure = measuring;
  // The runner checks the hook before every step: a trial still running at the deadline stops
  // there (it does not count; the best verified batch stands).
  request.cancel = [this] {
    return (options_.cancel && options_.cancel()) ||
           (options_.time_limit_s > 0.0 && elapsedS() >= options_.time_limit_s);
  };
  if (options_.before_trial) options_.before_trial(request);
  TrialResult r = probe_(request);  // exceptions end the search, unchanged
  r.request = request;
  r.request.cancel = options_.cancel;  // the deadline hook above refers to this search
  if (r.classification_rerun) {
    // The runner's re-run that decided an ambiguous failure: a trial of its own, listed first.
    result_.trials.push_back(*r.classification_rerun);
    if (options_.on_trial) options_.on_trial(result_.trials.back());
  }
  if (r.memory_limit_bytes > 0) trials_.limit_bytes = r.memory_limit_bytes;
  result_.trials.push_back(std::move(r));
  const TrialResult& last = result_.trials.back();
  if (options_.on_trial) options_.on_trial(last);
  if (last.cancelled) {
    const bool by_caller = options_.cancel && options_.cancel();
    stop_ = by_caller ? Stop::kCancelled : Stop::kTimeBudget;
    if (!by_caller) {
      result_.warnings.push_back("the trial of batch " + std::to_string(batch) +
                                 " was stopped at the time budget's end; it does not count");
    }
    return nullptr;  // a cancelled trial says nothing about memory
  }
  return &last;
}

double SearchDriver::predictTrialSeconds(std::int64_t batch, int micro_batches) const {
  struct Point {
    double samples = 0.0;
    double step_s = 0.0;
  };
  std::optional<Point> smallest;
  std::optional<Point> largest;
  int steps = 0;  // a trial that ran out of memory completed fewer steps than a trial runs
  for (const auto& t : result_.trials) {
    steps = std::max(steps, t.steps_completed);
    if (t.steps_completed <= 0 || t.step_ms <= 0.0) continue;
    const Point p{
        static_cast<double>(t.request.micro_batch_size) * t.request.micro_batches_per_step,
        t.step_ms / 1000.0};
    if (!smallest || p.samples < smallest->samples) smallest = p;
    if (!largest || p.samples >= largest->samples) largest = p;
  }
  if (!largest) return 0.0;
  double per_sample_s = 0.0;
  if (largest->samples > smallest->samples && largest->step_s >= 2.0 * smallest->step_s) {
    per_sample_s = (largest->step_s - smallest->step_s) / (largest->samples - smallest->samples);
  } else if (largest->samples > smallest->samples) {
    // The larger trial did not take twice as long: its time is mostly overhead, or noise (a
    // larger batch that stepped faster: 1.7 s at batch 1 and 0.9 s at 36 said 0 s per sample, and
    // a trial at 217,435 ran for minutes past a 10 s budget; issue 40 row 15). What it proves is
    // an upper bound: at most its whole time per sample. Scaled from it, never from the smallest
    // trial (issue 27 row 10: batch 1's overhead scaled per sample said minutes for a second).
    per_sample_s = largest->step_s / largest->samples;
  }
  const double samples = static_cast<double>(batch) * micro_batches;
  const double step_s =
      std::max(smallest->step_s, largest->step_s + per_sample_s * (samples - largest->samples));
  return step_s * steps;
}

MeasuredFit SearchDriver::measure(const TrialResult& r) {
  MeasuredFit m;
  m.peak = r.peak_bytes;
  m.limit = r.memory_limit_bytes;
  std::int64_t top = 0;
  for (const auto& p : r.phase_peaks) {
    auto& bytes = m.phases[detail::phaseKeyOf(p.phase, p.micro_batch_index)];
    bytes = std::max(bytes, p.peak_allocated_bytes);
    top = std::max(top, p.peak_allocated_bytes);
  }
  if (m.phases.empty() || top <= 0) {
    m.phases = {{"", r.peak_bytes}};
    top = r.peak_bytes;
  }
  m.overhead = std::max<std::int64_t>(0, r.peak_bytes - top);
  m.replayed_peak = r.replayed_peak;
  return m;
}

std::int64_t SearchDriver::maxBudget() const {
  return trials_.limit_bytes > 0 ? trials_.limit_bytes : kNoBudget;
}

bool SearchDriver::counts(const MeasuredFit& m, std::int64_t budget, bool strict) const {
  if (m.peak <= budget) return true;
  return !strict && (m.limit <= 0 || m.limit <= trials_.limit_bytes);
}

std::int64_t SearchDriver::lowUnder(std::int64_t budget, bool strict, bool confirmed) const {
  const auto it = std::find_if(trials_.fits.rbegin(), trials_.fits.rend(), [&](const auto& entry) {
    return (!confirmed || entry.second.confirmed) && counts(entry.second, budget, strict);
  });
  return it == trials_.fits.rend() ? 0 : it->first;
}

std::int64_t SearchDriver::highAbove(std::int64_t budget, bool strict, std::int64_t low) const {
  std::int64_t high = trials_.cap + 1;
  for (auto it = trials_.fits.upper_bound(low); it != trials_.fits.end(); ++it) {
    if (!counts(it->second, budget, strict)) {
      high = std::min(high, it->first);
      break;
    }
  }
  const auto fail = trials_.fails.upper_bound(low);
  if (fail != trials_.fails.end()) high = std::min(high, *fail);
  return high;
}

std::int64_t SearchDriver::lo() const { return lowUnder(maxBudget(), false); }

std::int64_t SearchDriver::hi() const { return highAbove(maxBudget(), false, lo()); }

bool SearchDriver::closed(std::int64_t low, std::int64_t high) const {
  if (high <= low + 1) return true;
  return options_.relative_tolerance > 0.0 && low > 0 && high < kUnbounded &&
         static_cast<double>(high) <=
             static_cast<double>(low) * (1.0 + options_.relative_tolerance);
}

bool SearchDriver::tryBatch(std::int64_t batch, bool measuring) {
  const TrialResult* r = trial(batch, options_.micro_batches_per_step, measuring);
  if (r == nullptr) return false;
  switch (r->outcome) {
    case TrialOutcome::kFits: {
      trials_.fits[batch] = measure(*r);
      trials_.fits[batch].confirmed = !r->shortened;
      unconfirmed_fails_.erase(batch);
      trials_.fails.erase(batch);
      // A failure at or below a fit: re-try the smallest such failure once.
      if (!trials_.fails.empty() && *trials_.fails.begin() <= batch)
        retryFailure(*trials_.fails.begin(), batch);
      return true;
    }
    case TrialOutcome::kOutOfMemory: {
      if (batch == options_.min_batch && trials_.fits.empty()) {
        result_.min_batch_needs_at_least_bytes = r->peak_bytes + r->failed_request_bytes;
      }
      trials_.fails.insert(batch);
      trials_.fits.erase(batch);  // a shortened fit that its confirming trial did not repeat
      if (r->shortened && !r->stands_for_full) {
        unconfirmed_fails_.insert(batch);
      } else {
        unconfirmed_fails_.erase(batch);
      }
      if (!r->failed_phase.empty() && r->failed_in_use_bytes > 0) {
        trials_.bounds[batch] = {detail::phaseKeyOf(r->failed_phase, r->failed_micro_batch_index),
                                 r->failed_in_use_bytes + r->failed_request_bytes};
      }
      if (lo() >= batch) retryFailure(batch, lo());
      return false;
    }
    case TrialOutcome::kSizeLimit: {
      trials_.fits.erase(batch);  // a shortened fit that its confirming trial did not repeat
      if (result_.size_limit_batch == 0 || batch < result_.size_limit_batch) {
        result_.size_limit_batch = batch;
        result_.size_limit_reason = r->reason;
      }
      if (batch > lo()) trials_.cap = std::min(trials_.cap, batch - 1);
      return false;
    }
  }
  return false;
}

void SearchDriver::retryFailure(std::int64_t failed, std::int64_t fitting) {
  if (!retried_.insert(failed).second) return;
  const TrialResult* r = trial(failed, options_.micro_batches_per_step);
  if (r == nullptr) return;
  if (r->outcome == TrialOutcome::kFits) {
    trials_.fits[failed] = measure(*r);
    trials_.fails.erase(failed);
    trials_.bounds.erase(failed);
    result_.warnings.push_back("batch " + std::to_string(failed) +
                               " failed once and fit when re-tried (a transient failure)");
    return;
  }
  result_.non_monotonic = true;
  result_.warnings.push_back(
      "non-monotonic memory: batch " + std::to_string(failed) + " failed twice although batch " +
      std::to_string(fitting) +
      " fit; sizes between them are not assumed to fit, the answer is the largest batch seen to "
      "fit");
}

Bracket SearchDriver::bracket(SearchGoal goal, std::int64_t budget) const {
  Bracket b;
  if (goal == SearchGoal::kMaximum) {
    b.low = lo();
    b.high = hi();
    b.budget_bytes = maxBudget();
    b.closed = closed(b.low, b.high);
    return b;
  }
  b.low = lowUnder(budget, true);
  b.high = std::min(highAbove(budget, true, b.low), result_.max_micro_batch + 1);
  b.budget_bytes = budget;
  b.closed = closed(b.low, b.high) || (b.low == 0 && b.high <= options_.min_batch);
  return b;
}

void SearchDriver::drive(SearchGoal goal, std::int64_t budget) {
  const std::unique_ptr<SearchStrategy> strategy = makeStrategy(options_, goal);
  while (stop_ == Stop::kNone) {
    const Bracket before = bracket(goal, budget);
    const std::int64_t x = strategy->next(trials_, before);
    if (x == 0) {
      // The answer is only ever a full trial's fit: a shortened measuring trial's is confirmed
      // by one (it fails: the bracket reopens below it and the strategy goes on). And the
      // maximum's bound above it a full trial's failure: a shortened trial may hold more than the
      // full one (a step that pops the labels from its batch, a model that caches a buffer of the
      // batch's size), so its failure is confirmed too (it fits: the bracket reopens above),
      // unless the probe showed that it held what the full trial holds (stands_for_full).
      const auto low = trials_.fits.find(before.low);
      if (low != trials_.fits.end() && !low->second.confirmed) {
        tryBatch(before.low);
        continue;
      }
      if (goal == SearchGoal::kMaximum && before.low > 0 &&
          unconfirmed_fails_.contains(before.high)) {
        tryBatch(before.high);
        continue;
      }
      return;
    }
    bool fit = tryBatch(x, strategy->measuring());
    if (stop_ != Stop::kNone) return;
    if (goal == SearchGoal::kSafe) fit = fit && trials_.fits.at(x).peak <= budget;
    strategy->noteOutcome(fit, before, bracket(goal, budget));
  }
}

void SearchDriver::finishMax() {
  result_.max_micro_batch = lowUnder(maxBudget(), false, true);
  if (result_.max_micro_batch == 0 && stop_ == Stop::kNone) {
    result_.status = SearchStatus::kNothingFits;
  }
  result_.capped_by = cappedBy();
  if (trials_.limit_bytes <= 0 && options_.memory_limit_bytes > 0) {
    trials_.limit_bytes = options_.memory_limit_bytes - options_.reserve_bytes;
  }
  result_.memory_limit_bytes = std::max<std::int64_t>(trials_.limit_bytes, 0);
  result_.margin_bytes = marginBytes(options_, result_.memory_limit_bytes);
}

std::string SearchDriver::stopName() const {
  switch (stop_) {
    case Stop::kTrialBudget:
      return "trial-budget";
    case Stop::kTimeBudget:
      return "time-budget";
    case Stop::kCancelled:
      return "cancelled";
    case Stop::kNone:
      break;
  }
  return "";
}

std::string SearchDriver::cappedBy() const {
  const std::int64_t max = lowUnder(maxBudget(), false, true);
  // Nothing verified: a budget or cancellation that stopped the search before a fit is what
  // bounds it, not memory (`--time-limit 0.0001` said "memory", issue 27 row 21).
  if (max == 0) return stop_ == Stop::kNone ? "memory" : stopName();
  const auto above = trials_.fails.upper_bound(max);
  if (above != trials_.fails.end() && *above == max + 1) return "memory";
  if (result_.size_limit_batch == max + 1) return "size-limit";
  const std::int64_t bound_max = options_.max_batch > 0 ? options_.max_batch : kUnbounded;
  const std::int64_t bound_data = options_.dataset_size > 0 ? options_.dataset_size : kUnbounded;
  if (max == bound_max && bound_max <= bound_data) return "max-batch";
  if (max == bound_data) return "dataset-size";
  if (stop_ != Stop::kNone) return stopName();
  // A closed bracket (relative tolerance) or a size limit further up: the failure above rules.
  if (result_.size_limit_batch > max &&
      (above == trials_.fails.end() || *above > result_.size_limit_batch)) {
    return "size-limit";
  }
  return "memory";
}

}  // namespace detail

std::string_view toString(SearchStatus status) {
  switch (status) {
    case SearchStatus::kFound:
      return "found";
    case SearchStatus::kNothingFits:
      return "nothing-fits";
    case SearchStatus::kTrialBudget:
      return "trial-budget";
    case SearchStatus::kTimeBudget:
      return "time-budget";
    case SearchStatus::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

double AffineFit::predictBytes(std::int64_t micro_batch_size) const {
  if (points < 2) return 0.0;
  return fixed_bytes + per_sample_bytes * static_cast<double>(micro_batch_size);
}

double samplesPerSecond(const TrialResult& trial) {
  if (trial.outcome != TrialOutcome::kFits || trial.cancelled || trial.step_ms <= 0.0) return 0.0;
  return static_cast<double>(trial.request.micro_batch_size *
                             trial.request.micro_batches_per_step) /
         trial.step_ms * 1000.0;
}

std::int64_t marginBytes(const SearchOptions& options, std::int64_t memory_limit_bytes) {
  if (options.margin_bytes >= 0) return options.margin_bytes;
  return static_cast<std::int64_t>(options.margin_fraction *
                                   static_cast<double>(memory_limit_bytes));
}

SearchResult findMaxBatch(const Probe& probe, const SearchOptions& options) {
  validate(options);
  return detail::SearchDriver(probe, options).run();
}

}  // namespace autobatch
