// The mixed verification of a sweep's buckets (autobatch/bucket_mix.h, docs/sweeps.md).
#include "autobatch/bucket_mix.h"

#include <algorithm>

#include "autobatch/error.h"

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

MixVerification verifyBucketMix(const std::vector<Bucket>& buckets, const MixedProbe& probe,
                                int max_rounds, const CancelHook& cancel) {
  if (max_rounds < 1) {
    throw Error("mixed verification: expected max_rounds >= 1, but got " +
                std::to_string(max_rounds));
  }
  MixVerification out;
  out.buckets = buckets;
  const auto in_mix = [&out] {
    std::vector<std::size_t> live;
    for (std::size_t i = 0; i < out.buckets.size(); ++i) {
      if (out.buckets[i].micro_batch_size >= 1) live.push_back(i);
    }
    return live;
  };
  if (in_mix().size() < 2) return out;  // "skipped"
  for (int round = 0; round < max_rounds; ++round) {
    const std::vector<std::size_t> live = in_mix();
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
    if (trial.result.outcome == TrialOutcome::kFits) {
      out.trials.push_back(std::move(trial));
      out.status = out.lowered.empty() ? "verified" : "lowered";
      return out;
    }
    const int step = trial.result.failed_step_index;
    if (step < 0 || static_cast<std::size_t>(step) >= owner.size()) {
      throw Error("mixed verification: expected the failed step within the trial's " +
                  std::to_string(owner.size()) + " steps, but got step " + std::to_string(step));
    }
    Bucket& failed = out.buckets[owner[static_cast<std::size_t>(step)]];
    trial.failed_length = failed.length;
    out.trials.push_back(std::move(trial));
    const std::int64_t lowered_to = lowerBucketBatch(failed.micro_batch_size);
    auto it = std::find_if(out.lowered.begin(), out.lowered.end(),
                           [&failed](const LoweredBucket& l) { return l.length == failed.length; });
    if (it == out.lowered.end()) {
      out.lowered.push_back({failed.length, failed.micro_batch_size, lowered_to});
    } else {
      it->to = lowered_to;
    }
    failed.micro_batch_size = lowered_to;
  }
  // Out of rounds, or only one bucket left after drops: the one left fits alone (it was searched
  // alone), which is a verification of nothing mixed.
  out.status = in_mix().size() < 2 ? "lowered" : "unverified";
  return out;
}

}  // namespace autobatch
