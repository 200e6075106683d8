// The trial runner on CUDA (label gpu): skipped without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>

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

// Dropout on CUDA draws from the device's default generator: a trial must leave its state (seed and
// offset) as it found it, so that a job started after findMaxBatch() sees the same random stream.
TEST_F(TrialRunnerGpuTest, CudaRngStateIsRestored) {
  auto m = testing::newModule("DropoutMlp");
  torch::manual_seed(0);
  testing::param(m, "w", torch::randn({64, 10}) * 0.1);
  m.define(R"(
    def forward(self, x):
        return torch.matmul(torch.dropout(x, 0.5, self.training), self.w)
  )");
  m.to(torch::kCUDA);
  const auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, 0));
  const at::Tensor before = gen.get_state();
  TrialRunner runner(m, spec("64"));
  ASSERT_EQ(runner.run({256, 1, {}}).outcome, TrialOutcome::kFits);
  EXPECT_TRUE(torch::equal(gen.get_state(), before));
  // And the trial did draw from it: dropout outside a trial moves the state.
  torch::dropout(torch::ones({256, 64}, torch::kCUDA), 0.5, true);
  EXPECT_FALSE(torch::equal(gen.get_state(), before));
}

// cuDNN and 32-bit indexing limits: a Conv3d whose output passes 2^31 elements. PyTorch splits some
// such convolutions over the batch; where it cannot, cuDNN answers CUDNN_STATUS_NOT_SUPPORTED (or a
// kernel "invalid configuration argument"). Either way the outcome is fits or size-limit, never
// out-of-memory (the card has room for it) and never an exception out of the runner.
TEST_F(TrialRunnerGpuTest, HugeConv3dIsAFitOrASizeLimitNeverOutOfMemory) {
  auto m = testing::newModule("Conv3dNet");
  torch::manual_seed(0);
  testing::param(m, "w", torch::randn({4, 1, 3, 3, 3}) * 0.1);
  testing::param(m, "fc", torch::randn({4, 10}) * 0.1);
  m.define(R"(
    def forward(self, x):
        y = torch.conv3d(x, self.w, None, [1, 1, 1], [1, 1, 1])
        return torch.matmul(torch.mean(y, [2, 3, 4]), self.fc)
  )");
  m.to(torch::kCUDA);
  auto s = spec("1x128x128x128");  // 2^21 elements per sample
  s.optimizer = OptimizerKind::kSgd;
  s.steps_per_trial = 1;
  TrialRunner runner(m, s);
  // B = 300: the conv output is 4 x 2^21 x 300 = 2.5e9 elements (10 GB in fp32), the input 2.5 GB:
  // about 25 GB with the backward; cards with less than 40 GiB free skip.
  const std::int64_t batch = 300;
  if (runner.memoryLimitBytes() < (std::int64_t{40} << 30)) {
    GTEST_SKIP() << "needs a card with at least 40 GiB free";
  }
  TrialResult r;
  ASSERT_NO_THROW(r = runner.run({batch, 1, {}}));
  std::cout << "Conv3d B=" << batch << ": " << toString(r.outcome) << " " << r.reason << "\n";
  EXPECT_NE(r.outcome, TrialOutcome::kOutOfMemory) << r.reason;
  if (r.outcome == TrialOutcome::kSizeLimit) {
    EXPECT_FALSE(r.reason.empty());
  }
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

}  // namespace
}  // namespace autobatch
