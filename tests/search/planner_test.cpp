#include "autobatch/search/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace planner_test {

constexpr std::int64_t kMaxTarget = 2048;
constexpr std::int64_t kMaxMicro = 600;

// Checks one plan against the definitions, computed independently of the planner:
// exact effective batch, at most two sizes one apart, every size <= max, weights sum to 1.
void expectValidPlan(const AccumulationPlan& plan, std::int64_t max_micro, std::int64_t target,
                     int world) {
  ASSERT_GE(plan.groups.size(), 1U);
  ASSERT_LE(plan.groups.size(), 2U);
  std::int64_t samples = 0;
  std::int64_t steps = 0;
  double weights = 0.0;
  for (const auto& g : plan.groups) {
    ASSERT_GE(g.micro_batch_size, 1);
    ASSERT_LE(g.micro_batch_size, max_micro);
    ASSERT_GE(g.count, 1);
    samples += g.micro_batch_size * g.count;
    steps += g.count;
    weights += plan.lossWeight(g.micro_batch_size) * static_cast<double>(g.count);
  }
  if (plan.groups.size() == 2) {
    ASSERT_EQ(plan.groups[0].micro_batch_size, plan.groups[1].micro_batch_size + 1);
  }
  ASSERT_EQ(samples * world, target);
  ASSERT_EQ(plan.effective_batch, target);
  ASSERT_EQ(plan.per_rank_batch * world, target);
  ASSERT_EQ(plan.accumulation_steps, steps);
  ASSERT_NEAR(weights, 1.0, 1e-12);
}

// For each per-rank target p, the largest divisor of p that is <= m, for every m in 1..kMaxMicro,
// from a divisor table (not from the planner's divisor-pair scan).
std::vector<std::vector<std::int64_t>> largestDivisorTable() {
  std::vector<std::vector<bool>> divides(kMaxTarget + 1, std::vector<bool>(kMaxMicro + 1, false));
  for (std::int64_t d = 1; d <= kMaxMicro; ++d) {
    for (std::int64_t p = d; p <= kMaxTarget; p += d) {
      divides[static_cast<std::size_t>(p)][static_cast<std::size_t>(d)] = true;
    }
  }
  std::vector<std::vector<std::int64_t>> best(kMaxTarget + 1,
                                              std::vector<std::int64_t>(kMaxMicro + 1, 1));
  for (std::size_t p = 1; p <= kMaxTarget; ++p) {
    for (std::size_t m = 2; m <= kMaxMicro; ++m) {
      best[p][m] = divides[p][m] ? static_cast<std::int64_t>(m) : best[p][m - 1];
    }
  }
  return best;
}

TEST(PlannerTest, ExhaustiveTargetsMaximaAndWorldSizes) {
  const auto best_divisor = largestDivisorTable();
  for (int world = 1; world <= 8; ++world) {
    for (std::int64_t target = 1; target <= kMaxTarget; ++target) {
      if (target < world || target % world != 0) {
        EXPECT_THROW(planAccumulation(7, target, world), Error) << target << " on " << world;
        continue;
      }
      const std::int64_t per_rank = target / world;
      for (std::int64_t max_micro = 1; max_micro <= kMaxMicro; ++max_micro) {
        const AccumulationPlans plans = planAccumulation(max_micro, target, world);
        ASSERT_NO_FATAL_FAILURE(expectValidPlan(plans.uniform, max_micro, target, world));
        ASSERT_NO_FATAL_FAILURE(expectValidPlan(plans.balanced, max_micro, target, world));
        const std::int64_t expected_uniform =
            per_rank <= max_micro ? per_rank
                                  : best_divisor[static_cast<std::size_t>(per_rank)]
                                                [static_cast<std::size_t>(max_micro)];
        ASSERT_EQ(plans.uniform.groups.size(), 1U);
        ASSERT_EQ(plans.uniform.largestMicroBatch(), expected_uniform)
            << "target " << target << " max " << max_micro << " world " << world;
        // Fewest steps that can hold per_rank samples with micro-batches <= max_micro.
        const std::int64_t fewest = (per_rank + max_micro - 1) / max_micro;
        ASSERT_EQ(plans.balanced.accumulation_steps, fewest);
        ASSERT_LE(plans.balanced.accumulation_steps, plans.uniform.accumulation_steps);
        const bool balanced_primary = 2 * expected_uniform < std::min(per_rank, max_micro);
        ASSERT_EQ(plans.primary_kind, balanced_primary ? PlanKind::kBalanced : PlanKind::kUniform);
      }
    }
  }
}

TEST(PlannerTest, TargetAtOrBelowTheMaximumIsOneStep) {
  const AccumulationPlans plans = planAccumulation(184, 100);
  EXPECT_EQ(plans.uniform.accumulation_steps, 1);
  EXPECT_EQ(plans.balanced.accumulation_steps, 1);
  EXPECT_EQ(plans.primary().microBatchSizes(), std::vector<std::int64_t>{100});
  EXPECT_EQ(plans.primary_kind, PlanKind::kUniform);
}

TEST(PlannerTest, DesignExample) {
  // DESIGN.md: max 175 safe, target 512 -> uniform 128 x 4; balanced 171+171+170.
  const AccumulationPlans plans = planAccumulation(175, 512);
  EXPECT_EQ(plans.uniform.groups, (std::vector<MicroBatchGroup>{{128, 4}}));
  EXPECT_EQ(plans.balanced.groups, (std::vector<MicroBatchGroup>{{171, 2}, {170, 1}}));
  EXPECT_EQ(plans.balanced.microBatchSizes(), (std::vector<std::int64_t>{171, 171, 170}));
  EXPECT_EQ(plans.primary_kind, PlanKind::kUniform);  // 128 >= 175 / 2
  EXPECT_DOUBLE_EQ(plans.balanced.lossWeight(171), 171.0 / 512.0);
}

