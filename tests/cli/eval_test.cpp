// Evaluation sizing (issue 31, docs/evaluation.md): the runner's evaluation trials on the CPU
// budget allocator (real out of memory), and the CLI's --eval, --eval-only, --check-eval-batch.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/probes/trial_runner.h"
#include "autobatch/vocabulary/error.h"
#include "support/cli_run.h"
#include "support/test_models.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace eval_test {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::mlp;
using testing::readFile;

constexpr std::int64_t kIn = 64;
constexpr std::int64_t kHidden = 4096;
constexpr std::int64_t kClasses = 2048;
constexpr std::int64_t kBatch = 64;
constexpr std::int64_t kFloat = 4;

TrainingSpec mlpSpec(OptimizerKind optimizer = OptimizerKind::kAdamW,
                     ZeroGrad zero_grad = ZeroGrad::kNone) {
  TrainingSpec spec;
  spec.inputs = parseInputSpecs(std::to_string(kIn));
  spec.loss = LossKind::kMean;
  spec.optimizer = optimizer;
  spec.zero_grad = zero_grad;
  return spec;
}

SearchOptions unlimited() {
  SearchOptions options;
  options.memory_limit_bytes = std::int64_t{4} << 30;
  return options;
}

// One evaluation trial of `batches` batches of kBatch with `state` held; the runner's baseline
// and the bytes held with the state come back beside it.
struct EvalRun {
  TrialResult trial;
  std::int64_t baseline_bytes = 0;
  std::int64_t resident_bytes = 0;
  std::int64_t after_bytes = 0;  // currentBytes() once the state is released
};

EvalRun evalOnce(const TrainingSpec& spec, EvalState state, int batches = 2) {
  torch::jit::Module m = mlp(kIn, kHidden, kClasses);
  TrialRunner runner(m, spec, unlimited());
  EvalRun run;
  run.baseline_bytes = runner.baselineBytes();
  const TrialResult step = runner.holdEvalState(state, 1);
  EXPECT_EQ(step.outcome, TrialOutcome::kFits);
  run.resident_bytes = runner.currentBytes();
  run.trial = runner.runEval({kBatch, batches, {}});
  EXPECT_EQ(runner.currentBytes(), run.resident_bytes);  // the trial leaves the state as it was
  runner.releaseEvalState();
  run.after_bytes = runner.currentBytes();
  return run;
}

// The training state resident during evaluation is the optimizer state (AdamW: 2 x the trained
// parameters) and, with zero_grad zeros, the gradients: the peak with it is higher than the
// parameters-only peak by exactly those bytes. Catches an evaluation trial that runs without the
// optimizer state (the training step's optimizer freed, as after a training trial), and gradients
// kept (or freed) against what zero_grad says.
TEST(EvalTrialTest, PeakIncludesTheTrainingStateExactly) {
  const std::int64_t params = (kIn * kHidden + kHidden * kClasses) * kFloat;
  const EvalRun alone = evalOnce(mlpSpec(), EvalState::kParametersOnly);
  const EvalRun none = evalOnce(mlpSpec(), EvalState::kTrainingResident);
  const EvalRun zeros =
      evalOnce(mlpSpec(OptimizerKind::kAdamW, ZeroGrad::kZeros), EvalState::kTrainingResident);
  ASSERT_EQ(alone.trial.outcome, TrialOutcome::kFits);
  ASSERT_EQ(none.trial.outcome, TrialOutcome::kFits);
  ASSERT_EQ(zeros.trial.outcome, TrialOutcome::kFits);
  EXPECT_EQ(alone.resident_bytes, alone.baseline_bytes);
  EXPECT_EQ(none.resident_bytes - none.baseline_bytes, 2 * params);
  EXPECT_EQ(zeros.resident_bytes - zeros.baseline_bytes, 3 * params);
  EXPECT_EQ(none.trial.peak_bytes - alone.trial.peak_bytes, 2 * params);
  EXPECT_EQ(zeros.trial.peak_bytes - alone.trial.peak_bytes, 3 * params);
  // Released: back to the parameters alone.
  EXPECT_EQ(none.after_bytes, none.baseline_bytes);
  EXPECT_EQ(zeros.after_bytes, zeros.baseline_bytes);
}

