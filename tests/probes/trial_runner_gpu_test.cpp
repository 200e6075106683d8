// The trial runner and the CLI on CUDA (label gpu): skipped without a GPU. Each test names the
// wrong implementation it catches. scripts/device/check.sh fails when a GPU is visible and any of
// these skipped.
#include <ATen/Context.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/vocabulary/error.h"
#include "memory/cuda_api.h"
#include "support/cli_run.h"
#include "support/test_models.h"

namespace autobatch {
namespace {

namespace fs = std::filesystem;

// The device's used bytes as cudaMemGetInfo sees them (context, other processes and the caching
// allocator's segments together): what a real card runs out of.
std::int64_t deviceUsedBytes() {
  const auto api = detail::makeCudaRuntimeApi();
  const detail::CudaMemInfo info = api->memInfo(0);
  return info.total_bytes - info.free_bytes;
}

detail::CudaAllocatorStats allocatorStats() { return detail::makeCudaRuntimeApi()->stats(0); }

using testing::CliRun;
using testing::readFile;

fs::path tmpDir() { return testing::testDir("gpu"); }

// The CLI in a fresh process, as a user or a preflight script runs it.
CliRun runCli(const std::string& args, const std::string& tag) {
  return testing::runCliIn(tmpDir(), tag, args);
}

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

// The emulated card is checked against what the device itself reports (cudaMemGetInfo, sampled
// between the steps of each trial while the allocator still holds the trial's segments), not
// against the allocator's own statistics, which the fraction enforces by construction. Catches a
// fraction that leaves out the outside part (context, kernels: hundreds of MiB) or takes the wrong
// total.
TEST_F(TrialRunnerGpuTest, EmulatedLimitIsRespectedAndFractionRestored) {
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  const std::int64_t l = std::int64_t{3} << 30;
  // Other processes on the device count as outside the allocator too: the base is what is used
  // now, less this process's allocator.
  {
    TrialRunner runner(m, spec("3x64x64"), limit(l));
    EXPECT_EQ(runner.memoryLimitBytes(), l);
    const std::int64_t others =
        deviceUsedBytes() - runner.outsideBytes() - allocatorStats().reserved_current_bytes;
    int fitted = 0;
    int failed = 0;
    for (std::int64_t b = 64; b <= 4096; b *= 2) {
      std::int64_t worst = 0;
      TrialRequest request{b, 1, {}};
      request.cancel = [&worst] {
        worst = std::max(worst, deviceUsedBytes());
        return false;
      };
      const auto r = runner.run(request);
      worst = std::max(worst, deviceUsedBytes());
      EXPECT_LE(worst - std::max<std::int64_t>(others, 0), l) << "B=" << b;
      if (r.outcome == TrialOutcome::kFits) {
        ++fitted;
        EXPECT_LE(r.peak_bytes, l) << "B=" << b;
      } else {
        ++failed;
      }
    }
    EXPECT_GT(fitted, 0);
    EXPECT_GT(failed, 0);  // the sweep reached the emulated card's limit
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

// The cuBLAS workspace (32 MiB per handle and stream on sm_90) lives inside the caching allocator
// until at::cuda::clearCublasWorkspaces(): emptyCache() alone cannot free it. Catches a runner that
// only empties the cache (reserved stays >= 32 MiB above the model after a trial) and a baseline
// read while the warm-up's workspace was held (currentBytes() then ends below the baseline).
TEST_F(TrialRunnerGpuTest, CublasWorkspaceIsReleasedBetweenTrials) {
  auto m = testing::tinyTransformer(512, 64);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("int64:64:<512"));
  const auto first = runner.run({8, 1, {}});
  const auto second = runner.run({8, 1, {}});
  EXPECT_EQ(first.outcome, TrialOutcome::kFits);
  EXPECT_EQ(first.peak_reserved_bytes, second.peak_reserved_bytes);
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
  const detail::CudaAllocatorStats after = allocatorStats();
  // What stays reserved is the model's own segments (2 MiB small-pool blocks): far less than one
  // workspace.
  EXPECT_LT(after.reserved_current_bytes - after.allocated_current_bytes, std::int64_t{32} << 20);
}

TEST_F(TrialRunnerGpuTest, CudnnBenchmarkWorkspaceShowsInThePeak) {
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  auto s = spec("3x64x64");
  const std::int64_t plain = TrialRunner(m, s).run({32, 1, {}}).peak_reserved_bytes;
  s.cudnn_benchmark = true;
  const std::int64_t bench = TrialRunner(m, s).run({32, 1, {}}).peak_reserved_bytes;
  // cudnnFind tries algorithms with their workspaces, allocated through the caching allocator:
  // the benchmark trial's peak is strictly higher. Catches a peak read after a reset that drops
  // the first step's workspaces, or workspaces allocated outside the counted statistics.
  EXPECT_GT(bench, plain);
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

// Fault 1 of the CUDA-path issue: TrainingSpec::device = "cuda" (what every launcher writes)
// parsed to Device(cuda, -1) and the device check threw "expected its tensors on cuda, but got one
// on cuda:0". Catches any comparison made before the index is resolved.
TEST_F(TrialRunnerGpuTest, IndexlessCudaIsTheCurrentDevice) {
  auto m = testing::convNet(16);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("3x32x32"));  // spec() says "cuda"
  EXPECT_EQ(runner.device(), "cuda:0");
  EXPECT_EQ(runner.run({8, 1, {}}).outcome, TrialOutcome::kFits);
}

// Memory taken outside the caching allocator by a raw cudaMalloc (another library, another
// process) leaves the device short: the caching allocator's failed cudaMalloc is out of memory,
// never a model error, and the growth of the outside part shows in the trial and the runner.
// Catches a classifier that calls "CUDA error: out of memory" fatal (its DSA hint line says
// "device-side assertions") and an outside part read once at setup.
TEST_F(TrialRunnerGpuTest, RawCudaMallocOutsideTheAllocatorIsOutOfMemoryAndGrowth) {
  using Malloc = int (*)(void**, std::size_t);
  using Free = int (*)(void*);
  auto* cuda_malloc = reinterpret_cast<Malloc>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
  auto* cuda_free = reinterpret_cast<Free>(dlsym(RTLD_DEFAULT, "cudaFree"));
  ASSERT_NE(cuda_malloc, nullptr);
  ASSERT_NE(cuda_free, nullptr);
  auto m = testing::convNet(64);
  m.to(torch::kCUDA);
  TrialRunner runner(m, spec("3x64x64"));
  ASSERT_EQ(runner.run({16, 1, {}}).outcome, TrialOutcome::kFits);
  const auto api = detail::makeCudaRuntimeApi();
  const std::int64_t keep = std::int64_t{1} << 30;  // leave 1 GiB free
  const std::int64_t take = api->memInfo(0).free_bytes - keep;
  void* block = nullptr;
  ASSERT_EQ(cuda_malloc(&block, static_cast<std::size_t>(take)), 0);
  // B = 1024 at 3x64x64 with 64 channels needs several GiB of activations.
  const auto r = runner.run({1024, 1, {}});
  EXPECT_EQ(r.outcome, TrialOutcome::kOutOfMemory) << r.reason;
  EXPECT_GE(r.outside_growth_bytes, take - (std::int64_t{64} << 20));
  EXPECT_GE(runner.outsideGrowthBytes(), take - (std::int64_t{64} << 20));
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
  ASSERT_EQ(cuda_free(block), 0);
  EXPECT_EQ(runner.run({16, 1, {}}).outcome, TrialOutcome::kFits);
}

// The CLI end to end with --device cuda on a small model, each answer checked in fresh processes:
// the answer fits with --margin 0 and answer + 1 does not. Catches an answer the search never saw
// fit, a limit that differs between a search and a check, and a "cuda" that does not resolve.
TEST_F(TrialRunnerGpuTest, CliFindsAnAnswerThatFreshProcessesConfirm) {
  const fs::path model = tmpDir() / "convnet.pt";
  testing::convNet(64).save(model.string());
  const std::string common = "--model " + model.string() +
                             " --input 3x64x64 --loss cross-entropy --device cuda "
                             "--memory-limit 2GiB --margin 0";
  const fs::path json_path = tmpDir() / "search.json";
  const CliRun search = runCli(common + " --json " + json_path.string(), "search");
  ASSERT_EQ(search.exit_code, 0) << search.out << search.err;
  const auto report = nlohmann::json::parse(readFile(json_path));
  EXPECT_EQ(report["device"]["name"], "cuda:0");
  EXPECT_EQ(report["device"]["backend"], "cuda-caching");
  const std::int64_t b = report["result"]["max_micro_batch"].get<std::int64_t>();
  ASSERT_GT(b, 0);
  const CliRun fits = runCli(common + " --check-batch " + std::to_string(b), "check-b");
  EXPECT_EQ(fits.exit_code, 0) << "B=" << b << "\n" << fits.out << fits.err;
  const CliRun over = runCli(common + " --check-batch " + std::to_string(b + 1), "check-b1");
  EXPECT_EQ(over.exit_code, 3) << "B+1=" << b + 1 << "\n" << over.out << over.err;
}

// A sticky device error (an embedding index past the table: a device-side assert, reported at the
// next synchronize) poisons the CUDA context. Catches a runner that synchronizes or restores the
// weights after it (the destructor then throws: std::terminate, exit 134, no report): the process
// must exit 1 with the model's error in the JSON.
TEST_F(TrialRunnerGpuTest, StickyDeviceErrorExitsOneWithTheJsonWritten) {
  const fs::path model = tmpDir() / "bad_embedding.pt";
  {
    auto m = testing::newModule("BadEmbedding");
    torch::manual_seed(0);
    testing::param(m, "table", torch::randn({10, 16}) * 0.1);
    m.define(R"(
    def forward(self, ids):
        return torch.mean(torch.embedding(self.table, ids), 1)
  )");
    m.save(model.string());
  }
  const fs::path json_path = tmpDir() / "report.json";
  // ids drawn from [0, 1000): most are past the 10-row table.
  const CliRun run =
      runCli("--model " + model.string() +
                 " --input int64:8:<1000 --loss mean --device cuda --json " + json_path.string(),
             "run");
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  ASSERT_TRUE(fs::exists(json_path)) << run.err;
  const auto report = nlohmann::json::parse(readFile(json_path));
  EXPECT_EQ(report["exit_code"], 1);
  const std::string error = report["error"].is_string() ? report["error"].get<std::string>() : "";
  EXPECT_TRUE(error.find("device-side assert") != std::string::npos ||
              error.find("index") != std::string::npos)
      << error;
}

}  // namespace
}  // namespace autobatch
