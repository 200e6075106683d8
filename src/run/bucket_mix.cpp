// The mixed verification of a sweep's buckets (autobatch/run/bucket_mix.h, docs/sweeps.md).
#include "autobatch/run/bucket_mix.h"

#include <algorithm>

#include "autobatch/vocabulary/error.h"

namespace autobatch {

std::vector<std::size_t> mixedOrder(std::size_t bucket_count) {
  std::vector<std::size_t> order;
  if (bucket_count == 0) return order;
  order.push_back(0);
  for (std::size_t i = bucket_count - 1; i >= 1; --i) {
    order.push_back(i);
    order.push_back(0);
  }
  return order;
}

std::int64_t lowerBucketBatch(std::int64_t micro_batch_size) {
  return std::max<std::int64_t>(
      0, micro_batch_size - std::max<std::int64_t>(1, micro_batch_size / 10));
}

namespace {

// The buckets still in the mix (micro-batch >= 1), by index.
std::vector<std::size_t> inMix(const std::vector<Bucket>& buckets) {
  std::vector<std::size_t> live;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].micro_batch_size >= 1) live.push_back(i);
  }
  return live;
}

// The bucket to lower after `trial` (which did not pass), as an index into the buckets: the
// failing step's; for a fit over the margin, which names no step, the bucket of the largest peak
// alone (the first, the longest, on a tie or when no peak is known).
std::size_t bucketToLower(const MixedTrial& trial, const std::vector<std::size_t>& owner,
                          const std::vector<Bucket>& buckets) {
  if (trial.over_margin) {
    std::size_t pick = owner.front();
    for (const std::size_t i : owner) {
      if (buckets[i].alone_peak_bytes > buckets[pick].alone_peak_bytes) pick = i;
    }
    return pick;
  }
  const int step = trial.result.failed_step_index;
  if (step < 0 || static_cast<std::size_t>(step) >= owner.size()) {
    throw Error("mixed verification: expected the failed step within the trial's " +
                std::to_string(owner.size()) + " steps, but got step " + std::to_string(step));
  }
  return owner[static_cast<std::size_t>(step)];
}

// Lowers `bucket` by a tenth (lowerBucketBatch) and records it in `lowered`.
void lowerBucket(Bucket& bucket, std::vector<LoweredBucket>& lowered) {
  const std::int64_t to = lowerBucketBatch(bucket.micro_batch_size);
  auto it = std::find_if(lowered.begin(), lowered.end(),
                         [&bucket](const LoweredBucket& l) { return l.length == bucket.length; });
  if (it == lowered.end()) {
    lowered.push_back({bucket.length, bucket.micro_batch_size, to});
  } else {
    it->to = to;
  }
  // An estimate for the next over-margin pick: the peak scales with the micro-batch.
  bucket.alone_peak_bytes =
      bucket.micro_batch_size > 0
          ? static_cast<std::int64_t>(static_cast<double>(bucket.alone_peak_bytes) *
                                      static_cast<double>(to) /
                                      static_cast<double>(bucket.micro_batch_size))
          : 0;
  bucket.micro_batch_size = to;
}

}  // namespace

MixVerification verifyBucketMix(const std::vector<Bucket>& buckets, const MixedProbe& probe,
                                std::int64_t margin_bytes, int max_rounds,
                                const CancelHook& cancel) {
  if (max_rounds < 1 || margin_bytes < 0) {
    throw Error("mixed verification: expected max_rounds >= 1 and margin_bytes >= 0, but got " +
                std::to_string(max_rounds) + " and " + std::to_string(margin_bytes));
  }
  MixVerification out;
  out.buckets = buckets;
  out.margin_bytes = margin_bytes;
  if (inMix(out.buckets).size() < 2) return out;  // "skipped"
  for (int round = 0; round < max_rounds; ++round) {
    const std::vector<std::size_t> live = inMix(out.buckets);
    if (live.size() < 2) break;  // what is left was searched alone, and fits alone
    if (cancel && cancel()) {
      out.status = "cancelled";
      return out;
    }
    std::vector<std::size_t> owner;  // step -> bucket index
    MixedTrial trial;
    for (const std::size_t k : mixedOrder(live.size())) {
      owner.push_back(live[k]);
      trial.steps.push_back(out.buckets[live[k]]);
    }
    trial.result = probe(trial.steps);
    if (trial.result.cancelled) {
      out.trials.push_back(std::move(trial));
      out.status = "cancelled";
      return out;
    }
    const bool fits = trial.result.outcome == TrialOutcome::kFits;
    trial.passed =
        fits && trial.result.peak_bytes <= trial.result.memory_limit_bytes - margin_bytes;
    trial.over_margin = fits && !trial.passed;
    if (trial.passed) {
      out.trials.push_back(std::move(trial));
      out.status = out.lowered.empty() ? "verified" : "lowered";
      return out;
    }
    Bucket& failed = out.buckets[bucketToLower(trial, owner, out.buckets)];
    trial.failed_length = failed.length;
    out.trials.push_back(std::move(trial));
    lowerBucket(failed, out.lowered);
  }
  if (inMix(out.buckets).size() < 2) {
    // Only one bucket left after drops: it fits alone (it was searched alone).
    out.status = "lowered";
    return out;
  }
  // Out of rounds: no trial passed since the last lowering, so no bucket that failed in a trial
  // has a size seen to pass mixed. They leave the answer (never exported as safe).
  out.status = "unverified";
  for (auto& l : out.lowered) {
    l.to = 0;
    for (auto& b : out.buckets) {
      if (b.length == l.length) b.micro_batch_size = 0;
    }
  }
  return out;
}

}  // namespace autobatch
