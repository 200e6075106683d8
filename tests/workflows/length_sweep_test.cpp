// sweepLengths and lowerSweepRow (autobatch/workflows/length_sweep.h): a token model under the CPU
// budget allocator, and the lowering of a row on plain values; no CLI.
#include "autobatch/workflows/length_sweep.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace length_sweep_test {

namespace fs = std::filesystem;

// int64 ids [batch, L] below 64 -> logits [batch, L, 64], with a position table of 128 rows: at
// a length above 128 its forward raises an index error (a model with a fixed context).
std::string positionModel() {
  const fs::path dir = fs::path(AUTOBATCH_TEST_TMP) / "length_sweep";
  fs::create_directories(dir);
  const fs::path path = dir / ("position-" + std::to_string(::getpid()) + ".pt");
  torch::manual_seed(0);
  torch::jit::Module net("Position");
  net.register_parameter("emb", torch::randn({64, 16}).requires_grad_(), false);
  net.register_parameter("pos", torch::randn({128, 16}).requires_grad_(), false);
  net.register_parameter("out", torch::randn({16, 64}).requires_grad_(), false);
  net.define(R"(
    def forward(self, x):
        h = self.emb[x] + self.pos[torch.arange(x.size(-1))]
        return torch.matmul(h, self.out)
  )");
  net.save(path.string());
  return path.string();
}

TrainingSpec tokenSpec() {
  TrainingSpec spec;
  spec.model_path = positionModel();
  spec.device = "cpu";
  spec.loss = LossKind::kMean;
  return spec;
}

SearchOptions underBudget() {
  SearchOptions o;
  o.memory_limit_bytes = 8LL << 20;
  return o;
}

LengthSweepOptions lengths(std::vector<std::int64_t> values) {
  LengthSweepOptions sweep;
  sweep.input_texts = {"int64:L:<64"};
  sweep.lengths = std::move(values);
  return sweep;
}

// Length 256 is past the model's 128 positions: its row says so and the shorter lengths are
// searched, each seeded by the longer one's maximum, then mixed. Catches a sweep lost to one
// length's error, an error row without the batch it was raised at, an unseeded search, a sweep
// that answers with the wrong length, and one that never runs the mix.
TEST(LengthSweepTest, AnErrorRowAndTheOtherLengthsSearchedSeededAndMixed) {
  LengthSweepOptions sweep = lengths({256, 128, 64});
  std::vector<std::int64_t> row_lengths;
  std::vector<std::vector<std::int64_t>> requests(1);
  sweep.on_row = [&](const SweepRow& row) {
    row_lengths.push_back(row.length);
    requests.emplace_back();
  };
  SearchOptions options = underBudget();
  options.before_trial = [&](const TrialRequest& r) {
    requests.back().push_back(r.micro_batch_size);
  };
  const LengthSweepResult out = sweepLengths(tokenSpec(), options, sweep);
  EXPECT_EQ(row_lengths, (std::vector<std::int64_t>{256, 128, 64}));
  const auto& rows = out.sweep.rows;
  ASSERT_EQ(rows.size(), 3U);
  EXPECT_EQ(rows[0].status, "error");
  EXPECT_NE(rows[0].error.find("index 128 is out of bounds"), std::string::npos) << rows[0].error;
  EXPECT_NE(rows[0].error.find("(raised in the training step at micro-batch 1 x 1 per step)"),
            std::string::npos)
      << rows[0].error;
  EXPECT_EQ(rows[0].error.find("Exception raised from"), std::string::npos);
  EXPECT_EQ(rows[1].status, "found");
  EXPECT_EQ(rows[2].status, "found");
  EXPECT_EQ(rows[1].tokens_per_sample, 128);
  EXPECT_EQ(rows[2].tokens_per_micro_batch, rows[2].safe_micro_batch * 64);
  EXPECT_GE(rows[2].safe_micro_batch, rows[1].safe_micro_batch);
  // Length 64 starts at 128's maximum, which fits (memory grows with the length).
  ASSERT_FALSE(requests[2].empty());
  EXPECT_EQ(requests[2].front(), rows[1].max_micro_batch);
  EXPECT_EQ(out.sweep.longest_trainable_length, 128);
  EXPECT_EQ(out.error, "");
  ASSERT_TRUE(out.pick.has_value());
  ASSERT_EQ(out.pick->spec.inputs.size(), 1U);
  EXPECT_EQ(out.pick->spec.inputs[0].sample_shape, (std::vector<std::int64_t>{128}));
  EXPECT_EQ(out.pick->result.search.safe_micro_batch, rows[1].safe_micro_batch);
  ASSERT_TRUE(out.sweep.mixed.has_value());
  EXPECT_EQ(out.sweep.mixed->status, "verified");
  ASSERT_EQ(out.sweep.mixed->trials.size(), 1U);
  EXPECT_EQ(out.sweep.mixed->trials[0].steps.size(), 3U);  // 128, 64, 128
}