TEST(PlannerTest, PrimeTargetPrefersBalancedUnlessAsked) {
  const AccumulationPlans plans = planAccumulation(100, 509);
  EXPECT_EQ(plans.uniform.groups, (std::vector<MicroBatchGroup>{{1, 509}}));
  EXPECT_EQ(plans.balanced.groups, (std::vector<MicroBatchGroup>{{85, 5}, {84, 1}}));
  EXPECT_EQ(plans.primary_kind, PlanKind::kBalanced);
  EXPECT_EQ(planAccumulation(100, 509, 1, PlanKind::kUniform).primary().accumulation_steps, 509);
}

TEST(PlannerTest, WorldSizeSplitsTheTarget) {
  const AccumulationPlans plans = planAccumulation(48, 512, 4);
  EXPECT_EQ(plans.uniform.per_rank_batch, 128);
  EXPECT_EQ(plans.uniform.groups, (std::vector<MicroBatchGroup>{{32, 4}}));
  EXPECT_EQ(plans.balanced.groups, (std::vector<MicroBatchGroup>{{43, 2}, {42, 1}}));
  EXPECT_EQ(plans.primary().effective_batch, 512);
}

TEST(PlannerTest, IndivisibleTargetNamesTheNearestValidTargets) {
  try {
    planAccumulation(64, 100, 3);
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "target batch: expected a multiple of the world size 3, but got 100; nearest "
                 "valid targets: 99 or 102");
  }
  try {
    planAccumulation(64, 3, 4);
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "target batch: expected at least the world size 4 (one sample per rank), but got "
                 "3; smallest valid target: 4");
  }
  EXPECT_THROW(planAccumulation(0, 100), Error);
  EXPECT_THROW(planAccumulation(10, 100, 0), Error);
}

// Issue 27, row 3: plans of huge targets.
// Catches `(per_rank + max - 1) / max` and `2 * uniform_micro < capacity`: both overflow int64
// near its maximum (a target and maximum of 2^63 - 1 gave 0 balanced steps, a division by zero).
TEST(PlannerTest, TargetsNearTheInt64MaximumPlanWithoutOverflow) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const AccumulationPlans whole = planAccumulation(kMax, kMax);
  EXPECT_EQ(whole.balanced.accumulation_steps, 1);
  EXPECT_EQ(whole.balanced.groups, (std::vector<MicroBatchGroup>{{kMax, 1}}));
  EXPECT_EQ(whole.uniform.groups, (std::vector<MicroBatchGroup>{{kMax, 1}}));
  EXPECT_EQ(whole.primary_kind, PlanKind::kUniform);
  EXPECT_EQ(whole.primary().effective_batch, kMax);
}

// Catches a report that lists every micro-batch of a huge plan (2^39 sizes: std::bad_alloc):
// listsMicroBatches() bounds what the reports may list.
// Targets far beyond the exhaustive table, on both sides of sqrt(target) (every divisor pair up
// to sqrt(2^62) takes 11 s: the search walks the shorter side). Catches a count-down that misses
// the co-divisors above sqrt(target), a co-divisor scan that starts below ceil(target / max) (a
// micro-batch over the maximum), and one that falls back to 1 where a divisor below sqrt(target)
// exists.
TEST(PlannerTest, LargeTargetsTakeTheLargestDivisorAtMostTheMaximum) {
  constexpr std::int64_t kTwo62 = std::int64_t{1} << 62;
  EXPECT_EQ(planAccumulation(5208, kTwo62).uniform.largestMicroBatch(), 4096);
  constexpr std::int64_t kMersenne61 = (std::int64_t{1} << 61) - 1;  // prime
  EXPECT_EQ(planAccumulation(5208, kMersenne61).uniform.largestMicroBatch(), 1);
  constexpr std::int64_t kP = 1000003;  // prime
  constexpr std::int64_t kQ = 999983;   // prime
  EXPECT_EQ(planAccumulation(kP, kP * kQ * 2).uniform.largestMicroBatch(), kP);
  EXPECT_EQ(planAccumulation(kQ * 2 - 1, kP * kQ * 2).uniform.largestMicroBatch(), kP);
  EXPECT_EQ(planAccumulation(kP * 2, kP * kQ * 2).uniform.largestMicroBatch(), kP * 2);
  EXPECT_EQ(planAccumulation(kP - 1, kP * kQ).uniform.largestMicroBatch(), kQ);
  EXPECT_EQ(planAccumulation(kQ - 1, kP * kQ).uniform.largestMicroBatch(), 1);
  // Above sqrt: the co-divisor kQ * 2 of kP * kQ * 2 is the largest at most kQ * 2 + 5.
  EXPECT_EQ(planAccumulation(kQ * 2 + 5, kP * kQ * 2).uniform.largestMicroBatch(), kQ * 2);
}

TEST(PlannerTest, OnlyPlansUpToTheListLimitListTheirMicroBatches) {
  const AccumulationPlans small = planAccumulation(2, 2 * kMicroBatchListLimit);
  EXPECT_TRUE(small.uniform.listsMicroBatches());
  EXPECT_EQ(small.uniform.microBatchSizes().size(), static_cast<std::size_t>(kMicroBatchListLimit));
  const AccumulationPlans huge = planAccumulation(3, std::int64_t{1} << 40);
  EXPECT_FALSE(huge.uniform.listsMicroBatches());
  EXPECT_EQ(huge.uniform.groups, (std::vector<MicroBatchGroup>{{2, std::int64_t{1} << 39}}));
  EXPECT_EQ(huge.balanced.accumulation_steps, 366503875926);
}

}  // namespace planner_test
}  // namespace
}  // namespace autobatch
