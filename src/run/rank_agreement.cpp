#include "autobatch/run/rank_agreement.h"

#include "autobatch/search/replan.h"

namespace autobatch {

RankReport rankReportOf(int rank, const std::string& device, const SearchResult& search,
                        const std::string& inputs) {
  RankReport mine;
  mine.inputs = inputs;
  mine.rank = rank;
  mine.device = device;
  mine.safe_micro_batch = search.safe_micro_batch;
  mine.plan_max_micro_batch = search.plan ? search.plan_max_micro_batch : search.safe_micro_batch;
  mine.plan_verified = search.plan_verified;
  mine.memory_limit_bytes = search.memory_limit_bytes;
  return mine;
}

void applyAgreement(const Agreement& agreement, const SearchOptions& options,
                    SearchResult& search) {
  if (agreement.safe_micro_batch < search.safe_micro_batch) {
    search.warnings.push_back(
        "this rank's safe micro-batch " + std::to_string(search.safe_micro_batch) + " lowered to " +
        std::to_string(agreement.safe_micro_batch) + ", the minimum over the ranks");
  }
  replan(search, agreement.safe_micro_batch,
         PlanBound{agreement.plan_max_micro_batch, agreement.plan_verified}, options);
}

Agreement agreeAcrossRanks(RankGroup& group, int rank, const std::string& device,
                           const SearchOptions& options, SearchResult& search,
                           const std::string& inputs) {
  Agreement agreement = group.exchange(rankReportOf(rank, device, search, inputs));
  applyAgreement(agreement, options, search);
  return agreement;
}

}  // namespace autobatch