// The previous batch's output is alive while the next batch runs: the second batch's forward
// peaks one output (kBatch x kClasses floats, 512 KiB) above the first's. Catches a loop that
// drops the output before the next forward (the two batches then peak alike: the difference is
// the held inputs only, 16 KiB).
TEST(EvalTrialTest, PreviousOutputIsAliveDuringTheNextBatch) {
  const EvalRun one = evalOnce(mlpSpec(), EvalState::kTrainingResident, 1);
  const EvalRun two = evalOnce(mlpSpec(), EvalState::kTrainingResident, 2);
  const std::int64_t output = kBatch * kClasses * kFloat;
  EXPECT_EQ(two.trial.output_bytes, output);
  EXPECT_GE(two.trial.peak_bytes - one.trial.peak_bytes, output);
  EXPECT_LE(two.trial.peak_bytes - one.trial.peak_bytes, output + kBatch * kIn * kFloat + 4096);
}

// No autograd graph: the peak is the resident bytes plus what a forward without a graph holds at
// once: two batches' inputs, the previous output, and the larger of tanh (its input and output,
// 2 x kBatch x kHidden floats) and the last matmul (tanh's output and this output). A graph kept
// with the previous output (forward not under no-grad / inference mode) holds that batch's tanh
// output too, 1 MiB more than this bound. Catches an evaluation forward that records a graph.
TEST(EvalTrialTest, NoGraphIsRecorded) {
  const EvalRun run = evalOnce(mlpSpec(), EvalState::kTrainingResident, 2);
  const std::int64_t input = kBatch * kIn * kFloat;
  const std::int64_t output = kBatch * kClasses * kFloat;
  const std::int64_t hidden = kBatch * kHidden * kFloat;
  const std::int64_t bound =
      run.resident_bytes + 2 * input + output + std::max(2 * hidden, hidden + output) + 4096;
  EXPECT_LE(run.trial.peak_bytes, bound);
  EXPECT_GT(run.trial.peak_bytes, bound - hidden / 2);  // the bound is tight, not vacuous
}

// The training step that creates the optimizer state runs out of memory under a limit just above
// the parameters: no state is held, the result says out of memory, and nothing was evaluated.
// Catches an out-of-memory while making the state reported as an evaluation result (the runner
// would then hold half a state and the evaluation trial would run).
TEST(EvalTrialTest, TrainingStateThatDoesNotFitHoldsNothing) {
  torch::jit::Module m = mlp(kIn, kHidden, kClasses);
  SearchOptions options;
  options.memory_limit_bytes = (kIn * kHidden + kHidden * kClasses) * kFloat * 2;
  TrialRunner runner(m, mlpSpec(), options);
  const TrialResult step = runner.holdEvalState(EvalState::kTrainingResident, 1);
  EXPECT_EQ(step.outcome, TrialOutcome::kOutOfMemory);
  EXPECT_FALSE(runner.holdsEvalState());
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
  EXPECT_THROW((void)runner.runEval({1, 2, {}}), Error);
}

// The model's training mode is as given after evaluation trials (eval() switched back), and the
// weights unchanged. Catches an evaluation trial that leaves the module in eval mode.
TEST(EvalTrialTest, TrainingModeAndWeightsAreRestored) {
  torch::jit::Module m = mlp(kIn, kHidden, kClasses);
  const at::Tensor before = m.attr("w1").toTensor().clone();
  {
    TrialRunner runner(m, mlpSpec(), unlimited());
    (void)runner.holdEvalState(EvalState::kTrainingResident, 2);
    (void)runner.runEval({4, 2, {}});
    runner.releaseEvalState();
    (void)runner.run({4, 1, {}});
  }
  EXPECT_TRUE(m.is_training());
  EXPECT_TRUE(at::equal(before, m.attr("w1").toTensor()));
}

// ---- the CLI ------------------------------------------------------------------------------

fs::path tmpDir() { return testing::testDir("eval"); }

CliRun runCli(const std::string& args, const std::string& tag = "std") {
  return testing::runCliIn(tmpDir(), tag, args);
}

std::string modelPath(const std::string& name) {
  return std::string(AUTOBATCH_MODELS_DIR) + "/" + name;
}

// A file the format check reads as a pt2 package (a zip archive with data/aotinductor/).
std::string fakePackage() {
  const fs::path path = tmpDir() / "fake.pt2";
  const std::string command =
      "python3 -c \"import zipfile; z = zipfile.ZipFile('" + path.string() +
      "', 'w'); z.writestr('m/version', '3'); z.writestr('m/.data/version', '3'); "
      "z.writestr('m/data/aotinductor/model/x.txt', 'x')\"";
  EXPECT_EQ(std::system(command.c_str()), 0);
  return path.string();
}

