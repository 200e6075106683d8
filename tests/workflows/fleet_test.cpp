// The fleet table (autobatch/workflows/fleet.h, --fleet): the list's parser, the shared-trial
// search on fake probes (each size's answer is what a search of that size alone finds, with fewer
// trials run), and the command on a small TorchScript model under the CPU budget allocator.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autobatch/search/search.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/workflows/fleet.h"
#include "support/cli_run.h"
#include "support/fake_probe.h"
#include "support/test_models.h"

namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace fleet_test {

namespace fs = std::filesystem;
using autobatch::FleetSize;
using autobatch::testing::kGiB;
using autobatch::testing::kMiB;
using autobatch::testing::MemoryModel;

// ---- the list -----------------------------------------------------------------------------

// Catches: names matched case-sensitively, a size read without its unit, the table's figure not
// used for a name (marketed "40 GB" instead of CUDA's totalGlobalMem).
TEST(FleetParseTest, SizesAndGpuNamesAsGiven) {
  const auto sizes = autobatch::parseFleet("16GiB, A100-40GB,24GB,l4");
  ASSERT_EQ(sizes.size(), 4U);
  EXPECT_EQ(sizes[0].bytes, 16 * kGiB);
  EXPECT_EQ(sizes[0].source, "given");
  EXPECT_EQ(sizes[1].name, "a100-40gb");
  EXPECT_EQ(sizes[1].bytes, 42298834944);
  EXPECT_NE(sizes[1].source.find("bottlerocket"), std::string::npos);
  EXPECT_EQ(sizes[2].bytes, 24000000000);
  EXPECT_EQ(sizes[3].bytes, 23570219008);
}

// Catches: each bad list accepted (a table with a hole, a size counted twice, a guess for an
// unknown card) instead of exit 2 with the fix.
TEST(FleetParseTest, BadListsSayWhatWasExpected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "an empty item"},
      {"16GiB,,24GiB", "an empty item"},
      {"16GiB,", "an empty item"},
      {"a100", "GPU names (t4, l4"},
      {"rtx3090", "give its total memory as a size"},
      {"24GiB,24GiB", "expected distinct sizes"},
      {"a100-40gb,42298834944B", "expected distinct sizes"},
      {"0GiB", "expected sizes > 0"},
      {"-1GiB", "--fleet"},
      {"24", "--fleet"},
  };
  for (const auto& [text, words] : cases) {
    try {
      (void)autobatch::parseFleet(text);
      ADD_FAILURE() << "accepted: '" << text << "'";
    } catch (const autobatch::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << text << " -> " << e.what();
    }
  }
}

// ---- the shared-trial search on fake probes ------------------------------------------------

struct Counted {
  int runs = 0;
};

// A factory of fake targets: the memory model under each size's limit less `slack` (as CUDA's
// allowance under a memory fraction is lower by one expandable page); sizes above `device` are
// clipped (not measurable).
autobatch::FleetTargetFactory fakeFactory(const MemoryModel& base, std::int64_t device,
                                          Counted& counted, std::int64_t slack = 0) {
  return [=, &counted](std::int64_t limit) {
    MemoryModel m = base;
    m.limit_bytes = std::min(limit, device) - slack;
    autobatch::FleetTarget t;
    const std::int64_t trial_limit = std::min(limit, device);
    t.probe = [m, trial_limit, &counted](const autobatch::TrialRequest& r) {
      ++counted.runs;
      autobatch::TrialResult result = m.run(r);
      result.memory_limit_bytes = trial_limit;  // as a runner reports it: the limit, not the
      return result;                            // allowance the slack lowers
    };
    t.trial_limit_bytes = trial_limit;
    t.measurable = limit <= device;
    t.allocation_units = {1, 1};
    t.transfer_slack_bytes = slack;
    return t;
  };
}

autobatch::SearchOptions fleetOptions() {
  autobatch::SearchOptions o;
  o.margin_fraction = 0.05;
  o.allocation_units = {1, 1};
  o.target_batch = 512;
  return o;
}

// What a search of one size alone finds, and its trials.
autobatch::SearchResult alone(const MemoryModel& base, std::int64_t limit) {
  MemoryModel m = base;
  m.limit_bytes = limit;
  autobatch::SearchOptions o = fleetOptions();
  o.memory_limit_bytes = limit;
  return autobatch::findMaxBatch([m](const autobatch::TrialRequest& r) { return m.run(r); }, o);
}

