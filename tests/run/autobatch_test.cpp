// The library's entry points (src/run/autobatch.cpp, autobatch/autobatch.h): findMaxBatch on a
// borrowed module, checkBatch's verdicts, the model-format detection and the SHA-1 digests, on tiny
// real TorchScript models on the CPU with the budget allocator.
#include "autobatch/autobatch.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "support/test_models.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace autobatch_test {

using testing::convNet;
using testing::mlp;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

TrainingSpec specOf(const std::string& inputs, LossKind loss, OptimizerKind optimizer) {
  TrainingSpec spec;
  spec.inputs = parseInputSpecs(inputs);
  spec.loss = loss;
  spec.optimizer = optimizer;
  return spec;
}

SearchOptions limit(std::int64_t bytes) {
  SearchOptions options;
  options.memory_limit_bytes = bytes;
  return options;
}

// The running test's folder, created (files in it are overwritten, never removed: in a binary
// linked with LibTorch, std::filesystem::remove_all binds to libtorch.so's copy, which crashes on
// a folder with files).
std::filesystem::path testDir() {
  std::filesystem::path dir = std::filesystem::path(AUTOBATCH_TEST_TMP) / "autobatch" /
                              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(dir);
  return dir;
}

// The launcher's contract (issue 9): after findMaxBatch() on a borrowed module, the module has its
// weights, buffers and mode, and trains right away.
TEST(FindMaxBatchTest, BorrowedModuleIsUnchangedAndTrainsRightAfter) {
  auto m = convNet();
  m.eval();
  std::vector<torch::Tensor> before;
  for (const auto& p : m.parameters()) before.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) before.push_back(b.detach().clone());
  const auto spec = specOf("3x16x16", LossKind::kCrossEntropy, OptimizerKind::kAdamW);
  SearchOptions options = limit(24 << 20);
  options.max_trials = 6;
  const MaxBatchResult found = findMaxBatch(m, spec, options);
  EXPECT_GT(found.search.safe_micro_batch, 0);
  std::size_t i = 0;
  for (const auto& p : m.parameters()) EXPECT_TRUE(torch::equal(p, before[i++]));
  for (const auto& b : m.buffers()) EXPECT_TRUE(torch::equal(b, before[i++])) << "buffer";
  EXPECT_FALSE(m.is_training());

  m.train();
  std::vector<torch::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-2));
  const auto batch = std::min<std::int64_t>(found.search.safe_micro_batch, 16);
  const auto out = m.forward({torch::randn({batch, 3, 16, 16})}).toTensor();
  torch::nn::functional::cross_entropy(out, torch::randint(10, {batch})).backward();
  optimizer.step();
  EXPECT_FALSE(torch::equal(m.parameters().begin().operator*(), before[0]));
  EXPECT_TRUE(torch::isfinite(m.parameters().begin().operator*()).all().item<bool>());
}

