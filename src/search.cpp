// The search's driver: it owns the bracket, the trial and time budgets, cancellation, retries of
// contradicted failures, the safe phase, the plan verification and the guarantees (never an
// unverified answer, non-monotonic memory reported, bounds kept). Which batch comes next is the
// strategy's question (search_strategy.h).
#include "autobatch/search.h"

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

#include "autobatch/error.h"
#include "autobatch/units.h"
#include "search_strategy.h"

namespace autobatch {
namespace {

using detail::Bracket;
using detail::kNoBudget;
using detail::kUnbounded;
using detail::MeasuredFit;
using detail::SearchGoal;
using detail::SearchStrategy;

std::string oneDecimal(double value) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << value;
  return out.str();
}

// The fastest batch must beat the largest by this factor before a warning: step times are noisy.
constexpr double kFasterFactor = 1.05;

using Clock = std::chrono::steady_clock;

std::string bytesText(std::int64_t bytes) {
  return formatBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

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

/// One search over one kind of trial (micro-batches per step): what was seen, and the bracket;
/// the strategy for each goal comes from makeStrategy.
class Search {
 public:
  Search(const Probe& probe, const SearchOptions& options)
      : probe_(probe), options_(options), start_(Clock::now()) {
    trials_.cap = kUnbounded - 1;
    if (options.max_batch > 0) trials_.cap = std::min(trials_.cap, options.max_batch);
    if (options.dataset_size > 0) trials_.cap = std::min(trials_.cap, options.dataset_size);
    result_.micro_batches_per_step = options.micro_batches_per_step;
  }

  SearchResult run() {
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

 private:
  enum class Stop { kNone, kTrialBudget, kTimeBudget, kCancelled };

  double elapsedS() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  /// Runs one trial, or none when a budget ran out or the cancel hook fired (then stop_ is set).
  const TrialResult* trial(std::int64_t batch, int micro_batches_per_step) {
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

  /// Seconds a trial of `batch` x `micro_batches` would take, leaning short: the most steps a
  /// trial completed, each on an affine model of the measured step times, time = overhead +
  /// per-sample cost x samples, through the trial with the most samples per step and never below
  /// the one with the fewest (whose time is at least the overhead). The per-sample cost is the
  /// secant between those two, taken only when the larger took at least twice as long (its time is
  /// then mostly work per sample); otherwise it is 0. A small trial's time is mostly fixed
  /// overhead: 1.3 ms per step at batch 1 of a Linear(5, 5) said 233.9 s at batch 91678 when scaled
  /// per sample, for a trial that took well under a second (issue 27, row 10). A prediction that
  /// comes out short costs at most one step past the deadline: the deadline hook stops a trial
  /// between its steps. 0 when no trial completed a step.
  double predictTrialSeconds(std::int64_t batch, int micro_batches) const {
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
    }
    const double samples = static_cast<double>(batch) * micro_batches;
    const double step_s =
        std::max(smallest->step_s, largest->step_s + per_sample_s * (samples - largest->samples));
    return step_s * steps;
  }

  static MeasuredFit measure(const TrialResult& r) {
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
    return m;
  }

  /// The budget of the maximum search: the limit in force (no budget when unknown).
  std::int64_t maxBudget() const {
    return trials_.limit_bytes > 0 ? trials_.limit_bytes : kNoBudget;
  }
  /// A fit counts under `budget` when its peak is within it; for the maximum also when the limit
  /// did not fall since it ran (a peak over the limit is a trial's own business: the allocator
  /// let it fit), but not after a fall (a CPU allocator that lost room after a failure).
  /// The safe batch's search is strict: only a peak within the budget counts.
  bool counts(const MeasuredFit& m, std::int64_t budget, bool strict) const {
    if (m.peak <= budget) return true;
    return !strict && (m.limit <= 0 || m.limit <= trials_.limit_bytes);
  }
  /// The largest fit that counts under `budget`; 0 when none.
  std::int64_t lowUnder(std::int64_t budget, bool strict) const {
    const auto it =
        std::find_if(trials_.fits.rbegin(), trials_.fits.rend(),
                     [&](const auto& entry) { return counts(entry.second, budget, strict); });
    return it == trials_.fits.rend() ? 0 : it->first;
  }
  /// The smallest batch above `low` known not to fit under `budget` (a failure, or a fit that
  /// does not count), or the cap + 1.
  std::int64_t highAbove(std::int64_t budget, bool strict, std::int64_t low) const {
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
  std::int64_t lo() const { return lowUnder(maxBudget(), false); }
  std::int64_t hi() const { return highAbove(maxBudget(), false, lo()); }
  bool closed(std::int64_t low, std::int64_t high) const {
    if (high <= low + 1) return true;
    return options_.relative_tolerance > 0.0 && low > 0 && high < kUnbounded &&
           static_cast<double>(high) <=
               static_cast<double>(low) * (1.0 + options_.relative_tolerance);
  }

  /// Tries `batch` in the search's mode and files the outcome; returns true when it fit, false
  /// when it failed or the search was stopped (check stop_). Contradictions with earlier
  /// outcomes (a failure below a fit) re-try the failed size once and are reported.
  bool tryBatch(std::int64_t batch) {
    const TrialResult* r = trial(batch, options_.micro_batches_per_step);
    if (r == nullptr) return false;
    switch (r->outcome) {
      case TrialOutcome::kFits: {
        trials_.fits[batch] = measure(*r);
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
        if (!r->failed_phase.empty() && r->failed_in_use_bytes > 0) {
          trials_.bounds[batch] = {detail::phaseKeyOf(r->failed_phase, r->failed_micro_batch_index),
                                   r->failed_in_use_bytes + r->failed_request_bytes};
        }
        if (lo() >= batch) retryFailure(batch, lo());
        return false;
      }
      case TrialOutcome::kSizeLimit: {
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

  void retryFailure(std::int64_t failed, std::int64_t fitting) {
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

  /// The bracket of `goal`: the maximum's under the limit in force (a fit whose limit did not fall
  /// since counts), the safe batch's under `budget` (strict), below the maximum.
  Bracket bracket(SearchGoal goal, std::int64_t budget) const {
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

  /// The one driver loop, for the maximum (`budget` unused) and the safe batch: asks the
  /// strategy for a batch, tries it, tells the strategy the outcome, until the strategy has none
  /// or a budget or the cancel hook stops the search.
  void drive(SearchGoal goal, std::int64_t budget) {
    const std::unique_ptr<SearchStrategy> strategy = makeStrategy(options_, goal);
    while (stop_ == Stop::kNone) {
      const Bracket before = bracket(goal, budget);
      const std::int64_t x = strategy->next(trials_, before);
      if (x == 0) return;
      bool fit = tryBatch(x);
      if (stop_ != Stop::kNone) return;
      if (goal == SearchGoal::kSafe) fit = fit && trials_.fits.at(x).peak <= budget;
      strategy->noteOutcome(fit, before, bracket(goal, budget));
    }
  }

  void finishMax() {
    result_.max_micro_batch = lo();
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

  /// The capped_by word of the budget or cancellation that stopped the search ("" for none).
  std::string stopName() const {
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

  /// What bounds lo() from above (SearchResult::capped_by).
  std::string cappedBy() const {
    const std::int64_t max = lo();
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

  /// The largest fitting batch whose measured peak <= limit - margin, searched like the maximum.
  void runSafe() {
    if (result_.memory_limit_bytes <= 0) {
      result_.safe_micro_batch = result_.max_micro_batch;
      return;
    }
    const std::int64_t budget = result_.memory_limit_bytes - result_.margin_bytes;
    // From the fits so far: the guided model anchors at the safe batch so far and interpolates
    // towards the fits measured over the budget.
    drive(SearchGoal::kSafe, budget);
    result_.safe_micro_batch = lowUnder(budget, true);
    if (result_.safe_micro_batch == 0) {
      result_.warnings.push_back("no batch was seen to fit under the limit less the margin (" +
                                 bytesText(budget) + ")");
      // Fits only above the margin: no answer, so the status says nothing fits (exit 3), with
      // what the minimum batch measured (issue 27: it said "found" with a micro-batch of 0).
      if (stop_ == Stop::kNone) {
        result_.status = SearchStatus::kNothingFits;
        const auto at_min = trials_.fits.find(options_.min_batch);
        if (at_min != trials_.fits.end())
          result_.min_batch_needs_at_least_bytes = at_min->second.peak;
      }
    }
  }

  /// Plans on the safe batch and, when the plan accumulates, verifies its largest micro-batch
  /// with 2 micro-batches per step, stepping down until it fits under the margin.
  void runPlan() {
    const std::int64_t per_rank = options_.target_batch / options_.world_size;
    std::int64_t max_micro = result_.safe_micro_batch;
    if (max_micro == 0) {
      result_.warnings.emplace_back("no accumulation plan: no batch fits under the margin");
      return;
    }
    const std::int64_t budget = result_.memory_limit_bytes > 0
                                    ? result_.memory_limit_bytes - result_.margin_bytes
                                    : std::numeric_limits<std::int64_t>::max();
    if (per_rank <= max_micro || options_.micro_batches_per_step == 2) {
      result_.plan =
          planAccumulation(max_micro, options_.target_batch, options_.world_size, options_.plan);
      result_.plan_max_micro_batch = max_micro;
      result_.plan_verified = true;
      return;
    }
    const AffineFit fit = fitAffine();
    while (true) {
      AccumulationPlans plans =
          planAccumulation(max_micro, options_.target_batch, options_.world_size, options_.plan);
      const std::int64_t x =
          std::max(plans.uniform.largestMicroBatch(), plans.balanced.largestMicroBatch());
      result_.plan = std::move(plans);
      result_.plan_max_micro_batch = max_micro;
      const TrialResult* r = trial(x, 2);
      if (r == nullptr) {
        result_.warnings.emplace_back("the accumulation plan was not verified: the search stopped");
        return;
      }
      const bool fits = r->outcome == TrialOutcome::kFits && r->peak_bytes <= budget;
      if (fits) {
        result_.plan_verified = true;
        return;
      }
      // Gradients alive during the second forward add about a constant: estimate it at x and
      // keep the single-micro-batch slope.
      std::int64_t next = x - std::max<std::int64_t>(1, x / 16);
      const std::int64_t need = r->outcome == TrialOutcome::kFits
                                    ? r->peak_bytes
                                    : r->peak_bytes + r->failed_request_bytes;
      if (fit.points >= 2 && fit.per_sample_bytes > 0.0 && need > 0 &&
          budget < std::numeric_limits<std::int64_t>::max()) {
        const double extra = std::max(0.0, static_cast<double>(need) - fit.predictBytes(x));
        const double b = std::floor((static_cast<double>(budget) - extra - fit.fixed_bytes) /
                                    fit.per_sample_bytes);
        if (b >= 1.0 && b < static_cast<double>(next)) next = static_cast<std::int64_t>(b);
      }
      result_.warnings.push_back("micro-batch " + std::to_string(x) +
                                 " did not fit under the margin with 2 micro-batches per step; "
                                 "planning on at most " +
                                 std::to_string(next));
      if (next < 1) {
        result_.plan.reset();
        result_.plan_max_micro_batch = 0;
        result_.warnings.emplace_back("no accumulation plan fits with 2 micro-batches per step");
        return;
      }
      max_micro = next;
    }
  }

  /// Samples per second measured at each micro-batch in the search's own mode (fitting,
  /// not cancelled; the last measurement of a size counts).
  std::map<std::int64_t, double> measuredRates() const {
    std::map<std::int64_t, double> rate;
    for (const auto& t : result_.trials) {
      if (t.request.micro_batches_per_step != options_.micro_batches_per_step) continue;
      if (samplesPerSecond(t) > 0.0) rate[t.request.micro_batch_size] = samplesPerSecond(t);
    }
    return rate;
  }

  /// Samples per second at micro-batch `m`: linear between the measured batches around it, the
  /// nearest alone beyond them; 0 when no measured batch lies within 25% of m.
  static double rateAt(const std::map<std::int64_t, double>& rate, std::int64_t m) {
    const auto above = rate.lower_bound(m);
    const bool has_above = above != rate.end();
    const bool has_below = above != rate.begin();
    const auto below = has_below ? std::prev(above) : rate.end();
    auto near = [m](std::int64_t b) {
      return std::abs(static_cast<double>(b - m)) <= 0.25 * static_cast<double>(m);
    };
    if (!(has_above && near(above->first)) && !(has_below && near(below->first))) return 0.0;
    if (has_above && above->first == m) return above->second;
    if (has_above && has_below) {
      const double w =
          static_cast<double>(m - below->first) / static_cast<double>(above->first - below->first);
      return below->second + w * (above->second - below->second);
    }
    return has_above ? above->second : below->second;
  }

  /// Predicts both plans' samples per second and, for PlanKind::kFastest, makes the faster one
  /// primary: balanced only when it beats uniform by at least 5% (step times are noisy, and a
  /// uniform plan suits a fixed-size data loader), else uniform.
  /// For kFastest, a plan whose micro-batch no trial came near is measured by one trial of its
  /// largest micro-batch (below the safe batch, so it fits) before the speeds are compared.
  void predictPlanSpeeds() {
    if (!result_.plan) return;
    auto predict = [this] {
      const auto rate = measuredRates();
      for (AccumulationPlan* plan : {&result_.plan->uniform, &result_.plan->balanced}) {
        double seconds = 0.0;  // one optimizer step of one rank
        for (const auto& g : plan->groups) {
          const double r = rateAt(rate, g.micro_batch_size);
          if (r <= 0.0) {
            seconds = 0.0;
            break;
          }
          seconds += static_cast<double>(g.count * g.micro_batch_size) / r;
        }
        plan->predicted_samples_per_second =
            seconds > 0.0 ? static_cast<double>(plan->per_rank_batch) / seconds : 0.0;
      }
    };
    predict();
    if (options_.plan != PlanKind::kFastest) return;
    for (const AccumulationPlan* plan : {&result_.plan->uniform, &result_.plan->balanced}) {
      if (plan->predicted_samples_per_second > 0.0 || plan->accumulation_steps == 1) continue;
      tryBatch(plan->largestMicroBatch());
      predict();  // the other plan may share the size just measured
    }
    const double uniform = result_.plan->uniform.predicted_samples_per_second;
    const double balanced = result_.plan->balanced.predicted_samples_per_second;
    if (uniform <= 0.0 || balanced <= 0.0) {
      result_.warnings.push_back("plan fastest: no step time was measured within 25% of the " +
                                 std::string(uniform <= 0.0 ? "uniform" : "balanced") +
                                 " plan's micro-batch; the primary plan follows auto's rule (" +
                                 std::string(toString(result_.plan->primary_kind)) + ")");
      return;
    }
    result_.plan->primary_kind =
        balanced >= kFasterFactor * uniform ? PlanKind::kBalanced : PlanKind::kUniform;
  }

  AffineFit fitAffine() const {
    AffineFit fit;
    double n = 0;
    double sx = 0;
    double sy = 0;
    double sxx = 0;
    double sxy = 0;
    for (const auto& [batch, m] : trials_.fits) {
      if (m.peak <= 0) continue;
      const auto x = static_cast<double>(batch);
      const auto y = static_cast<double>(m.peak);
      n += 1;
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    const double det = n * sxx - sx * sx;
    if (n < 2 || det <= 0.0) return fit;
    fit.points = static_cast<int>(n);
    fit.per_sample_bytes = (n * sxy - sx * sy) / det;
    fit.fixed_bytes = (sy - fit.per_sample_bytes * sx) / n;
    return fit;
  }

  void finish() {
    switch (stop_) {
      case Stop::kNone:
        break;
      case Stop::kTrialBudget:
        result_.status = SearchStatus::kTrialBudget;
        result_.warnings.push_back("the trial budget (" + std::to_string(options_.max_trials) +
                                   ") ran out; reporting the best verified batch");
        break;
      case Stop::kTimeBudget:
        result_.status = SearchStatus::kTimeBudget;
        // Said as it happened: a trial not started for its predicted time left budget unused.
        result_.warnings.push_back(
            not_started_.empty()
                ? "the time budget (" + oneDecimal(options_.time_limit_s) +
                      " s) ran out; reporting the best verified batch"
                : "the time budget (" + oneDecimal(options_.time_limit_s) +
                      " s) stopped the search after " + oneDecimal(elapsedS()) + " s: " +
                      not_started_ + ", so it was not started; reporting the best verified batch");
        break;
      case Stop::kCancelled:
        result_.status = SearchStatus::kCancelled;
        break;
    }
    if (result_.size_limit_batch > 0) {
      result_.warnings.push_back("batch " + std::to_string(result_.size_limit_batch) +
                                 " hit a size limit: " + result_.size_limit_reason);
    }
    result_.fit = fitAffine();
    if (result_.max_micro_batch > 0) {
      result_.predicted_peak_bytes = result_.fit.predictBytes(result_.max_micro_batch);
      result_.measured_peak_bytes = trials_.fits.at(result_.max_micro_batch).peak;
    }
    // Throughput of the search's own mode; the last measurement of each size counts.
    const std::map<std::int64_t, double> rate = measuredRates();
    double best = 0.0;
    for (const auto& [batch, r] : rate) {
      if (r > best) {
        best = r;
        result_.fastest_micro_batch = batch;
      }
    }
    const auto at_max = rate.find(result_.max_micro_batch);
    if (at_max != rate.end() && best > at_max->second * kFasterFactor) {
      result_.warnings.push_back(
          "batch " + std::to_string(result_.fastest_micro_batch) + " trains " + oneDecimal(best) +
          " samples/s, more than the largest batch " + std::to_string(result_.max_micro_batch) +
          " (" + oneDecimal(at_max->second) +
          " samples/s; step times of one trial each, so a busy machine can reorder them)");
    }
    if (result_.status == SearchStatus::kNothingFits && result_.size_limit_batch == 0) {
      const std::int64_t headroom = result_.memory_limit_bytes - result_.margin_bytes;
      const std::int64_t need = result_.min_batch_needs_at_least_bytes;
      result_.warnings.push_back(
          "nothing fits: the minimum batch " + std::to_string(options_.min_batch) +
          " needs at least " + bytesText(need) + ", the limit less the margin is " +
          bytesText(headroom) +
          (need <= headroom ? "; its trial was refused before its tensors reached that (a limit "
                              "on the whole process, or an allocator failure: the trial's reason "
                              "says which)"
                            : ""));
    }
    result_.elapsed_s = elapsedS();
  }

  const Probe& probe_;
  const SearchOptions& options_;
  Clock::time_point start_;
  SearchResult result_;
  Stop stop_ = Stop::kNone;
  std::string not_started_;         // the trial the time budget did not start, and why (else empty)
  detail::SearchTrials trials_;     // fits, failures, bounds, cap and limit, search mode
  std::set<std::int64_t> retried_;  // failed batches re-tried once
};

}  // namespace

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
  return Search(probe, options).run();
}

}  // namespace autobatch