// Every length raises: no answer, and the error names each length. Catches a sweep that throws
// away the rows, or answers with a length that never trained.
TEST(LengthSweepTest, EveryLengthRaisingIsTheSweepsError) {
  const LengthSweepResult out = sweepLengths(tokenSpec(), underBudget(), lengths({256, 200}));
  ASSERT_EQ(out.sweep.rows.size(), 2U);
  EXPECT_FALSE(out.pick.has_value());
  EXPECT_FALSE(out.sweep.mixed.has_value());
  EXPECT_EQ(out.error.rfind("no length of the sweep trains, and the model raised an error at "
                            "length 256: ",
                            0),
            0U)
      << out.error;
  EXPECT_NE(out.error.find("; length 200: "), std::string::npos) << out.error;
}

// --target-tokens: each length plans floor(tokens / length) sequences, a multiple of the world
// size; the answer's options keep the caller's time limit. Catches targets not scaled by the
// length, not rounded to the ranks, and the time left at the last length leaking into the report.
TEST(LengthSweepTest, TargetTokensGiveEachLengthItsTargetInSequences) {
  LengthSweepOptions sweep = lengths({128, 64});
  sweep.target_tokens = 1000;
  SearchOptions options = underBudget();
  options.world_size = 2;
  options.time_limit_s = 600.0;
  const LengthSweepResult out = sweepLengths(tokenSpec(), options, sweep);
  ASSERT_EQ(out.sweep.rows.size(), 2U);
  EXPECT_EQ(out.sweep.target_tokens, 1000);
  EXPECT_EQ(out.sweep.rows[0].target_batch, 6);   // 1000 / 128 = 7, down to a multiple of 2
  EXPECT_EQ(out.sweep.rows[1].target_batch, 14);  // 1000 / 64 = 15
  ASSERT_TRUE(out.sweep.rows[1].plan.has_value());
  EXPECT_EQ(out.sweep.rows[1].plan->primary().effective_batch, 14);
  ASSERT_TRUE(out.pick.has_value());
  EXPECT_EQ(out.pick->options.target_batch, 6);
  EXPECT_EQ(out.pick->options.time_limit_s, 600.0);
}

// Through the result cache, a second sweep answers every length from its entry. Catches a sweep
// that ignores the cache, or keys every length the same (one entry for all lengths).
TEST(LengthSweepTest, ASecondSweepThroughTheCacheHitsEveryLength) {
  const TrainingSpec spec = tokenSpec();
  LengthSweepOptions sweep = lengths({128, 64});
  sweep.cache = ResultCacheOptions{};
  sweep.cache->dir =
      (fs::path(AUTOBATCH_TEST_TMP) / "length_sweep" / ("results-" + std::to_string(::getpid())))
          .string();
  fs::remove_all(sweep.cache->dir);
  const LengthSweepResult first = sweepLengths(spec, underBudget(), sweep);
  const LengthSweepResult second = sweepLengths(spec, underBudget(), sweep);
  ASSERT_EQ(second.sweep.rows.size(), 2U);
  EXPECT_EQ(first.sweep.rows[0].cache_outcome, "miss");
  EXPECT_EQ(first.sweep.rows[1].cache_outcome, "miss");
  EXPECT_EQ(second.sweep.rows[0].cache_outcome, "hit");
  EXPECT_EQ(second.sweep.rows[1].cache_outcome, "hit");
  EXPECT_EQ(second.sweep.rows[1].safe_micro_batch, first.sweep.rows[1].safe_micro_batch);
  ASSERT_TRUE(second.pick && second.pick->cache);
  EXPECT_EQ(second.pick->cache->outcome, "hit");
}

