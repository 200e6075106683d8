// The agreement across ranks (autobatch/run/rank_agreement.h): what a rank publishes, how it
// applies the minimum, and the whole exchange between two ranks of this process on 127.0.0.1.
#include "autobatch/run/rank_agreement.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "autobatch/search/planner.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace rank_agreement_test {

SearchResult found(std::int64_t safe, std::int64_t plan_max, const SearchOptions& options) {
  SearchResult s;
  s.status = SearchStatus::kFound;
  s.max_micro_batch = safe + 1;
  s.safe_micro_batch = safe;
  s.memory_limit_bytes = 1 << 30;
  if (plan_max > 0) {
    s.plan = planAccumulation(plan_max, options.target_batch, options.world_size, options.plan);
    s.plan_max_micro_batch = plan_max;
    s.plan_verified = true;
  }
  return s;
}

SearchOptions twoRanks(std::int64_t target) {
  SearchOptions o;
  o.target_batch = target;
  o.world_size = 2;
  o.plan = PlanKind::kUniform;
  return o;
}

// Catches a rank that publishes its safe batch as its plan bound when the 2-micro-batch check
// stepped the plan down (the others would plan above what this rank verified), or the reverse.
TEST(RankAgreementTest, ARankPublishesItsPlanBoundElseItsSafeBatch) {
  const SearchOptions o = twoRanks(64);
  const RankReport with_plan = rankReportOf(1, "cuda:1", found(20, 16, o));
  EXPECT_EQ(with_plan.rank, 1);
  EXPECT_EQ(with_plan.device, "cuda:1");
  EXPECT_EQ(with_plan.status, "ok");
  EXPECT_EQ(with_plan.safe_micro_batch, 20);
  EXPECT_EQ(with_plan.plan_max_micro_batch, 16);
  EXPECT_TRUE(with_plan.plan_verified);
  EXPECT_EQ(with_plan.memory_limit_bytes, 1 << 30);
  const RankReport without = rankReportOf(0, "cpu", found(20, 0, SearchOptions{}));
  EXPECT_EQ(without.plan_max_micro_batch, 20);
  EXPECT_FALSE(without.plan_verified);
}

// Catches an agreement that lowers the safe batch but keeps this rank's own plan, or that warns
// when nothing was lowered.
TEST(RankAgreementTest, TheMinimumLowersTheAnswerAndPlansAgain) {
  const SearchOptions o = twoRanks(64);
  SearchResult s = found(20, 16, o);
  Agreement a;
  a.safe_micro_batch = 10;
  a.plan_max_micro_batch = 8;
  a.plan_verified = false;
  applyAgreement(a, o, s);
  EXPECT_EQ(s.safe_micro_batch, 10);
  EXPECT_EQ(s.plan_max_micro_batch, 8);
  EXPECT_FALSE(s.plan_verified);
  ASSERT_TRUE(s.plan.has_value());
  EXPECT_EQ(s.plan->primary().effective_batch, 64);
  EXPECT_LE(s.plan->primary().largestMicroBatch(), 8);
  ASSERT_EQ(s.warnings.size(), 1U);
  EXPECT_EQ(s.warnings[0],
            "this rank's safe micro-batch 20 lowered to 10, the minimum over the ranks");

  SearchResult same = found(10, 8, o);
  applyAgreement(a, o, same);
  EXPECT_TRUE(same.warnings.empty());
  EXPECT_EQ(same.safe_micro_batch, 10);
}

// Catches a rank that still reports "found" when another rank has nothing that fits.
TEST(RankAgreementTest, ARankWithNothingSafeMakesNothingFitEverywhere) {
  const SearchOptions o = twoRanks(64);
  SearchResult s = found(20, 16, o);
  Agreement a;  // safe 0
  applyAgreement(a, o, s);
  EXPECT_EQ(s.status, SearchStatus::kNothingFits);
  EXPECT_EQ(s.safe_micro_batch, 0);
  EXPECT_FALSE(s.plan.has_value());
  EXPECT_EQ(s.plan_max_micro_batch, 0);
}

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Two ranks of this process exchange through a real store (rank 0 hosts it). Catches an
// agreement that does not publish (the other rank would time out), one that applies its own
// result instead of the minimum, and a wrong limiting rank.
TEST(RankAgreementTest, TwoRanksAgreeOnTheSmallerBatchThroughTheStore) {
  const int port = freePort();
  const SearchOptions o = twoRanks(96);
  RankGroupOptions group_options;
  group_options.timeout_s = 20.0;
  group_options.heartbeat_interval_s = 0.05;
  group_options.prefix = "autobatch/test/" + std::to_string(port);
  auto rank_info = [port](int rank) {
    RankInfo info;
    info.rank = rank;
    info.world_size = 2;
    info.master_port = port;
    info.source = "flags";
    return info;
  };
  RankGroup host(rank_info(0), group_options);
  auto other = std::async(std::launch::async, [&] {
    RankGroup group(rank_info(1), group_options);
    SearchResult s = found(12, 12, o);
    const Agreement a = agreeAcrossRanks(group, 1, "cpu", o, s);
    return std::make_pair(a, s);
  });
  SearchResult mine = found(30, 24, o);
  const Agreement a = agreeAcrossRanks(host, 0, "cpu", o, mine);
  const auto [other_agreement, other_search] = other.get();
  EXPECT_EQ(a.safe_micro_batch, 12);
  EXPECT_EQ(a.plan_max_micro_batch, 12);
  EXPECT_EQ(a.limiting_ranks, std::vector<int>{1});
  ASSERT_EQ(a.reports.size(), 2U);
  EXPECT_EQ(a.reports[0].safe_micro_batch, 30);
  EXPECT_EQ(a.reports[1].safe_micro_batch, 12);
  EXPECT_EQ(other_agreement.safe_micro_batch, 12);
  EXPECT_EQ(mine.safe_micro_batch, 12);
  EXPECT_EQ(mine.plan_max_micro_batch, 12);
  ASSERT_TRUE(mine.plan.has_value());
  EXPECT_EQ(mine.plan->primary().effective_batch, 96);
  EXPECT_LE(mine.plan->primary().largestMicroBatch(), 12);
  EXPECT_EQ(mine.warnings.size(), 1U);
  EXPECT_EQ(other_search.safe_micro_batch, 12);
  EXPECT_TRUE(other_search.warnings.empty());
}

}  // namespace rank_agreement_test
}  // namespace
}  // namespace autobatch