// Each bad combination is exit 2 with a message naming the fix, before any trial. Catches a flag
// silently ignored (a check run as a search, an evaluation search on a package that cannot run
// one).
TEST(EvalCliTest, BadCombinationsAreUsageErrors) {
  const std::string model = modelPath("resnet18.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  const std::string base = "--model " + model + " --device cpu --memory-limit 1GiB ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--check-eval-batch 4 --check-batch 2", "run autobatch once with --check-batch"},
      {"--check-eval-batch 4 --eval", "leave it out"},
      {"--check-eval-batch 4 --eval-only", "leave it out"},
      {"--eval --eval-only", "keep one"},
      {"--eval-only --check-batch 2", "--check-eval-batch"},
      {"--eval-only --target-batch 64", "leave it out, or plan training with --eval"},
      {"--eval --cache", "expected no --cache"},
      {"--eval --check-batch 2", "check an evaluation batch with --check-eval-batch"},
      {"--check-eval-batch 0", "--check-eval-batch"},
  };
  for (const auto& [args, message] : cases) {
    const CliRun run = runCli(base + args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << "\n" << run.err;
  }
  const std::string package = fakePackage();
  for (const std::string flag : {"--eval", "--eval-only", "--check-eval-batch 2"}) {
    const CliRun run = runCli("--model " + package + " --device cpu " + flag);
    EXPECT_EQ(run.exit_code, 2) << flag << "\n" << run.err;
    EXPECT_NE(run.err.find("export the model as TorchScript"), std::string::npos) << run.err;
  }
}

// A traced archive (its autobatch/export.json says method "trace", as scripts/autobatch_export.py
// writes it) gets a warning that its evaluation trials ran the graph as traced; a scripted one,
// or one that does not say, none. Catches the note missing, or given to every archive.
TEST(EvalCliTest, TracedArchiveIsNamedInTheWarnings) {
  for (const bool traced : {true, false}) {
    const fs::path model = tmpDir() / (traced ? "traced.pt" : "scripted.pt");
    torch::jit::Module m = mlp(kIn, 64, 8);
    torch::jit::ExtraFilesMap extra{
        {"autobatch/inputs.json", R"({"version": 1, "inputs": ["64"]})"},
        {"autobatch/export.json", traced ? R"({"version": 1, "method": "trace"})"
                                         : R"({"version": 1, "method": "script"})"}};
    m.save(model.string(), extra);
    const fs::path json_path = tmpDir() / "traced.json";
    const CliRun run = runCli("--model " + model.string() +
                              " --device cpu --memory-limit 256MiB --check-eval-batch 2 -q "
                              "--json " +
                              json_path.string());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto doc = nlohmann::json::parse(readFile(json_path));
    bool named = false;
    for (const auto& w : doc["warnings"]) {
      named = named || w.get<std::string>().find("traced TorchScript archive") != std::string::npos;
    }
    EXPECT_EQ(named, traced) << doc["warnings"].dump();
    EXPECT_EQ(run.out.find("traced TorchScript archive") != std::string::npos, traced) << run.out;
  }
}

// A scripted archive's evaluation forward keeps a local as Python does (docs/evaluation.md,
// "Python lifetimes"); one its autobatch/export.json says was traced runs as the interpreter does
// (a traced graph names few Python locals). Here `h` (batch x 1024 floats) is alive in Python
// while the last matmul makes the output (batch x 2048, the peak with the previous batch's
// output); the interpreter frees it after relu. Catches the transformation
// applied to a known-traced archive, and a scripted archive run without it.
TEST(EvalCliTest, TracedArchiveRunsTheInterpretersLifetimes) {
  constexpr std::int64_t kLocalWidth = 1024;
  constexpr std::int64_t kEvalBatch = 32;
  std::array<std::int64_t, 2> peak = {0, 0};
  for (const bool traced : {false, true}) {
    torch::manual_seed(0);
    auto m = testing::newModule("Local");
    testing::param(m, "w1", torch::randn({kIn, kLocalWidth}) * 0.1);
    testing::param(m, "w2", torch::randn({kLocalWidth, 2 * kLocalWidth}) * 0.1);
    m.define(R"(
      def forward(self, x):
          h = torch.tanh(torch.matmul(x, self.w1))
          return torch.matmul(torch.relu(h), self.w2)
    )");
    const fs::path model = tmpDir() / (traced ? "local_traced.pt" : "local_scripted.pt");
    torch::jit::ExtraFilesMap extra{
        {"autobatch/inputs.json", R"({"version": 1, "inputs": ["64"]})"},
        {"autobatch/export.json", traced ? R"({"version": 1, "method": "trace"})"
                                         : R"({"version": 1, "method": "script"})"}};
    m.save(model.string(), extra);
    const fs::path json_path = tmpDir() / "local.json";
    const CliRun run = runCli("--model " + model.string() +
                              " --device cpu --memory-limit 256MiB -q --check-eval-batch " +
                              std::to_string(kEvalBatch) + " --json " + json_path.string());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto doc = nlohmann::json::parse(readFile(json_path));
    peak.at(traced ? 1 : 0) = doc["trials"].back()["peak_allocated_bytes"];
  }
  EXPECT_EQ(peak.at(0) - peak.at(1), kEvalBatch * kLocalWidth * kFloat);
}

// A budget under the training state (decoder_lm_small: 20 MiB of parameters, 80 MiB with AdamW's
// state and the gradients): the evaluation is "the training state does not fit", exit 3, with
// eval.state_fits false and no evaluation trial. Catches an out-of-memory while making the state
// reported as an evaluation batch (or exit 0 because the check ran nothing).
TEST(EvalCliTest, TrainingStateThatDoesNotFitIsExit3) {
  const std::string model = modelPath("decoder_lm_small.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  const fs::path json_path = tmpDir() / "state.json";
  const CliRun run = runCli("--model " + model +
                            " --device cpu --memory-limit 64MiB --check-eval-batch 1 -q --json " +
                            json_path.string());
  EXPECT_EQ(run.exit_code, 3) << run.err;
  EXPECT_NE(run.out.find("the training state does not fit"), std::string::npos) << run.out;
  const auto doc = nlohmann::json::parse(readFile(json_path));
  EXPECT_EQ(doc["eval"]["state_fits"], false);
  EXPECT_EQ(doc["eval"]["training_step"]["outcome"], "out-of-memory");
  EXPECT_EQ(doc["status"], "does-not-fit");
}

// Its implicit members call nlohmann::json's noexcept ones, which clang-tidy 14 does not see as
// such (bugprone-exception-escape).
struct Answer {  // NOLINT(bugprone-exception-escape)
  std::int64_t train = 0;
  std::int64_t eval_max = 0;
  std::int64_t eval_safe = 0;
  nlohmann::json doc;
};

Answer searchWithEval(const std::string& args) {
  const fs::path json_path = tmpDir() / "eval.json";
  const CliRun run = runCli(args + " --eval --env --json " + json_path.string(), "search");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  Answer a;
  a.doc = nlohmann::json::parse(readFile(json_path));
  a.train = a.doc["result"]["max_micro_batch"];
  a.eval_max = a.doc["result"]["eval_max_batch"];
  a.eval_safe = a.doc["result"]["eval_safe_batch"];
  EXPECT_NE(run.out.find("AUTOBATCH_EVAL_BATCH=" + std::to_string(a.eval_safe) + "\n"),
            std::string::npos)
      << run.out;
  return a;
}

// The evaluation batch is larger than the training batch, and exact: --check-eval-batch in fresh
// processes says E fits and E+1 does not (the margin set to 0 so that max and safe agree).
void expectEvalLargerAndExact(const std::string& args) {
  const Answer a = searchWithEval(args);
  EXPECT_GT(a.eval_max, a.train) << a.doc["eval"].dump();
  EXPECT_EQ(a.eval_safe, a.eval_max);
  EXPECT_EQ(a.doc["eval"]["state"], "training-resident");
  EXPECT_EQ(a.doc["eval"]["capped_by"], "memory");
  std::size_t eval_trials = 0;
  for (const auto& t : a.doc["trials"]) eval_trials += t.contains("eval") ? 1U : 0U;
  EXPECT_EQ(eval_trials, a.doc["eval"]["trial_count"].get<std::size_t>());
  const CliRun fits = runCli(args + " --check-eval-batch " + std::to_string(a.eval_max), "fits");
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  const CliRun over =
      runCli(args + " --check-eval-batch " + std::to_string(a.eval_max + 1), "over");
  EXPECT_EQ(over.exit_code, 3) << over.err;
  std::cout << args << ": train " << a.train << ", eval " << a.eval_max << " ("
            << a.doc["eval"]["trial_count"] << " eval trials)\n";
}

// Issue 31's "Done when", ResNet-18 at 3x64x64 with AdamW under a 512 MiB budget. Catches an
// evaluation search that ran training trials (its answer would equal the training batch), and one
// whose answer a fresh check does not confirm.
TEST(EvalCliTest, ResNet18EvalBatchIsLargerAndExact) {
  const std::string model = modelPath("resnet18.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  expectEvalLargerAndExact("--model " + model +
                           " --input 3x64x64 --device cpu --memory-limit 512MiB --margin 0 -q");
}

// The same for decoder_lm_small (context 128, vocabulary 8000) under 256 MiB.
TEST(EvalCliTest, DecoderLmSmallEvalBatchIsLargerAndExact) {
  const std::string model = modelPath("decoder_lm_small.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  expectEvalLargerAndExact("--model " + model +
                           " --device cpu --memory-limit 256MiB --margin 0 -q");
}

// --lengths with --eval (docs/sweeps.md): each length's row carries its evaluation batch beside
// the training answer, in the JSON (eval_* keys), the text table and AUTOBATCH_EVAL_BUCKETS; the
// evaluation batch of the shorter length is exact (E fits, E+1 does not, in fresh processes at
// that length), larger than its training batch, and at least the longer length's (memory grows
// with the length). Catches one evaluation search reused for every length (the rows would agree),
// the training answer shown as the evaluation one, and an eval column missing from an output.
TEST(EvalCliTest, LengthSweepHasAnEvalBatchPerLength) {
  const std::string model = modelPath("decoder_lm_small.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  const std::string base = "--model " + model + " --device cpu --memory-limit 256MiB --margin 0 ";
  const fs::path json_path = tmpDir() / "sweep.json";
  const CliRun run = runCli(
      base + "--input 'int64:L:<8000' --lengths 64,128 --eval --env --json " + json_path.string(),
      "sweep");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto doc = nlohmann::json::parse(readFile(json_path));
  const auto& rows = doc["sweep"]["rows"];
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[0]["length"], 128);
  std::vector<std::int64_t> eval;
  for (const auto& row : rows) {
    EXPECT_EQ(row["eval_status"], "found") << row.dump();
    EXPECT_GT(row["eval_max_batch"].get<std::int64_t>(), row["max_micro_batch"].get<std::int64_t>())
        << row.dump();
    EXPECT_EQ(row["eval_safe_batch"], row["eval_max_batch"]);
    EXPECT_GT(row["eval_trials"].get<int>(), 0);
    eval.push_back(row["eval_max_batch"]);
  }
  EXPECT_GT(eval[1], eval[0]);  // length 64 evaluates a larger batch than 128
  // The answer is the longest length's: its evaluation search is the result's.
  EXPECT_EQ(doc["result"]["eval_max_batch"], eval[0]);
  EXPECT_NE(run.out.find("AUTOBATCH_EVAL_BUCKETS='128:" + std::to_string(eval[0]) +
                         " 64:" + std::to_string(eval[1]) + "'"),
            std::string::npos)
      << run.out;
  // With --env the human report goes to stderr.
  EXPECT_NE(run.err.find("eval max"), std::string::npos) << run.err;
  const std::string at64 = base + "--input 'int64:64:<8000' -q --check-eval-batch ";
  EXPECT_EQ(runCli(at64 + std::to_string(eval[1]), "fits64").exit_code, 0);
  EXPECT_EQ(runCli(at64 + std::to_string(eval[1] + 1), "over64").exit_code, 3);
}

// A sweep sizes evaluation only with --eval; an evaluation job alone, a check, or the result cache
// with it are exit 2 naming the fix. Catches a flag silently ignored in a sweep.
TEST(EvalCliTest, LengthSweepCombinationsAreUsageErrors) {
  const std::string model = modelPath("decoder_lm_small.pt");
  ASSERT_TRUE(fs::exists(model)) << model << " is missing: run scripts/bootstrap.sh";
  const std::string base = "--model " + model +
                           " --device cpu --memory-limit 256MiB --input 'int64:L:<8000' "
                           "--lengths 64,128 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--eval-only", "or sweep with --eval"},
      {"--check-eval-batch 4", "or sweep with --eval"},
      {"--eval --cache", "expected no --cache"},
  };
  for (const auto& [args, message] : cases) {
    const CliRun run = runCli(base + args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << "\n" << run.err;
  }
}

}  // namespace eval_test
}  // namespace
}  // namespace autobatch