// checkBatch's two verdicts: a trial that fits is "fits" raw, and "fits with the margin" only when
// its peak is at most the limit less the margin. The second check runs the same trial (same model,
// batch and seed: the same peak) under a limit 1 MiB above that peak with a 2 MiB margin. Catches
// fits_with_margin taken from the raw fit (margin ignored), a margin of the default 5% when
// margin_bytes is given, a trial without the caller's hooks, and an out-of-memory trial called a
// fit.
TEST(CheckBatchTest, FitsWithTheMarginOnlyWhenThePeakIsUnderTheLimitLessTheMargin) {
  const std::filesystem::path model = testDir() / "mlp.pt";
  mlp(3, 40, 5).save(model.string());
  TrainingSpec spec = specOf("3", LossKind::kCrossEntropy, OptimizerKind::kAdamW);
  spec.model_path = model.string();
  SearchOptions options = limit(256 * kMiB);
  options.margin_bytes = 0;
  const CheckResult roomy = checkBatch(spec, options, 8);
  ASSERT_TRUE(roomy.fits);
  EXPECT_TRUE(roomy.fits_with_margin);
  EXPECT_EQ(roomy.trial.request.micro_batch_size, 8);
  EXPECT_EQ(roomy.margin_bytes, 0);
  // w1 [3, 40] and w2 [40, 5] in float32; AdamW keeps two moments of each.
  EXPECT_EQ(roomy.memory.parameter_bytes, (3 * 40 + 40 * 5) * 4);
  EXPECT_EQ(roomy.memory.optimizer_state_bytes, 2 * (3 * 40 + 40 * 5) * 4);
  const std::int64_t peak = roomy.trial.peak_bytes;
  ASSERT_GT(peak, 0);

  options.memory_limit_bytes = peak + kMiB;
  options.margin_bytes = 2 * kMiB;
  int before = 0;
  int after = 0;
  options.before_trial = [&before](const TrialRequest& r) {
    ++before;
    EXPECT_EQ(r.micro_batch_size, 8);
  };
  options.on_trial = [&after](const TrialResult&) { ++after; };
  const CheckResult tight = checkBatch(spec, options, 8);
  EXPECT_TRUE(tight.fits);
  EXPECT_EQ(tight.trial.peak_bytes, peak);
  EXPECT_FALSE(tight.fits_with_margin);
  EXPECT_EQ(tight.margin_bytes, 2 * kMiB);
  EXPECT_EQ(tight.context.memory_limit_bytes, peak + kMiB);
  EXPECT_EQ(before, 1);
  EXPECT_EQ(after, 1);

  options.memory_limit_bytes = peak / 2;
  options.margin_bytes = 0;
  const CheckResult small = checkBatch(spec, options, 8);
  EXPECT_EQ(small.trial.outcome, TrialOutcome::kOutOfMemory);
  EXPECT_FALSE(small.fits);
  EXPECT_FALSE(small.fits_with_margin);
}

// A micro-batch below 1 is refused with the expected value before the model is read. Catches a
// check that loads the model first (the error would then be about the missing file).
TEST(CheckBatchTest, MicroBatchBelowOneIsRefusedBeforeTheModelIsRead) {
  TrainingSpec spec = specOf("3", LossKind::kMean, OptimizerKind::kSgd);
  spec.model_path = "/nonexistent/model.pt";
  try {
    (void)checkBatch(spec, limit(256 * kMiB), 0);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "check batch: expected a micro-batch size >= 1, but got 0");
  }
}

// A TorchScript archive is a zip archive too, and a missing file has no format: both are
// "torchscript" (the loader explains what is wrong). Catches a detector that calls every zip
// archive a pt2 package, or one that throws on a file it cannot open.
TEST(ModelFormatTest, TorchScriptArchivesAndUnreadableFilesAreTorchScript) {
  const std::filesystem::path dir = testDir();
  mlp(3, 4, 2).save((dir / "mlp.pt").string());
  EXPECT_EQ(modelFormatOf((dir / "mlp.pt").string()), "torchscript");
  EXPECT_EQ(modelFormatOf((dir / "missing.pt2").string()), "torchscript");
}

// The digests of FIPS 180's test vectors, and a file's digest equal to its bytes' (a NUL and a
// CR-LF inside). Catches a file read in text mode or up to its first NUL, and a digest printed in
// another form than 40 lowercase hex digits.
TEST(Sha1Test, DigestsOfBytesAndFilesAreTheStandardOnes) {
  // Not the empty string: c10::sha1("") answers 0ffd8d43..., not da39a3ee... (no key or model
  // file autobatch hashes is empty).
  EXPECT_EQ(sha1Hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(sha1Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  // More than one 64-byte block, with a tail.
  EXPECT_EQ(sha1Hex(std::string(1000, 'a')), "291e9a6c66994949b57ba5e650361e98fc36b1ba");
  const std::string bytes("ab\0c\r\nd", 7);
  const std::filesystem::path file = testDir() / "bytes.bin";
  std::ofstream(file, std::ios::binary) << bytes;
  EXPECT_EQ(fileSha1(file.string()), sha1Hex(bytes));
  EXPECT_NE(sha1Hex(bytes), sha1Hex("abc"));
  try {
    (void)fileSha1((file.parent_path() / "missing").string());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected a readable file, but cannot open"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace autobatch_test
}  // namespace
}  // namespace autobatch
