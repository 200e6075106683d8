// autobatch/run/rank_agreement.h — the ranks of a multi-rank preflight agree on one answer: each
// publishes its search's result, all take the minimum (autobatch/run/ranks.h, agree()), and each
// lowers its own result to it and plans again (autobatch/search/replan.h).
//
// Contract: agreeAcrossRanks() runs the exchange through a connected RankGroup
// (autobatch/run/rank_group.h: a c10d TCPStore, no NCCL/Gloo collective) and changes only the
// SearchResult it is given; rankReportOf() and applyAgreement() are pure. This header includes no
// LibTorch header. Thread safety: as RankGroup (one thread uses a group); the pure functions are
// free of shared state.
#pragma once

#include <string>

#include "autobatch/run/rank_group.h"
#include "autobatch/run/ranks.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/search_options.h"

namespace autobatch {

/// What rank `rank` (in [0, world size)) publishes of `search`: its safe micro-batch, the
/// micro-batch its plan may use (search.plan_max_micro_batch when it has a plan, else the safe
/// micro-batch), plan_verified and memory_limit_bytes, status "ok". `device` ("cuda:1", "cpu")
/// names the rank's device in the others' reports; `inputs` the inputs its trials used (input
/// specs joined by spaces), which the ranks compare. Never throws.
RankReport rankReportOf(int rank, const std::string& device, const SearchResult& search,
                        const std::string& inputs = "");

/// Lowers `search` to what the ranks agreed: a warning "this rank's safe micro-batch A lowered to
/// B, the minimum over the ranks" when B < A, then replan() with the agreed safe micro-batch and,
/// the agreed plan bound (Agreement::plan_max_micro_batch, plan_verified): nothing-fits with no
/// plan when a rank had nothing safe; a plan for options.target_batch on the agreed bound when
/// there is a target (micro-batches in samples per rank; options.world_size ranks).
/// Throws: autobatch::Error from the planner (see replan()).
void applyAgreement(const Agreement& agreement, const SearchOptions& options, SearchResult& search);

/// The agreement of a multi-rank preflight, run after this rank's search: publishes
/// rankReportOf(rank, device, search, inputs) through `group`, waits for every rank's report
/// (blocking,
/// at most the group's timeout_s per silent rank), and applies their minimum to `search`
/// (applyAgreement). Returns the agreement (every rank's report, the limiting ranks), which the
/// report shows. `options`: the search's (target_batch, world_size, plan kind).
/// Throws: RankError when a rank died, failed or stayed silent, the ranks' inputs differ, or the
/// store was lost (the group names the ranks; `search` is then unchanged); autobatch::Error from
/// the planner.
/// Side effects: network traffic to the store; `search` lowered in place.
Agreement agreeAcrossRanks(RankGroup& group, int rank, const std::string& device,
                           const SearchOptions& options, SearchResult& search,
                           const std::string& inputs = "");

}  // namespace autobatch
