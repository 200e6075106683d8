// CLI JSON goldens (issue 28 item 1): the built CLI run in a child process on a small TorchScript
// model with the CPU budget allocator (--device cpu --memory-limit), its JSON report reduced to
// the trials and the answer (tests/support/cli_golden.h says what is dropped and why) and compared
// with tests/golden/cli/<case>.json. A restructured trial runner or search that changes which
// batches are tried, what a trial measures (peak bytes, phase peaks, the failed phase) or the
// answer fails here. Update mode: AUTOBATCH_UPDATE_GOLDEN=1 build/tests/cli_golden_test rewrites
// the files (tests/golden/README.md). The pt2 package's golden is in pt2_test.cpp (it needs the
// packages' ctest fixture).
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/cli_golden.h"
#include "support/cli_run.h"
#include "support/golden.h"

namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace cli_golden_test {

namespace fs = std::filesystem;

using autobatch::testing::CliRun;

fs::path tmpDir() { return autobatch::testing::testDir("cli-golden"); }

// The MLP of cli_test.cpp: float32 [batch, 64] -> [batch, 10], relu, cross-entropy, saved with
// its input description (weights seeded; only their shapes matter to memory).
std::string mlpModel() {
  const fs::path path = tmpDir() / "mlp.pt";
  torch::manual_seed(0);
  torch::jit::Module net("Mlp");
  net.register_parameter("w1", torch::randn({64, 256}).requires_grad_(), false);
  net.register_parameter("w2", torch::randn({256, 10}).requires_grad_(), false);
  net.define(R"(
    def forward(self, x):
        return torch.matmul(torch.relu(torch.matmul(x, self.w1)), self.w2)
  )");
  torch::jit::ExtraFilesMap extra{
      {"autobatch/inputs.json", R"({"version": 1, "inputs": ["64"], "loss": "cross-entropy"})"}};
  net.save(path.string(), extra);
  return path.string();
}

// Runs the CLI with `args` and --json, expects `exit_code`, and compares the normalised JSON with
// tests/golden/cli/<name>.json.
void expectCliGolden(const std::string& name, const std::string& args, int exit_code) {
  const fs::path json = tmpDir() / (name + ".json");
  const autobatch::testing::ThreadsForGolden threads;
  const CliRun run =
      autobatch::testing::runCliIn(tmpDir(), name, args + " -q --json " + json.string());
  ASSERT_EQ(run.exit_code, exit_code) << run.err << run.out;
  const auto doc = nlohmann::json::parse(autobatch::testing::readFile(json));
  autobatch::testing::expectGolden("cli/" + name + ".json",
                                   autobatch::testing::normalisedCliJson(doc));
}

const std::string kCommon = " --device cpu --memory-limit 8MiB";

// A full guided search with a target of 10000 over 2 ranks (its plan verified with 2
// micro-batches per step). --plan auto: the default rule (fastest) picks the primary plan by the
// step times measured, and the verifying trial runs that plan's micro-batch, so the trial sequence
// would depend on the clock. Catches a changed trial sequence (today's walk: 1, 19, 3273 out of
// memory, 1959, 2416 out of memory, 2414, ...; before issue 28 item 7: 1, 19, 3273 and 2445 out of
// memory, 216, ...), a peak or phase peak measured differently, a plan made on another batch.
TEST(CliGoldenTest, TorchScriptSearch) {
  expectCliGolden(
      "torchscript_search",
      "--model " + mlpModel() + kCommon + " --target-batch 10000 --world-size 2 --plan auto", 0);
}

// --check-batch at a batch that fits and one that runs out of memory, with 2 accumulation steps
// (2 micro-batches per trial). Catches a check that measures or classifies its trial differently.
TEST(CliGoldenTest, TorchScriptCheckFits) {
  expectCliGolden("torchscript_check_fits",
                  "--model " + mlpModel() + kCommon + " --accumulation-steps 2 --check-batch 512",
                  0);
}

TEST(CliGoldenTest, TorchScriptCheckDoesNotFit) {
  expectCliGolden("torchscript_check_does_not_fit",
                  "--model " + mlpModel() + kCommon + " --accumulation-steps 2 --check-batch 8192",
                  3);
}

}  // namespace cli_golden_test
}  // namespace