// Catches a sweep that divides by zero tokens or searches nothing.
TEST(LengthSweepTest, NoLengthOrNoPlaceholderIsAnError) {
  const TrainingSpec spec = tokenSpec();
  EXPECT_THROW((void)sweepLengths(spec, underBudget(), lengths({})), Error);
  LengthSweepOptions fixed = lengths({64});
  fixed.input_texts = {"int64:64:<64"};
  try {
    (void)sweepLengths(spec, underBudget(), fixed);
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no input names L"), std::string::npos) << e.what();
  }
}

// A row with a plan for 96 sequences over 2 ranks, safe at 20, planned on 16.
struct Planned {
  SweepRow row;
  SearchResult search;
  SearchOptions options;
};

Planned planned() {
  Planned p;
  p.options.target_batch = 96;
  p.options.world_size = 2;
  p.options.plan = PlanKind::kUniform;
  p.search.status = SearchStatus::kFound;
  p.search.max_micro_batch = 21;
  p.search.safe_micro_batch = 20;
  p.search.plan = planAccumulation(16, 96, 2, PlanKind::kUniform);
  p.search.plan_max_micro_batch = 16;
  p.search.plan_verified = true;
  p.row.length = 512;
  p.row.status = "found";
  p.row.safe_micro_batch = 20;
  p.row.tokens_per_sample = 512;
  p.row.tokens_per_micro_batch = std::int64_t{20} * 512;
  p.row.plan = p.search.plan;
  return p;
}

// The mix lowered the bucket 16 -> 10: the row and its search train at most 10, planned again.
// Catches a lowering that changes the row but not the search the report answers with, keeps the
// old plan, or forgets where it came from.
TEST(LengthSweepTest, ALoweredBucketLowersItsRowAndPlansAgain) {
  Planned p = planned();
  lowerSweepRow(p.row, p.search, 16, 10, p.options);
  EXPECT_EQ(p.row.lowered_from, 16);
  EXPECT_EQ(p.row.safe_micro_batch, 10);
  EXPECT_EQ(p.row.tokens_per_micro_batch, 10 * 512);
  EXPECT_EQ(p.row.status, "found");
  EXPECT_EQ(p.search.safe_micro_batch, 10);
  EXPECT_EQ(p.search.plan_max_micro_batch, 10);
  EXPECT_TRUE(p.search.plan_verified);
  ASSERT_TRUE(p.search.plan && p.row.plan);
  EXPECT_EQ(p.search.plan->primary().effective_batch, 96);
  EXPECT_LE(p.search.plan->primary().largestMicroBatch(), 10);
  EXPECT_EQ(p.row.plan->primary().largestMicroBatch(),
            p.search.plan->primary().largestMicroBatch());
  ASSERT_EQ(p.search.warnings.size(), 1U);
  EXPECT_EQ(p.search.warnings[0],
            "length 512: the mixed verification lowered micro-batch 16 -> 10 (it fit alone, not "
            "mixed with the other lengths)");
}

// The mix dropped the bucket: the row fails mixed and its search has nothing safe. Catches a
// dropped length still reported "found" with a plan.
TEST(LengthSweepTest, ADroppedBucketFailsMixed) {
  Planned p = planned();
  lowerSweepRow(p.row, p.search, 16, 0, p.options);
  EXPECT_EQ(p.row.status, "fails-mixed");
  EXPECT_EQ(p.row.safe_micro_batch, 0);
  EXPECT_FALSE(p.row.plan.has_value());
  EXPECT_EQ(p.search.status, SearchStatus::kNothingFits);
  EXPECT_FALSE(p.search.plan.has_value());
  EXPECT_EQ(p.search.plan_max_micro_batch, 0);
  EXPECT_NE(p.search.warnings.at(0).find("length 512: left out (micro-batch 16 fit alone"),
            std::string::npos);
}

// A length without a plan (no target) lowered: only its safe batch. Catches a lowering that
// invents a plan.
TEST(LengthSweepTest, ALoweredRowWithoutAPlanGetsNone) {
  Planned p = planned();
  p.options.target_batch = 0;
  p.search.plan.reset();
  p.search.plan_max_micro_batch = 0;
  p.row.plan.reset();
  lowerSweepRow(p.row, p.search, 20, 12, p.options);
  EXPECT_EQ(p.row.safe_micro_batch, 12);
  EXPECT_EQ(p.search.safe_micro_batch, 12);
  EXPECT_FALSE(p.search.plan.has_value());
  EXPECT_FALSE(p.row.plan.has_value());
}

}  // namespace length_sweep_test
}  // namespace
}  // namespace autobatch
