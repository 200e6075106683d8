// The search driver's summary of a search (search_driver.h): its status and warnings, the affine
// fit of peak against batch, the fastest batch, and why nothing fits.
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

AffineFit SearchDriver::fitAffine() const {
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

void SearchDriver::finish() {
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
          not_started_.empty() ? "the time budget (" + oneDecimal(options_.time_limit_s) +
                                     " s) ran out; reporting the best verified batch"
                               : "the time budget (" + oneDecimal(options_.time_limit_s) +
                                     " s) stopped the search after " + oneDecimal(elapsedS()) +
                                     " s: " + not_started_ +
                                     ", so it was not started; reporting the best verified batch");
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

}  // namespace autobatch::detail
