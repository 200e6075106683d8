// Python lifetimes in the evaluation forward (eval_lifetimes.h, docs/evaluation.md): the peak of
// an evaluation trial on tiny scripted modules written like decoder_lm_small's tail, against the
// bytes a Python frame would hold, computed from the shapes.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "autobatch/autobatch.h"
#include "autobatch/probes/trial_runner.h"
#include "probes/eval_lifetimes.h"
#include "support/test_models.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace eval_lifetimes_test {

using testing::newModule;
using testing::param;

constexpr std::int64_t kBatch = 64;
constexpr std::int64_t kWidth = 256;   // the input and the hidden state x: 64 KiB a batch
constexpr std::int64_t kWide = 1024;   // the rebinding module's first output: 256 KiB
constexpr std::int64_t kVocab = 4096;  // the logits: 1 MiB
constexpr std::int64_t kFloat = 4;

// A submodule `x -> op(x @ w)` with w [in, out].
torch::jit::Module layer(const char* name, std::int64_t in, std::int64_t out, const char* op) {
  auto m = newModule(name);
  param(m, "w", torch::randn({in, out}) * 0.05);
  m.define(std::string("def forward(self, x):\n    return ") + op + "(torch.matmul(x, self.w))\n");
  return m;
}

// decoder_lm_small's tail: `x = block(x); return self.head(self.ln(x))`.
torch::jit::Module tail() {
  torch::manual_seed(0);
  auto m = newModule("Tail");
  m.register_module("block", layer("Block", kWidth, kWidth, "torch.tanh"));
  m.register_module("ln", layer("Ln", kWidth, kWidth, "torch.relu"));
  m.register_module("head", layer("Head", kWidth, kVocab, ""));
  m.define(R"(
    def forward(self, x):
        x = self.block.forward(x)
        return self.head.forward(self.ln.forward(x))
  )");
  return m;
}

// The tail with its hidden state made two calls deep: `x = self.inner.forward(x)`, whose forward
// returns `self.block.forward(x)` (the value returned is the nested call's).
torch::jit::Module nestedTail() {
  torch::manual_seed(0);
  auto inner = newModule("Inner");
  inner.register_module("block", layer("Block", kWidth, kWidth, "torch.tanh"));
  inner.define("def forward(self, x):\n    return self.block.forward(x)\n");
  auto m = newModule("NestedTail");
  m.register_module("inner", inner);
  m.register_module("ln", layer("Ln", kWidth, kWidth, "torch.relu"));
  m.register_module("head", layer("Head", kWidth, kVocab, ""));
  m.define(R"(
    def forward(self, x):
        x = self.inner.forward(x)
        return self.head.forward(self.ln.forward(x))
  )");
  return m;
}

// A local rebound twice: `x = self.a(x); x = self.b(x)`, then the logits.
torch::jit::Module rebinding() {
  torch::manual_seed(0);
  auto m = newModule("Rebinding");
  m.register_module("a", layer("A", kWidth, kWide, "torch.tanh"));
  m.register_module("b", layer("B", kWide, kWidth, "torch.tanh"));
  m.register_module("head", layer("Head", kWidth, kVocab, ""));
  m.define(R"(
    def forward(self, x):
        x = self.a.forward(x)
        x = self.b.forward(x)
        return self.head.forward(x)
  )");
  return m;
}

// The module saved and loaded again: its graph is compiled from the serialized code, whose names
// are the printer's (`x0`, `x1`, `_0`), as for every archive under models/.
torch::jit::Module roundTrip(const torch::jit::Module& m) {
  std::stringstream archive;
  m.save(archive);
  return torch::jit::load(archive);
}

// The peak above the parameters of one evaluation trial (2 batches of kBatch, the previous
// output alive), with or without Python's lifetimes.
std::int64_t evalPeakAboveParameters(torch::jit::Module m, bool python_lifetimes) {
  if (python_lifetimes) {
    unsetenv("AUTOBATCH_EVAL_LIFETIMES");
  } else {
    setenv("AUTOBATCH_EVAL_LIFETIMES", "interpreter", 1);
  }
  TrainingSpec spec;
  spec.inputs = parseInputSpecs(std::to_string(kWidth));
  spec.loss = LossKind::kMean;
  SearchOptions options;
  options.memory_limit_bytes = std::int64_t{1} << 30;
  TrialRunner runner(m, spec, options);
  EXPECT_EQ(runner.holdEvalState(EvalState::kParametersOnly, 1).outcome, TrialOutcome::kFits);
  // The second trial: the executor profiles the first runs and optimizes the graph for the
  // later ones, as a search's later trials run it (its passes must keep the keep-alive uses).
  (void)runner.runEval({kBatch, 2, {}});
  const TrialResult trial = runner.runEval({kBatch, 2, {}});
  unsetenv("AUTOBATCH_EVAL_LIFETIMES");
  EXPECT_EQ(trial.outcome, TrialOutcome::kFits);
  return trial.peak_bytes - runner.currentBytes();
}

