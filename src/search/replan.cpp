#include "autobatch/search/replan.h"

#include "autobatch/search/planner.h"

namespace autobatch {

void replan(SearchResult& search, std::int64_t safe_micro_batch,
            const std::optional<PlanBound>& plan_bound, const SearchOptions& options) {
  search.safe_micro_batch = safe_micro_batch;
  if (safe_micro_batch <= 0) {
    search.status = SearchStatus::kNothingFits;
    search.plan.reset();
    search.plan_max_micro_batch = 0;
    return;
  }
  if (!plan_bound || options.target_batch <= 0) return;
  search.plan = planAccumulation(plan_bound->max_micro_batch, options.target_batch,
                                 options.world_size, options.plan);
  search.plan_max_micro_batch = plan_bound->max_micro_batch;
  search.plan_verified = plan_bound->verified;
}

}  // namespace autobatch
