// The search driver's phases after the maximum (search_driver.h): the safe batch, the accumulation
// plan's verification with 2 micro-batches per step, and the plans' predicted speeds.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "autobatch/search/planner.h"
#include "search/search_driver.h"

namespace autobatch::detail {

void SearchDriver::runSafe() {
  if (result_.memory_limit_bytes <= 0) {
    result_.safe_micro_batch = result_.max_micro_batch;
    return;
  }
  const std::int64_t budget = result_.memory_limit_bytes - result_.margin_bytes;
  // From the fits so far: the guided model anchors at the safe batch so far and interpolates
  // towards the fits measured over the budget.
  drive(SearchGoal::kSafe, budget);
  result_.safe_micro_batch = lowUnder(budget, true, true);
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

void SearchDriver::runPlan() {
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
  std::int64_t failed_x = 0;  // the smallest largest micro-batch that failed with 2 per step
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
      if (failed_x > 0) refinePlanBound(max_micro, failed_x, budget);
      return;
    }
    failed_x = x;
    // Gradients alive during the second forward add about a constant: estimate it at x and
    // keep the single-micro-batch slope.
    std::int64_t next = x - std::max<std::int64_t>(1, x / 16);
    const std::int64_t need =
        r->outcome == TrialOutcome::kFits ? r->peak_bytes : r->peak_bytes + r->failed_request_bytes;
    if (fit.points >= 2 && fit.per_sample_bytes > 0.0 && need > 0 &&
        budget < std::numeric_limits<std::int64_t>::max()) {
      const double extra = std::max(0.0, static_cast<double>(need) - fit.predictBytes(x));
      const double b = std::floor((static_cast<double>(budget) - extra - fit.fixed_bytes) /
                                  fit.per_sample_bytes);
      if (b >= 1.0 && b < static_cast<double>(next)) next = static_cast<std::int64_t>(b);
    }
    // Never under min_batch (a model that cannot train on fewer samples, BatchNorm on one, raises
    // there: test_find.py's ResNet-18 at 210 MiB stepped down to 1 with min_batch 2): min_batch
    // itself is the last size tried.
    if (next < options_.min_batch && x > options_.min_batch) next = options_.min_batch;
    result_.warnings.push_back("micro-batch " + std::to_string(x) +
                               " did not fit under the margin with 2 micro-batches per step; "
                               "planning on at most " +
                               std::to_string(next));
    if (next < options_.min_batch) {
      result_.plan.reset();
      result_.plan_max_micro_batch = 0;
      result_.warnings.emplace_back("no accumulation plan fits with 2 micro-batches per step");
      return;
    }
    max_micro = next;
  }
}

// The step-down's prediction keeps the extra of the failed size constant, which undershoots
// when it grows with the batch (an MLP at 32 MiB, target 2^20: 1098 failed with 2 micro-batches,
// the prediction went to 252, uniform 128 x 8192 steps, where 512 and 700 fit). Between the
// bound that fit and the size that failed, a few bisection steps (at most kMaxRefinements trials
// with 2 micro-batches, to within 1/16) raise the bound; each plan tried is verified as the one
// kept. A plan whose largest micro-batch is at or under a verified one's needs no trial.
void SearchDriver::refinePlanBound(std::int64_t verified, std::int64_t failed_x,
                                   std::int64_t budget) {
  constexpr int kMaxRefinements = 4;
  std::int64_t lo = verified;
  std::int64_t lo_x = std::max(result_.plan->uniform.largestMicroBatch(),
                               result_.plan->balanced.largestMicroBatch());
  std::int64_t hi = failed_x;
  for (int tried = 0; tried < kMaxRefinements && hi - lo > std::max<std::int64_t>(1, lo / 16);) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    AccumulationPlans plans =
        planAccumulation(mid, options_.target_batch, options_.world_size, options_.plan);
    const std::int64_t x =
        std::max(plans.uniform.largestMicroBatch(), plans.balanced.largestMicroBatch());
    if (x <= lo_x) {  // no larger micro-batch than one already verified
      lo = mid;
      result_.plan = std::move(plans);
      result_.plan_max_micro_batch = mid;
      continue;
    }
    const TrialResult* r = trial(x, 2);
    ++tried;
    if (r == nullptr) break;  // the search stopped: the verified bound stands
    if (r->outcome == TrialOutcome::kFits && r->peak_bytes <= budget) {
      lo = mid;
      lo_x = x;
      result_.plan = std::move(plans);
      result_.plan_max_micro_batch = mid;
    } else {
      hi = std::min(hi, x);
    }
  }
  // The step-down's warning named the bound before the refinement: the report's plans and its
  // warnings give one bound (a new user read "planning on at most 47" beside plans on 49).
  if (lo > verified) {
    const std::string said = "planning on at most " + std::to_string(verified);
    for (auto& w : result_.warnings) {
      if (w.ends_with(said)) {
        w += ", raised to " + std::to_string(lo) + " by trials between it and " +
             std::to_string(failed_x);
      }
    }
  }
}

std::map<std::int64_t, double> SearchDriver::measuredRates() const {
  std::map<std::int64_t, double> rate;
  for (const auto& t : result_.trials) {
    if (t.request.micro_batches_per_step != options_.micro_batches_per_step) continue;
    if (samplesPerSecond(t) > 0.0) rate[t.request.micro_batch_size] = samplesPerSecond(t);
  }
  return rate;
}

double SearchDriver::rateAt(const std::map<std::int64_t, double>& rate, std::int64_t m) {
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

void SearchDriver::predictPlanSpeeds() {
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

}  // namespace autobatch::detail