// Catches: a transferred trial that answers wrongly (a fit taken where the smaller limit fails:
// an answer above the alone search's), sizes not searched largest first, and sharing that saves
// nothing (the table must run fewer trials than the separate searches).
TEST(FleetTest, EachSizeAnswersAsItsOwnSearchWithFewerTrials) {
  MemoryModel base;
  base.fixed_bytes = 3 * kGiB;
  base.per_sample_bytes = 37 * kMiB;
  base.noise_prefix = {0};
  for (int b = 1; b < 4096; ++b)
    base.noise_prefix.push_back(base.noise_prefix.back() + std::int64_t{b % 7} * 1024);
  base.noise_max_step = std::int64_t{6} * 1024;
  const std::vector<FleetSize> sizes = {{"16GiB", 16 * kGiB, "given"},
                                        {"80GiB", 80 * kGiB, "given"},
                                        {"24GiB", 24 * kGiB, "given"},
                                        {"40GiB", 40 * kGiB, "given"}};
  Counted counted;
  const auto fleet =
      autobatch::sizeFleet(sizes, fleetOptions(), fakeFactory(base, 96 * kGiB, counted));
  ASSERT_EQ(fleet.fleet.rows.size(), 4U);
  int separate = 0;
  std::int64_t previous = std::numeric_limits<std::int64_t>::max();
  for (const auto& row : fleet.fleet.rows) {
    EXPECT_LT(row.bytes, previous);  // largest first
    previous = row.bytes;
    const auto own = alone(base, row.bytes);
    separate += static_cast<int>(own.trials.size());
    EXPECT_EQ(row.max_micro_batch, own.max_micro_batch) << row.name;
    EXPECT_EQ(row.safe_micro_batch, own.safe_micro_batch) << row.name;
    EXPECT_TRUE(row.verified) << row.name;
    ASSERT_TRUE(row.plan.has_value());
    EXPECT_EQ(row.plan->primary().effective_batch, 512);
  }
  EXPECT_EQ(fleet.fleet.trials_run, counted.runs);
  EXPECT_LT(counted.runs, separate);
  EXPECT_GT(fleet.fleet.rows.back().trials_reused, 0);
  ASSERT_TRUE(fleet.pick.has_value());
  EXPECT_EQ(fleet.pick->search.max_micro_batch, fleet.fleet.rows.front().max_micro_batch);
}

// Catches: a size above what the device can emulate searched anyway (its answer would be this
// device's, not that card's), and the rows below it not measured.
TEST(FleetTest, SizesAboveTheDeviceAreNotMeasurable) {
  MemoryModel base;
  Counted counted;
  const std::vector<FleetSize> sizes = {
      {"a", 80 * kGiB, "given"}, {"b", 141 * kGiB, "given"}, {"c", 24 * kGiB, "given"}};
  const auto fleet =
      autobatch::sizeFleet(sizes, fleetOptions(), fakeFactory(base, 48 * kGiB, counted));
  ASSERT_EQ(fleet.fleet.rows.size(), 3U);
  EXPECT_EQ(fleet.fleet.rows[0].status, "not-measurable");
  EXPECT_EQ(fleet.fleet.rows[1].status, "not-measurable");
  EXPECT_NE(fleet.fleet.rows[1].note.find("largest measurable size is 48.00 GiB"),
            std::string::npos)
      << fleet.fleet.rows[1].note;
  EXPECT_EQ(fleet.fleet.rows[0].trials_run, 0);
  EXPECT_EQ(fleet.fleet.rows[2].status, "found");
  EXPECT_EQ(fleet.fleet.rows[2].max_micro_batch, alone(base, 24 * kGiB).max_micro_batch);
  EXPECT_EQ(fleet.fleet.largest_measurable_bytes, 24 * kGiB);
}

