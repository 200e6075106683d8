// autobatch/search/replan.h — an answer made smaller after its search: a length of a sweep whose
// bucket the mixed verification lowered (autobatch/workflows/length_sweep.h), or the minimum the
// ranks of a multi-rank preflight agreed on (autobatch/run/rank_agreement.h). Both lower the safe
// micro-batch and plan again for the target on the lowered bound; this is the one place that does
// it.
//
// Contract: pure arithmetic on a SearchResult (no LibTorch, no I/O, no trial). Thread safety: none
// needed (it changes only its argument).
#pragma once

#include <cstdint>
#include <optional>

#include "autobatch/search/search.h"
#include "autobatch/vocabulary/search_options.h"

namespace autobatch {

/// The largest micro-batch a plan may use after the search, and whether it was seen to fit with 2
/// micro-batches per step (SearchResult::plan_verified).
struct PlanBound {
  /// Samples. Range >= 1 when a plan is made on it.
  std::int64_t max_micro_batch = 0;
  bool verified = false;
};

/// Lowers `search` to `safe_micro_batch` and plans again:
/// - search.safe_micro_batch becomes `safe_micro_batch` (samples; the caller passes a value no
///   larger than the search's own: replan never checks a larger batch);
/// - `safe_micro_batch` <= 0: nothing is safe any more, so status kNothingFits (never "found"
///   with nothing safe), no plan, plan_max_micro_batch 0; plan_verified is left as it was;
/// - else, with `plan_bound` and options.target_batch > 0: plan_max_micro_batch and
///   plan_verified become the bound's, and the plan is planAccumulation(bound, target_batch,
///   world_size, plan kind) (autobatch/search/planner.h);
/// - else (no bound given, or no target) the plan and its bound are left as they are: a search
///   that made no plan (the 2-micro-batch check found none) keeps none.
/// Other fields (trials, max_micro_batch, warnings) are not touched.
/// Throws: autobatch::Error from planAccumulation (an impossible target for the bound; the search
/// already planned this target, so only a caller's bound < 1 can reach it).
void replan(SearchResult& search, std::int64_t safe_micro_batch,
            const std::optional<PlanBound>& plan_bound, const SearchOptions& options);

}  // namespace autobatch
