// Rank resolution from flags, torchrun and Slurm environments, and the agreement rule.
#include "autobatch/run/ranks.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace ranks_test {

RankReport rep(int rank, std::string status, std::string device, std::int64_t safe,
               std::int64_t plan_max, bool verified, std::int64_t limit) {
  RankReport r;
  r.rank = rank;
  r.status = std::move(status);
  r.device = std::move(device);
  r.safe_micro_batch = safe;
  r.plan_max_micro_batch = plan_max;
  r.plan_verified = verified;
  r.memory_limit_bytes = limit;
  return r;
}

std::string rankErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const RankError& e) {
    return e.what();
  }
  return "";
}

EnvLookup envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string errorOf(const RankFlags& flags, const EnvLookup& env) {
  try {
    resolveRankInfo(flags, env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RanksTest, NoLauncherIsOneProcessThatDoesNotAgree) {
  const RankInfo info = resolveRankInfo({}, envOf({}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.source, "none");
  EXPECT_FALSE(info.agrees());
  RankFlags world;
  world.world_size = 8;  // planning for 8 ranks from one process
  EXPECT_FALSE(resolveRankInfo(world, envOf({})).agrees());
}

TEST(RanksTest, ReadsTorchrun) {
  const RankInfo info = resolveRankInfo({}, envOf({{"RANK", "5"},
                                                   {"WORLD_SIZE", "8"},
                                                   {"LOCAL_RANK", "1"},
                                                   {"MASTER_ADDR", "h1"},
                                                   {"MASTER_PORT", "29400"},
                                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "h1");
  EXPECT_EQ(info.master_port, 29400);
  EXPECT_TRUE(info.use_agent_store);
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_TRUE(info.agrees());
}

TEST(RanksTest, AgentStoreOnlyWhenTheVariableSaysTrue) {
  auto env = envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  EXPECT_FALSE(resolveRankInfo({}, env).use_agent_store);
}

TEST(RanksTest, ReadsSlurmWithFirstHostAndJobPort) {
  const RankInfo info = resolveRankInfo({}, envOf({{"SLURM_PROCID", "3"},
                                                   {"SLURM_NTASKS", "4"},
                                                   {"SLURM_LOCALID", "1"},
                                                   {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                                                   {"SLURM_JOB_ID", "1234567"}}));
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "gpu07");
  EXPECT_EQ(info.master_port, kSlurmPortBase + 4567);
  EXPECT_EQ(info.source, "slurm");
  EXPECT_FALSE(info.use_agent_store);
}

TEST(RanksTest, TorchrunWinsOverSlurmAndFlagsWinOverBoth) {
  auto env = envOf({{"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"SLURM_PROCID", "7"},
                    {"SLURM_NTASKS", "16"},
                    {"MASTER_PORT", "1000"}});
  EXPECT_EQ(resolveRankInfo({}, env).rank, 1);
  RankFlags flags;
  flags.rank = 0;
  flags.world_size = 4;
  flags.master_port = 2000;
  flags.master_addr = "10.0.0.1";
  const RankInfo info = resolveRankInfo(flags, env);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.master_port, 2000);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.source, "flags");
}

TEST(RanksTest, WrongWorldSizeIsAUsageErrorNamingTheSource) {
  EXPECT_EQ(errorOf({}, envOf({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
            "rank: expected a rank in [0, 2) for world size 2 (WORLD_SIZE), but got 2 (RANK)");
  RankFlags flags;
  flags.rank = 4;
  flags.world_size = 4;
  EXPECT_EQ(errorOf(flags, envOf({})),
            "rank: expected a rank in [0, 4) for world size 4 (--world-size), but got 4 (--rank)");
  EXPECT_NE(errorOf({}, envOf({{"RANK", "0"}, {"WORLD_SIZE", "0"}})).find("WORLD_SIZE"),
            std::string::npos);
  EXPECT_NE(errorOf({}, envOf({{"RANK", "x"}, {"WORLD_SIZE", "2"}})).find("RANK"),
            std::string::npos);
  EXPECT_NE(errorOf({}, envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}))
                .find("MASTER_PORT"),
            std::string::npos);
}

TEST(RanksTest, FirstSlurmHost) {
  EXPECT_EQ(firstSlurmHost("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(firstSlurmHost("a,b"), "a");
  EXPECT_EQ(firstSlurmHost("single"), "single");
  EXPECT_EQ(firstSlurmHost("gpu-[3,5]"), "gpu-3");
  EXPECT_EQ(firstSlurmHost("x1,node[2-3]"), "x1");
  EXPECT_THROW(firstSlurmHost(""), Error);
  EXPECT_THROW(firstSlurmHost("node[01-04"), Error);
}

TEST(RanksTest, RankDevice) {
  EXPECT_EQ(rankDevice("cuda", 3), "cuda:3");
  EXPECT_EQ(rankDevice("cuda:1", 3), "cuda:1");
  EXPECT_EQ(rankDevice("cpu", 3), "cpu");
}

TEST(RanksTest, ReportRoundTrips) {
  RankReport r = rep(2, "ok", "cuda:2", 37, 35, true, 123456789);
  r.inputs = "int64:64 f32:3x;224%";  // a separator and the escape character survive
  r.version = "0.1.0";
  EXPECT_EQ(decodeRankReport(encodeRankReport(r)), r);
  EXPECT_THROW(decodeRankReport("rank=1"), Error);
  EXPECT_THROW(decodeRankReport("garbage"), Error);
}

TEST(RanksTest, AgreeTakesTheMinimumAndNamesTheLimitingRanks) {
  for (int world = 1; world <= 6; ++world) {
    std::vector<RankReport> reports;
    for (int r = world - 1; r >= 0; --r) {  // any order
      reports.push_back(rep(r, "ok", "cpu", 40 + 7 * r, 39 + r, r != 1, 0));
    }
    const Agreement a = agree(reports, world);
    EXPECT_EQ(a.safe_micro_batch, 40);
    EXPECT_EQ(a.plan_max_micro_batch, 39);
    EXPECT_EQ(a.plan_verified, world == 1);
    EXPECT_EQ(a.limiting_ranks, std::vector<int>{0});
    EXPECT_EQ(static_cast<int>(a.reports.size()), world);
  }
  const Agreement none =
      agree({rep(0, "ok", "cpu", 10, 10, true, 0), rep(1, "ok", "cpu", 0, 0, false, 0)}, 2);
  EXPECT_EQ(none.safe_micro_batch, 0);
  EXPECT_EQ(none.limiting_ranks, std::vector<int>{1});
}

TEST(RanksTest, AgreeRejectsFailedAndMissingRanks) {
  try {
    agree({rep(0, "ok", "cpu", 10, 10, true, 0), rep(1, "usage-error", "", 0, 0, false, 0)}, 2);
    FAIL() << "expected RankError";
  } catch (const RankError& e) {
    EXPECT_EQ(std::string(e.what()),
              "ranks could not agree: rank(s) 1 failed before agreeing (rank 1: usage-error); "
              "see their logs");
  }
  EXPECT_THROW(agree({rep(0, "ok", "cpu", 10, 10, true, 0)}, 2), Error);
  EXPECT_THROW(agree({rep(0, "ok", "cpu", 1, 1, true, 0), rep(0, "ok", "cpu", 1, 1, true, 0)}, 2),
               Error);
}

// Issue 27, rows 19 and 21: every launcher variable counts alone; the store host is checked.

// WORLD_SIZE=3 alone was ignored (world size 1) although --help says the world size defaults to
// WORLD_SIZE; likewise SLURM_NTASKS, and LOCAL_RANK without RANK and WORLD_SIZE. Catches a
// resolver that reads a launcher's variables only when its rank variable is set too.
TEST(RanksTest, EachLauncherVariableCountsAlone) {
  const RankInfo torchrun = resolveRankInfo({}, envOf({{"WORLD_SIZE", "3"}}));
  EXPECT_EQ(torchrun.world_size, 3);
  EXPECT_EQ(torchrun.rank, 0);
  EXPECT_EQ(torchrun.source, "none");  // planning for 3 ranks from one process
  EXPECT_FALSE(torchrun.agrees());
  const RankInfo slurm =
      resolveRankInfo({}, envOf({{"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}}));
  EXPECT_EQ(slurm.world_size, 4);
  EXPECT_EQ(slurm.local_rank, 2);
  EXPECT_FALSE(slurm.agrees());
  EXPECT_EQ(resolveRankInfo({}, envOf({{"LOCAL_RANK", "1"}})).local_rank, 1);
  EXPECT_EQ(resolveRankInfo({}, envOf({{"SLURM_LOCALID", "3"}})).local_rank, 3);
  const RankInfo rank0 = resolveRankInfo({}, envOf({{"RANK", "0"}}));
  EXPECT_EQ(rank0.world_size, 1);
  EXPECT_EQ(rank0.source, "torchrun");
  EXPECT_EQ(errorOf({}, envOf({{"RANK", "2"}})),
            "rank: expected a rank in [0, 1) for world size 1 (default: give --world-size or "
            "WORLD_SIZE), but got 2 (RANK)");
  EXPECT_EQ(errorOf({}, envOf({{"SLURM_PROCID", "1"}})),
            "rank: expected a rank in [0, 1) for world size 1 (default: give --world-size or "
            "SLURM_NTASKS), but got 1 (SLURM_PROCID)");
  // An empty variable is unset (scripts export them empty), not an error.
  EXPECT_EQ(resolveRankInfo({}, envOf({{"RANK", ""}, {"WORLD_SIZE", "5"}})).world_size, 5);
  EXPECT_EQ(resolveRankInfo({}, envOf({{"WORLD_SIZE", ""}})).world_size, 1);
}

// A malformed value was an error only when its partner was set (WORLD_SIZE=x alone ran as one
// rank). Catches any variable that is still skipped when it stands alone.
TEST(RanksTest, AMalformedVariableIsAnErrorWhicheverOthersAreSet) {
  for (const char* name :
       {"WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"}) {
    for (const char* value : {"x", "-1", "2.5"}) {
      const std::string error = errorOf({}, envOf({{name, value}}));
      EXPECT_EQ(error.rfind("environment variable " + std::string(name) +
                                ": expected a whole "
                                "number in [",
                            0),
                0U)
          << name << "=" << value << ": '" << error << "'";
      EXPECT_NE(error.find(std::string("but got '") + value + "'"), std::string::npos) << error;
    }
  }
  EXPECT_EQ(errorOf({}, envOf({{"WORLD_SIZE", "0"}})),
            "environment variable WORLD_SIZE: expected a whole number in [1, 1048576], but got "
            "'0'");
}

// `--master-addr 256.1.1.1` searched until the timeout and was blamed on a port in use. A host
// that is no address and no host name is bad input, named with where it came from. Catches a
// resolver that passes any text on to the store, and one that refuses real addresses and names.
TEST(RanksTest, AStoreHostThatIsNoAddressIsAUsageError) {
  RankFlags flags;
  flags.master_addr = "256.1.1.1";
  EXPECT_EQ(errorOf(flags, envOf({})),
            "--master-addr: expected an IPv4 address of four numbers in [0, 255] (e.g. 10.0.0.1) "
            "or a host name, but got '256.1.1.1'");
  EXPECT_NE(errorOf({}, envOf({{"MASTER_ADDR", "10.0.0"}})).find("MASTER_ADDR: expected an IPv4"),
            std::string::npos);
  EXPECT_NE(errorOf({}, envOf({{"MASTER_ADDR", "fd00::zz"}})).find("an IPv6 address"),
            std::string::npos);
  EXPECT_NE(errorOf({}, envOf({{"MASTER_ADDR", "node 1"}})).find("MASTER_ADDR: expected a host"),
            std::string::npos);
  flags.master_addr = "";
  EXPECT_EQ(errorOf(flags, envOf({})),
            "--master-addr: expected a host name or address, but got ''");
  for (const char* good : {"10.0.0.1", "255.255.255.255", "node-01.cluster", "gpu_7", "::1",
                           "fd00::1", "fe80::1%eth0", "localhost"}) {
    flags.master_addr = good;
    const RankInfo info = resolveRankInfo(flags, envOf({}));
    EXPECT_EQ(info.master_addr, good);
    EXPECT_EQ(info.master_addr_origin, "--master-addr");
  }
  EXPECT_EQ(resolveRankInfo({}, envOf({})).master_addr_origin, "default");
  EXPECT_EQ(resolveRankInfo({}, envOf({{"SLURM_PROCID", "0"}, {"SLURM_JOB_NODELIST", "n[3-4]"}}))
                .master_addr_origin,
            "SLURM_JOB_NODELIST");
}

// Issue 68 rows 1 and 2: the ranks compare what their plans depend on. Catches a job round
// that compares nothing (rank 0 --target-batch 64, rank 1 40000: both exit 0 with one backward
// per step on one rank and forty on the other), one that stops at the first rank, and two
// versions taken as one.
TEST(RanksTest, JobRecordsThatDifferNameTheFieldTheRanksAndBothValues) {
  const JobFields a = {{"model", "abc (10 bytes)"}, {"target-batch", "64"}, {"plan", "auto"}};
  JobFields b = a;
  b[1].second = "40000";
  const auto record = [](const JobFields& f, const std::string& version) {
    return decodeJobFields(encodeJobFields(f, version));
  };
  EXPECT_EQ(record(a, "0.1.0").fields, a);
  EXPECT_EQ(record(a, "0.1.0").version, "0.1.0");
  EXPECT_NO_THROW(compareJobRecords({record(a, "0.1.0"), record(a, "0.1.0")}));
  EXPECT_EQ(rankErrorOf([&] {
              compareJobRecords({record(a, "0.1.0"), record(a, "0.1.0"), record(b, "0.1.0")});
            }),
            "ranks disagree on target-batch: rank 0 has '64', rank 2 has '40000'; every rank of "
            "one job must run it with the same target-batch (the plan would differ between ranks "
            "and their collectives mismatch)");
  JobFields c = a;
  c[0].second = "def (10 bytes)";
  EXPECT_NE(rankErrorOf([&] {
              compareJobRecords({record(a, "0.1.0"), record(c, "0.1.0")});
            })
                .find("ranks disagree on model: rank 0 has 'abc (10 bytes)', rank 1 has "
                      "'def (10 bytes)'"),
            std::string::npos);
  EXPECT_EQ(rankErrorOf([&] {
              compareJobRecords({record(a, "0.1.0"), record(a, "0.2.0")});
            }),
            "ranks disagree on the autobatch version: rank 0 runs autobatch 0.1.0, rank 1 runs "
            "autobatch 0.2.0; run the same autobatch on every rank");
}

// Catches a rank of another version read as a parse error (exit 1 naming nobody): a report of
// protocol 1 (no protocol key) or of a later protocol is refused naming both versions.
TEST(RanksTest, ReportsOfAnotherProtocolNameBothVersions) {
  const RankReport old =
      decodeRankReport("rank=1;status=ok;device=cpu;safe=3;plan_max=3;verified=1;limit=100");
  EXPECT_EQ(old.protocol, 1);
  RankReport mine = rep(0, "ok", "cpu", 4, 4, true, 100);
  mine.version = "0.1.0";
  const std::string words = rankErrorOf([&] { agree({mine, old}, 2); });
  EXPECT_NE(words.find("rank 1 runs an autobatch without a version in its records (rank records "
                       "of protocol 1), this job's other ranks autobatch 0.1.0 (protocol 2)"),
            std::string::npos)
      << words;
  const RankReport later = decodeRankReport("protocol=9;version=9.0;rank=1;whatever=1");
  EXPECT_EQ(later.protocol, 9);
  EXPECT_NE(rankErrorOf([&] { agree({mine, later}, 2); }).find("autobatch 9.0"), std::string::npos);
}

// Catches ranks of other inputs (another model's archive) agreeing on the smaller rank's size.
TEST(RanksTest, ReportsOfOtherInputsDisagree) {
  RankReport a = rep(0, "ok", "cpu", 40, 40, true, 0);
  RankReport b = rep(1, "ok", "cpu", 27, 27, true, 0);
  a.inputs = "f32:512";
  b.inputs = "int64:128";
  EXPECT_EQ(rankErrorOf([&] {
              agree({a, b}, 2);
            }),
            "ranks disagree on inputs: rank 0 has 'f32:512', rank 1 has 'int64:128'; every rank "
            "of one job must train the same model on the same inputs");
  b.inputs = a.inputs;
  EXPECT_EQ(agree({a, b}, 2).safe_micro_batch, 27);
}

}  // namespace ranks_test
}  // namespace
}  // namespace autobatch
