#include "autobatch/search/planner.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {

/// The largest divisor of n (>= 1) that is <= limit (>= 1), in min(limit, sqrt(n)) steps or so:
/// counting down from limit when limit <= sqrt(n); else the co-divisors n / i for i from
/// ceil(n / limit) up to sqrt(n), then the divisors below sqrt(n). Every divisor pair up to
/// sqrt(n) would take 2^31 steps for a target of 2^62 (11 s), where the limit, a micro-batch that
/// fit, is small (PlannerTest.LargeTargetsTakeTheLargestDivisorAtMostTheMaximum).
std::int64_t largestDivisorAtMost(std::int64_t n, std::int64_t limit) {
  if (n <= limit) return n;
  if (limit <= n / limit) {  // limit <= sqrt(n); limit * limit could overflow near INT64_MAX
    for (std::int64_t d = limit; d > 1; --d) {
      if (n % d == 0) return d;
    }
    return 1;
  }
  // ceil(n / limit) without n + limit - 1, which overflows near INT64_MAX.
  for (std::int64_t i = n / limit + (n % limit != 0 ? 1 : 0); i <= n / i; ++i) {
    if (n % i == 0) return n / i;  // the smallest such i gives the largest co-divisor
  }
  // floor(sqrt(n)), corrected for the double's rounding (root * root could overflow).
  auto root = static_cast<std::int64_t>(std::sqrt(static_cast<double>(n)));
  while (root > 1 && root > n / root) --root;
  while (root + 1 <= n / (root + 1)) ++root;
  for (std::int64_t d = std::min(root, limit); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

AccumulationPlan makePlan(PlanKind kind, std::int64_t per_rank, int world_size,
                          std::int64_t steps) {
  AccumulationPlan plan;
  plan.kind = kind;
  plan.per_rank_batch = per_rank;
  plan.world_size = world_size;
  plan.accumulation_steps = steps;
  plan.effective_batch = per_rank * world_size;
  const std::int64_t base = per_rank / steps;
  const std::int64_t larger = per_rank % steps;  // micro-batches that take one sample more
  if (larger > 0) plan.groups.push_back({base + 1, larger});
  plan.groups.push_back({base, steps - larger});
  return plan;
}

}  // namespace

std::int64_t AccumulationPlan::largestMicroBatch() const {
  return groups.empty() ? 0 : groups.front().micro_batch_size;
}

std::vector<std::int64_t> AccumulationPlan::microBatchSizes() const {
  std::vector<std::int64_t> sizes;
  sizes.reserve(static_cast<std::size_t>(accumulation_steps));
  for (const auto& group : groups)
    sizes.insert(sizes.end(), static_cast<std::size_t>(group.count), group.micro_batch_size);
  return sizes;
}

bool AccumulationPlan::listsMicroBatches() const {
  return accumulation_steps <= kMicroBatchListLimit;
}

double AccumulationPlan::lossWeight(std::int64_t micro_batch_size) const {
  return per_rank_batch > 0
             ? static_cast<double>(micro_batch_size) / static_cast<double>(per_rank_batch)
             : 0.0;
}

const AccumulationPlan& AccumulationPlans::primary() const {
  return primary_kind == PlanKind::kBalanced ? balanced : uniform;
}

AccumulationPlans planAccumulation(std::int64_t max_micro_batch, std::int64_t target_batch,
                                   int world_size, PlanKind kind) {
  if (max_micro_batch < 1) {
    throw Error("max micro-batch: expected >= 1, but got " + std::to_string(max_micro_batch) +
                "; nothing fits, so no accumulation plan exists");
  }
  if (world_size < 1) {
    throw Error("world size: expected >= 1, but got " + std::to_string(world_size));
  }
  if (target_batch < world_size) {
    throw Error("target batch: expected at least the world size " + std::to_string(world_size) +
                " (one sample per rank), but got " + std::to_string(target_batch) +
                "; smallest valid target: " + std::to_string(world_size));
  }
  if (target_batch % world_size != 0) {
    const std::int64_t below = target_batch / world_size * world_size;
    throw Error("target batch: expected a multiple of the world size " +
                std::to_string(world_size) + ", but got " + std::to_string(target_batch) +
                "; nearest valid targets: " + std::to_string(below) + " or " +
                std::to_string(below + world_size));
  }
  const std::int64_t per_rank = target_batch / world_size;

  AccumulationPlans plans;
  plans.max_micro_batch = max_micro_batch;
  plans.target_batch = target_batch;
  const std::int64_t uniform_micro = largestDivisorAtMost(per_rank, max_micro_batch);
  plans.uniform = makePlan(PlanKind::kUniform, per_rank, world_size, per_rank / uniform_micro);
  // ceil(per_rank / max) without per_rank + max - 1, which overflows near INT64_MAX.
  const std::int64_t fewest_steps =
      per_rank / max_micro_batch + (per_rank % max_micro_batch != 0 ? 1 : 0);
  plans.balanced = makePlan(PlanKind::kBalanced, per_rank, world_size, fewest_steps);

  switch (kind) {
    case PlanKind::kUniform:
    case PlanKind::kBalanced:
      plans.primary_kind = kind;
      break;
    case PlanKind::kAuto:
    case PlanKind::kFastest: {  // the search decides fastest from measured step times
      // Half of what one step could hold: below it the uniform plan wastes more than half of
      // every micro-batch's capacity (a prime target degenerates to micro-batches of 1).
      const std::int64_t capacity = per_rank < max_micro_batch ? per_rank : max_micro_batch;
      plans.primary_kind =
          uniform_micro < capacity - uniform_micro ? PlanKind::kBalanced : PlanKind::kUniform;
      break;
    }
  }
  return plans;
}

}  // namespace autobatch