// Catches: a fit within the CUDA slack of a smaller limit reused as a fit there (under a memory
// fraction the allowance is one expandable page lower, so the trial fails there): the small
// size would answer 240 where its own search finds 239.
TEST(FleetTest, FitsWithinTheSlackOfASmallerLimitRunAgain) {
  MemoryModel base;
  base.fixed_bytes = kGiB;
  base.per_sample_bytes = 64 * kMiB;  // peak(240) = 16 GiB exactly
  Counted counted;
  const std::int64_t slack = 20 * kMiB;
  const std::vector<FleetSize> sizes = {{"big", 32 * kGiB, "given"},
                                        {"small", 16 * kGiB + 10 * kMiB, "given"}};
  autobatch::SearchOptions o = fleetOptions();
  o.seed_batches = {240};  // the largest size's first trial: fits there with a 16 GiB peak
  const auto fleet = autobatch::sizeFleet(sizes, o, fakeFactory(base, 64 * kGiB, counted, slack));
  const auto& small = fleet.fleet.rows[1];
  EXPECT_EQ(small.max_micro_batch, 239);
  EXPECT_EQ(small.max_micro_batch, alone(base, 16 * kGiB + 10 * kMiB - slack).max_micro_batch);
  EXPECT_TRUE(small.verified);
}

// ---- the command ----------------------------------------------------------------------------

fs::path tmpDir() { return autobatch::testing::testDir("fleet"); }

// tests/support/test_models.h's MLP, [B, 256] -> [B, 10], saved with its input description.
std::string mlpModel() {
  const fs::path path = tmpDir() / "mlp.pt";
  torch::jit::ExtraFilesMap extra{
      {"autobatch/inputs.json", R"({"version": 1, "inputs": ["256"], "loss": "cross-entropy"})"}};
  autobatch::testing::mlp(256, 512, 10).save(path.string(), extra);
  return path.string();
}

nlohmann::json runJson(const std::string& tag, const std::string& args, int expected_exit) {
  const fs::path json = tmpDir() / (tag + ".json");
  const auto run =
      autobatch::testing::runCliIn(tmpDir(), tag, args + " --device cpu --json " + json.string());
  EXPECT_EQ(run.exit_code, expected_exit) << run.err;
  return nlohmann::json::parse(autobatch::testing::readFile(json));
}

// Catches: a table whose rows differ from separate --memory-limit runs of the same sizes (a
// transfer that is not sound, a limit not applied per size), and a table that runs as many
// trials as the separate runs.
TEST(FleetCliTest, RowsMatchSeparateRunsWithFewerTrials) {
  const std::string model = mlpModel();
  const std::vector<std::string> limits = {"24MiB", "16MiB", "12MiB", "10MiB"};
  const auto fleet = runJson(
      "fleet", "--model " + model + " --target-batch 4096 --fleet " + "16MiB,10MiB,24MiB,12MiB", 0);
  const auto& rows = fleet["fleet"]["rows"];
  ASSERT_EQ(rows.size(), 4U);
  int separate = 0;
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const auto one =
        runJson("one" + std::to_string(i),
                "--model " + model + " --target-batch 4096 --memory-limit " + limits[i], 0);
    separate += static_cast<int>(one["trials"].size());
    EXPECT_EQ(rows[i]["name"], limits[i]);
    EXPECT_EQ(rows[i]["max_micro_batch"], one["result"]["max_micro_batch"]) << limits[i];
    EXPECT_EQ(rows[i]["safe_micro_batch"], one["result"]["safe_micro_batch"]) << limits[i];
    EXPECT_EQ(rows[i]["plan"]["effective_batch"], 4096);
  }
  EXPECT_LT(fleet["fleet"]["trials_run"].get<int>(), separate);
  EXPECT_EQ(fleet["result"]["max_micro_batch"], rows[0]["max_micro_batch"]);
}

// Catches: flags that give the run another answer than the table's accepted silently.
TEST(FleetCliTest, CombinationsThatCannotBeTabledAreUsageErrors) {
  const std::string model = mlpModel();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--fleet 16MiB --memory-limit 8MiB", "add the size to --fleet"},
      {"--fleet 16MiB --check-batch 4", "check one size with --memory-limit"},
      {"--fleet 16MiB --env", "read the JSON's fleet rows"},
      {"--fleet 16MiB --cache", "leave --cache out"},
      {"--fleet 16MiB,h300", "give its total memory as a size"},
      {"--fleet ''", "an empty item"},
      {"--fleet 16MiB --eval", "the table has no evaluation column yet"},
  };
  for (const auto& [args, words] : cases) {
    const auto run =
        autobatch::testing::runCliIn(tmpDir(), "bad", "--model " + model + " --device cpu " + args);
    EXPECT_EQ(run.exit_code, 2) << args;
    EXPECT_NE(run.err.find(words), std::string::npos) << args << ": " << run.err;
  }
}

}  // namespace fleet_test
}  // namespace
