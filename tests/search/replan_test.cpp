// replan(): an answer lowered after its search (a sweep's lowered bucket, the ranks' minimum).
#include "autobatch/search/replan.h"

#include <gtest/gtest.h>

#include "autobatch/search/planner.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace replan_test {

// A search that found 40 samples safe and planned a target of 240 over 2 ranks on 40.
SearchResult planned(SearchOptions& options) {
  options.target_batch = 240;
  options.world_size = 2;
  options.plan = PlanKind::kUniform;
  SearchResult s;
  s.status = SearchStatus::kFound;
  s.max_micro_batch = 44;
  s.safe_micro_batch = 40;
  s.plan = planAccumulation(40, 240, 2, PlanKind::kUniform);
  s.plan_max_micro_batch = 40;
  s.plan_verified = true;
  return s;
}

// Catches a replan that keeps status "found" (or a plan) when nothing is safe any more: the
// report would then tell a launcher to train at micro-batch 0.
TEST(ReplanTest, NothingSafeIsNothingFitsWithoutAPlan) {
  SearchOptions options;
  SearchResult s = planned(options);
  replan(s, 0, PlanBound{7, false}, options);
  EXPECT_EQ(s.status, SearchStatus::kNothingFits);
  EXPECT_EQ(s.safe_micro_batch, 0);
  EXPECT_FALSE(s.plan.has_value());
  EXPECT_EQ(s.plan_max_micro_batch, 0);
  EXPECT_EQ(s.max_micro_batch, 44);  // what was seen to fit alone is still reported
  EXPECT_TRUE(s.plan_verified);      // left as it was
}

// Catches a replan that lowers the safe batch but keeps the old plan (its micro-batches of 40
// would not fit at the agreed 7), or plans for the target per rank instead of over the ranks.
TEST(ReplanTest, PlansAgainOnTheBound) {
  SearchOptions options;
  SearchResult s = planned(options);
  replan(s, 9, PlanBound{7, false}, options);
  EXPECT_EQ(s.status, SearchStatus::kFound);
  EXPECT_EQ(s.safe_micro_batch, 9);
  ASSERT_TRUE(s.plan.has_value());
  EXPECT_EQ(s.plan_max_micro_batch, 7);
  EXPECT_FALSE(s.plan_verified);
  const AccumulationPlan& p = s.plan->primary();
  EXPECT_EQ(p.effective_batch, 240);
  EXPECT_LE(p.largestMicroBatch(), 7);
  // 120 samples per rank in micro-batches of at most 7: uniform 6 x 20 (the largest divisor).
  EXPECT_EQ(p.accumulation_steps, 20);
  EXPECT_EQ(p.largestMicroBatch(), 6);
}

// Catches a lowering that invents a plan for a search that made none (its 2-micro-batch check
// found no plan that fits): without a bound the plan is left as it is.
TEST(ReplanTest, WithoutABoundAPlanlessSearchStaysPlanless) {
  SearchOptions options;
  SearchResult s = planned(options);
  s.plan.reset();
  s.plan_max_micro_batch = 0;
  replan(s, 30, std::nullopt, options);
  EXPECT_EQ(s.safe_micro_batch, 30);
  EXPECT_FALSE(s.plan.has_value());
  EXPECT_EQ(s.plan_max_micro_batch, 0);
  EXPECT_EQ(s.status, SearchStatus::kFound);
}

// Catches a replan that plans without a target (planAccumulation would throw for target 0).
TEST(ReplanTest, WithoutATargetOnlyTheSafeBatchChanges) {
  SearchOptions options;
  SearchResult s;
  s.status = SearchStatus::kFound;
  s.safe_micro_batch = 40;
  replan(s, 12, PlanBound{12, true}, options);
  EXPECT_EQ(s.safe_micro_batch, 12);
  EXPECT_FALSE(s.plan.has_value());
  EXPECT_EQ(s.plan_max_micro_batch, 0);
  EXPECT_FALSE(s.plan_verified);
}

}  // namespace replan_test
}  // namespace
}  // namespace autobatch
