// The check's verdict and the evaluation search's options: plain data, LibTorch-free (the core;
// the Python extension uses them too).
#include <algorithm>
#include <cstdint>

#include "autobatch/autobatch.h"

namespace autobatch {

void setCheckVerdict(CheckResult& check, const SearchOptions& options, bool ran) {
  check.fits = ran && check.trial.outcome == TrialOutcome::kFits && !check.trial.cancelled;
  check.margin_bytes = marginBytes(options, check.trial.memory_limit_bytes);
  check.fits_with_margin =
      check.fits && check.trial.peak_bytes <= check.trial.memory_limit_bytes - check.margin_bytes;
}

SearchOptions evalSearchOptions(const SearchOptions& options, std::int64_t start_batch) {
  SearchOptions o = options;
  o.micro_batches_per_step = 2;  // the previous batch's output alive while the next one runs
  o.target_batch = 0;            // an evaluation batch needs no accumulation plan
  o.world_size = 1;
  o.initial_batch = std::max(o.initial_batch, start_batch);
  if (o.max_batch > 0) o.initial_batch = std::min(o.initial_batch, o.max_batch);
  return o;
}

}  // namespace autobatch
