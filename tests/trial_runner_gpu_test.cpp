// The trial runner on CUDA (label gpu): skipped without a GPU.
#include <gtest/gtest.h>

#include "autobatch/error.h"
#include "autobatch/trial_runner.h"
#include "test_models.h"

namespace autobatch {
namespace {

class TrialRunnerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  static TrainingSpec spec(const std::string& inputs) {
    TrainingSpec s;
    s.inputs = parseInputSpecs(inputs);
    s.loss = LossKind::kCrossEntropy;
    s.device = "cuda";
    return s;
  }
  static SearchOptions limit(std::int64_t bytes) {
    SearchOptions o;
    o.memory_limit_bytes = bytes;
    return o;
  }
};

TEST_F(TrialRunnerGpuTest, OutOfMemoryIsCaughtAndBytesReturnToBaseline) {
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("3x64x64"), limit(std::int64_t{2} << 30));
  const auto big = runner.run({1 << 14, 1, {}});
  EXPECT_EQ(big.outcome, TrialOutcome::kOutOfMemory) << big.reason;
  EXPECT_GT(big.failed_request_bytes, 0);
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
  const auto small = runner.run({8, 1, {}});
  EXPECT_EQ(small.outcome, TrialOutcome::kFits);
  EXPECT_LE(small.peak_bytes, runner.memoryLimitBytes());
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

TEST_F(TrialRunnerGpuTest, EmulatedLimitIsRespectedAndFractionRestored) {
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  const std::int64_t l = std::int64_t{3} << 30;
  {
    TrialRunner runner(m, spec("3x64x64"), limit(l));
    EXPECT_EQ(runner.memoryLimitBytes(), l);
    for (std::int64_t b = 64; b <= 4096; b *= 2) {
      const auto r = runner.run({b, 1, {}});
      if (r.outcome == TrialOutcome::kFits) {
        EXPECT_LE(r.peak_bytes, l) << "B=" << b;
      }
    }
  }
  // The memory fraction is back: a tensor larger than the emulated card can be made.
  const auto t = torch::empty({l / 4 + 1024}, torch::TensorOptions().device(torch::kCUDA));
  EXPECT_TRUE(t.defined());
}

TEST_F(TrialRunnerGpuTest, DefaultLimitAndOutsidePartArePlausible) {
  auto m = testing::convNet(16);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("3x32x32"));
  EXPECT_GT(runner.outsideBytes(), std::int64_t{50} << 20);  // a CUDA context is >= ~100 MB
  EXPECT_LT(runner.outsideBytes(), runner.memoryLimitBytes() / 2);
  EXPECT_GT(runner.memoryLimitBytes(), std::int64_t{4} << 30);
  EXPECT_EQ(runner.backendName(), "cuda-caching");
}

TEST_F(TrialRunnerGpuTest, CublasWorkspaceIsReleasedBetweenTrials) {
  auto m = testing::tinyTransformer(512, 64);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("int64:64:<512"));
  const auto first = runner.run({8, 1, {}});
  const auto second = runner.run({8, 1, {}});
  EXPECT_EQ(first.outcome, TrialOutcome::kFits);
  EXPECT_EQ(first.peak_reserved_bytes, second.peak_reserved_bytes);
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

TEST_F(TrialRunnerGpuTest, CudnnBenchmarkWorkspaceShowsInThePeak) {
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  auto s = spec("3x64x64");
  const std::int64_t plain = TrialRunner(m, s).run({32, 1, {}}).peak_reserved_bytes;
  s.cudnn_benchmark = true;
  const std::int64_t bench = TrialRunner(m, s).run({32, 1, {}}).peak_reserved_bytes;
  EXPECT_GE(bench, plain);
}

}  // namespace
}  // namespace autobatch
