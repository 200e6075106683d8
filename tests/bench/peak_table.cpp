// peak_table: the peak table of docs/trial_runner.md ("Measured peaks"): the CPU budget
// allocator's peak of one trial (2 steps, cross-entropy, 1 micro-batch) of the tiny models of
// tests/support/test_models.h at three batches each, for fp32 and amp-bf16 with sgd and adamw.
// Prints one line per model, precision and optimizer: "<model> | <precision> | <optimizer> | params
// <bytes> B | B=<batch>: <peak bytes> ...". A program, not a test (it asserts nothing; the figures
// depend on the CPU's oneDNN kernels). Was TrialRunnerTest.PrintsPeakTable (issue 28). Usage:
// build/tests/peak_table
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "autobatch/probes/trial_runner.h"
#include "support/test_models.h"

namespace {

using autobatch::LossKind;
using autobatch::OptimizerKind;
using autobatch::Precision;
using autobatch::SearchOptions;
using autobatch::TrainingSpec;
using autobatch::TrialRunner;

TrainingSpec specOf(const std::string& inputs, OptimizerKind optimizer, Precision precision) {
  TrainingSpec spec;
  spec.inputs = autobatch::parseInputSpecs(inputs);
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = optimizer;
  spec.precision = precision;
  return spec;
}

struct Case {
  const char* name;
  torch::jit::Module module;
  const char* inputs;
  std::vector<std::int64_t> batches;
};

}  // namespace

int main() {
  using autobatch::testing::convNet;
  using autobatch::testing::plainConvNet;
  using autobatch::testing::tinyTransformer;
  std::vector<Case> cases{
      {"convnet-bn c16 3x32x32", convNet(16), "3x32x32", {8, 16, 32}},
      {"convnet c32 3x32x32", plainConvNet(32), "3x32x32", {8, 16, 32}},
      {"transformer d64 v512 T64", tinyTransformer(512, 64), "int64:64:<512", {4, 8, 16}}};
  // The CPU budget allocator (it needs a limit; without one the CPU trials measure otherwise) at
  // 1 GiB: far above these peaks (tens of MB), so they are the models' own, and below what the
  // process can use (no warning that the limit was clipped).
  SearchOptions options;
  options.memory_limit_bytes = std::int64_t{1} << 30;
  for (auto& c : cases) {
    for (const auto precision : {Precision::kFp32, Precision::kAmpBf16}) {
      for (const auto optimizer : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
        TrialRunner runner(c.module, specOf(c.inputs, optimizer, precision), options);
        std::cout << c.name << " | " << toString(precision) << " | " << toString(optimizer)
                  << " | params " << runner.parameterBytes() << " B |";
        for (const auto b : c.batches) {
          const auto r = runner.run({b, 1, {}});
          std::cout << " B=" << b << ": " << r.peak_bytes;
        }
        std::cout << "\n";
      }
    }
  }
  return 0;
}