constexpr std::int64_t kInputBytes = kBatch * kWidth * kFloat;
constexpr std::int64_t kHiddenBytes = kBatch * kWidth * kFloat;
constexpr std::int64_t kLogitsBytes = kBatch * kVocab * kFloat;

// What Python holds while the second batch's head makes its logits: this batch's input (the
// loop's `x`, rebound: the previous batch's is gone), the previous batch's logits (`out` of the
// loop, rebound only once forward returns), this batch's logits, and these: for the tail, `x` (the
// frame's local) and ln's output (head's argument); for the rebinding module, b's output only (a's
// was freed when x was rebound).
constexpr std::int64_t kTailPythonPeak = kInputBytes + 2 * kLogitsBytes + 2 * kHiddenBytes;
constexpr std::int64_t kRebindingPythonPeak = kInputBytes + 2 * kLogitsBytes + kHiddenBytes;

// The tail's evaluation peak is what Python holds, and without the pass it is lower by exactly
// x's bytes (the interpreter frees x once ln has read it), both for the module as scripted and
// as loaded from an archive. Catches an evaluation forward that runs the interpreter's lifetimes
// (the pass not applied, or no keep-alive use inserted), and a pass that misses
// printer-named locals (`x0`).
TEST(EvalLifetimesTest, TailKeepsTheFramesLocalWhileTheLogitsAreMade) {
  for (const bool loaded : {false, true}) {
    const torch::jit::Module m = loaded ? roundTrip(tail()) : tail();
    const std::int64_t python = evalPeakAboveParameters(m.clone(), true);
    const std::int64_t interpreter = evalPeakAboveParameters(m.clone(), false);
    EXPECT_EQ(python, kTailPythonPeak) << (loaded ? "loaded" : "scripted");
    EXPECT_EQ(python - interpreter, kHiddenBytes) << (loaded ? "loaded" : "scripted");
  }
}

// The same when x comes out of a call inside a call: the caller's local is the value the inner
// call returned, which the inner call's own inlining replaced. Catches a pass that binds the
// value the outer inlining returned (destroyed by then: the keep-alive would name a dangling or
// another value) instead of the one that replaced it.
TEST(EvalLifetimesTest, LocalMadeTwoCallsDeepIsKept) {
  for (const bool loaded : {false, true}) {
    const torch::jit::Module m = loaded ? roundTrip(nestedTail()) : nestedTail();
    const std::int64_t python = evalPeakAboveParameters(m.clone(), true);
    const std::int64_t interpreter = evalPeakAboveParameters(m.clone(), false);
    EXPECT_EQ(python, kTailPythonPeak) << (loaded ? "loaded" : "scripted");
    EXPECT_EQ(python - interpreter, kHiddenBytes) << (loaded ? "loaded" : "scripted");
  }
}

// Rebinding ends a local's lifetime, as in Python: a's output (256 KiB) is freed when
// `x = self.b(x)` binds b's output, so the pass adds nothing to this module's peak. Catches a pass
// that keeps every named value to the end of its frame (the peak would be 256 KiB higher), and
// one that does not see `x0` and `x1` of the serialized code as the same local `x`.
TEST(EvalLifetimesTest, RebindingFreesTheOldValueAsPythonDoes) {
  for (const bool loaded : {false, true}) {
    const torch::jit::Module m = loaded ? roundTrip(rebinding()) : rebinding();
    const std::int64_t python = evalPeakAboveParameters(m.clone(), true);
    const std::int64_t interpreter = evalPeakAboveParameters(m.clone(), false);
    EXPECT_EQ(python, kRebindingPythonPeak) << (loaded ? "loaded" : "scripted");
    EXPECT_EQ(python, interpreter) << (loaded ? "loaded" : "scripted");
  }
}

// The transformed forward computes what forward does (the inlining keeps the program), and the
// module is left as it was. Catches a call inlined with its arguments crossed, or a graph
// transformed in place (the module's own forward would then carry the keep-alive uses).
TEST(EvalLifetimesTest, TransformedForwardComputesTheSameOutput) {
  torch::jit::Module m = roundTrip(tail());
  const std::string before = m.get_method("forward").graph()->toString();
  const detail::PythonLifetimeForward transformed = detail::pythonLifetimeForward(m);
  EXPECT_GE(transformed.kept_values, 1);
  const torch::Tensor x = torch::randn({3, kWidth});
  const torch::Tensor expected = m.forward({x}).toTensor();
  torch::jit::Stack stack{m._ivalue(), x};
  transformed.function->run(stack);
  EXPECT_TRUE(torch::allclose(stack.front().toTensor(), expected));
  EXPECT_EQ(m.get_method("forward").graph()->toString(), before);
  EXPECT_NE(transformed.function->graph()->toString().find("autobatch::keep_alive"),
            std::string::npos);
}

}  // namespace eval_lifetimes_test
}  // namespace
}  // namespace autobatch
