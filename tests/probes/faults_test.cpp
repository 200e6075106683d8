// Faults during a search, on the CPU with the budget allocator: out-of-memory injected at each
// phase of a step (through the allocator's test seam, src/memory/memory_backend.h), a real
// allocator failure under RLIMIT_DATA in a child process, and the caller's module after
// findMaxBatch(). Every search here must end with memory back to its baseline and a result that
// re-checks.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/probes/trial_runner.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/error.h"
#include "memory/memory_backend.h"
#include "support/child_process.h"
#include "support/test_models.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace faults_test {

using detail::TrialPhase;
using detail::TrialPoint;

constexpr std::int64_t kUnlimited = std::int64_t{1} << 40;
constexpr std::int64_t kThreshold = 13;  // injected: batches above it run out of memory

TrainingSpec mlpSpec(OptimizerKind optimizer = OptimizerKind::kAdamW) {
  TrainingSpec spec;
  spec.inputs = parseInputSpecs("16");
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = optimizer;
  return spec;
}

SearchOptions searchOptions(std::int64_t limit_bytes = kUnlimited) {
  SearchOptions o;
  o.memory_limit_bytes = limit_bytes;
  o.max_batch = 64;
  o.margin_bytes = 0;
  return o;
}

// Installs a fault for the test's lifetime.
class Injected {
 public:
  explicit Injected(detail::InjectedFault fault) { detail::setInjectedFault(std::move(fault)); }
  ~Injected() { detail::setInjectedFault({}); }
  Injected(const Injected&) = delete;
  Injected& operator=(const Injected&) = delete;
};

struct Searched {
  SearchResult result;
  std::vector<bool> back_to_baseline;  // after every trial
  std::int64_t baseline_bytes = 0;
};

// The search as findMaxBatch() runs it, with the runner's count read after every trial.
Searched search(TrialRunner& runner, SearchOptions o) {
  Searched s;
  s.baseline_bytes = runner.baselineBytes();
  o.micro_batches_per_step = runner.microBatchesPerTrial();
  const Probe probe = [&](const TrialRequest& request) {
    TrialResult r = runner.run(request);
    s.back_to_baseline.push_back(runner.currentBytes() == runner.baselineBytes());
    return r;
  };
  s.result = findMaxBatch(probe, o);
  return s;
}

void expectBaselineEveryTime(const Searched& s) {
  ASSERT_FALSE(s.back_to_baseline.empty());
  for (std::size_t i = 0; i < s.back_to_baseline.size(); ++i) {
    EXPECT_TRUE(s.back_to_baseline[i]) << "after trial " << i;
  }
}

// The reported max fits when run again, and max + 1 does not (under the same fault).
void expectVerified(TrialRunner& runner, std::int64_t max, int micro = 1) {
  ASSERT_GT(max, 0);
  EXPECT_EQ(runner.run({max, micro, {}}).outcome, TrialOutcome::kFits) << "max " << max;
  const TrialResult above = runner.run({max + 1, micro, {}});
  EXPECT_EQ(above.outcome, TrialOutcome::kOutOfMemory) << "max + 1 = " << max + 1;
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

class PhaseFaultTest : public ::testing::TestWithParam<TrialPhase> {};

TEST_P(PhaseFaultTest, OutOfMemoryInThePhaseIsAResultAndTheSearchFindsTheBoundary) {
  const TrialPhase phase = GetParam();
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  std::vector<std::string> reasons;
  const Injected fault([phase](const TrialPoint& p, std::int64_t) {
    return p.phase == phase && p.micro_batch_size > kThreshold;
  });
  const Searched s = search(runner, searchOptions());
  EXPECT_EQ(s.result.status, SearchStatus::kFound);
  EXPECT_EQ(s.result.max_micro_batch, kThreshold);
  expectBaselineEveryTime(s);
  bool saw_oom = false;
  for (const auto& t : s.result.trials) {
    if (t.outcome != TrialOutcome::kOutOfMemory) continue;
    saw_oom = true;
    EXPECT_GT(t.request.micro_batch_size, kThreshold);
    EXPECT_EQ(t.steps_completed, 0);
    EXPECT_NE(t.reason.find("injected in"), std::string::npos) << t.reason;
  }
  EXPECT_TRUE(saw_oom);
  expectVerified(runner, s.result.max_micro_batch);
}

INSTANTIATE_TEST_SUITE_P(
    EachPhase, PhaseFaultTest,
    ::testing::Values(TrialPhase::kInputs, TrialPhase::kForward, TrialPhase::kLoss,
                      TrialPhase::kBackward, TrialPhase::kOptimizerStep),
    [](const ::testing::TestParamInfo<TrialPhase>& param) {
      switch (param.param) {
        case TrialPhase::kInputs:
          return std::string("Inputs");
        case TrialPhase::kForward:
          return std::string("Forward");
        case TrialPhase::kLoss:
          return std::string("Loss");
        case TrialPhase::kBackward:
          return std::string("Backward");
        case TrialPhase::kOptimizerStep:
          return std::string("OptimizerStep");
        case TrialPhase::kIdle:
        case TrialPhase::kForwardBackward:  // packages: not a TorchScript phase
        case TrialPhase::kCallActivations:
          break;
      }
      return std::string("Idle");
    });

TEST(FaultTest, OutOfMemoryInTheSecondAccumulationMicroBatch) {
  auto m = testing::mlp(16, 32, 8);
  TrainingSpec spec = mlpSpec();
  spec.accumulation_steps = 4;
  TrialRunner runner(m, spec, searchOptions());
  ASSERT_EQ(runner.microBatchesPerTrial(), 2);
  int second_forwards = 0;
  const Injected fault([&second_forwards](const TrialPoint& p, std::int64_t) {
    if (p.phase != TrialPhase::kForward || p.micro_batch_index != 1) return false;
    ++second_forwards;
    return p.micro_batch_size > kThreshold;
  });
  const Searched s = search(runner, searchOptions());
  EXPECT_EQ(s.result.max_micro_batch, kThreshold);
  EXPECT_EQ(s.result.micro_batches_per_step, 2);
  EXPECT_GT(second_forwards, 0);
  expectBaselineEveryTime(s);
  expectVerified(runner, kThreshold, 2);
  // The first micro-batch alone is not what was limited.
  EXPECT_EQ(runner.run({kThreshold + 1, 1, {}}).outcome, TrialOutcome::kFits);
}

TEST(FaultTest, OutOfMemoryInTheVeryFirstTrialIsRecoveredFrom) {
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  // Only the first trial fails (a transient failure), besides the persistent boundary. Binsearch
  // starts above the minimum (guided starts at it, and a minimum that fails means nothing fits).
  const Injected fault([](const TrialPoint& p, std::int64_t) {
    return p.phase == TrialPhase::kForward &&
           (p.trial_index == 0 || p.micro_batch_size > kThreshold);
  });
  SearchOptions o = searchOptions();
  o.strategy = Strategy::kBinsearch;
  o.initial_batch = 4;
  const Searched s = search(runner, o);
  ASSERT_FALSE(s.result.trials.empty());
  EXPECT_EQ(s.result.trials.front().outcome, TrialOutcome::kOutOfMemory);
  expectBaselineEveryTime(s);
  // Never above what the fault allows, and what it reports fits when checked again.
  EXPECT_LE(s.result.max_micro_batch, kThreshold);
  EXPECT_GT(s.result.max_micro_batch, 0);
  EXPECT_EQ(runner.run({s.result.max_micro_batch, 1, {}}).outcome, TrialOutcome::kFits);
}

TEST(FaultTest, OutOfMemoryInTheLastTrialIsRecoveredFrom) {
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  std::size_t trials = 0;
  {
    const Injected fault([](const TrialPoint& p, std::int64_t) {
      return p.phase == TrialPhase::kBackward && p.micro_batch_size > kThreshold;
    });
    trials = search(runner, searchOptions()).result.trials.size();
  }
  ASSERT_GT(trials, 1U);
  // The same search with its last trial failing too: it goes on or stops, never past the fault.
  // Trial indices count per runner: the second search's trials start at `trials`.
  const int last = 2 * static_cast<int>(trials) - 1;
  const Injected fault([last](const TrialPoint& p, std::int64_t) {
    return p.phase == TrialPhase::kBackward &&
           (p.trial_index == last || p.micro_batch_size > kThreshold);
  });
  const Searched s = search(runner, searchOptions());
  expectBaselineEveryTime(s);
  ASSERT_GE(s.result.trials.size(), trials);
  EXPECT_EQ(s.result.trials[trials - 1].outcome, TrialOutcome::kOutOfMemory);
  EXPECT_GT(s.result.max_micro_batch, 0);
  EXPECT_LE(s.result.max_micro_batch, kThreshold);
  EXPECT_EQ(runner.run({s.result.max_micro_batch, 1, {}}).outcome, TrialOutcome::kFits);
}

TEST(FaultTest, ModelErrorAtOneBatchEndsTheSearchAsThatError) {
  auto m = testing::newModule("Raises37");
  m.register_parameter("w", torch::randn({16, 8}).requires_grad_(), false);
  m.define(R"(
    def forward(self, x):
        assert x.size(0) != 37, "batch of 37 is cursed"
        return torch.matmul(x, self.w)
  )");
  SearchOptions o = searchOptions();
  o.min_batch = 30;
  o.max_batch = 40;
  o.strategy = Strategy::kBinsearch;
  o.initial_batch = 37;
  try {
    (void)findMaxBatch(m, mlpSpec(), o);
    FAIL() << "expected the model's error";
  } catch (const Error& e) {
    FAIL() << "a model error must not become an autobatch::Error: " << e.what();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("batch of 37 is cursed"), std::string::npos) << e.what();
  }
}

// Installs an injected library error (c10::Error with a given text) for the test's lifetime.
class InjectedLibraryError {
 public:
  explicit InjectedLibraryError(detail::InjectedError error) {
    detail::setInjectedError(std::move(error));
  }
  ~InjectedLibraryError() { detail::setInjectedError({}); }
  InjectedLibraryError(const InjectedLibraryError&) = delete;
  InjectedLibraryError& operator=(const InjectedLibraryError&) = delete;
};

// cuDNN's v8 API swallows an OutOfMemoryError while trying plans and reports this instead.
constexpr const char* kNoEngine = "GET was unable to find an engine to execute this computation";

// An ambiguous library failure above the boundary is decided by evidence: the largest batch seen
// to fit is re-run with the cache emptied (a trial of its own, listed before the failure), it
// fits, so the failure is out of memory and the search goes on to the exact boundary. Catches a
// runner that rethrows it (the search ends in exit 1 on a plain OOM in disguise) and one that
// calls it out of memory without evidence (hides real install faults: the next test).
TEST(FaultTest, AmbiguousFailureThatARerunClearsIsOutOfMemory) {
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  const InjectedLibraryError error([](const TrialPoint& p, std::int64_t) {
    return p.phase == TrialPhase::kForward && p.micro_batch_size > kThreshold ? kNoEngine : "";
  });
  const Searched s = search(runner, searchOptions());
  EXPECT_EQ(s.result.status, SearchStatus::kFound);
  EXPECT_EQ(s.result.max_micro_batch, kThreshold);
  expectBaselineEveryTime(s);
  int reruns = 0;
  for (std::size_t i = 0; i < s.result.trials.size(); ++i) {
    const TrialResult& t = s.result.trials[i];
    if (t.reason.rfind("re-run to classify: ", 0) != 0) continue;
    ++reruns;
    EXPECT_EQ(t.outcome, TrialOutcome::kFits);
    EXPECT_LE(t.request.micro_batch_size, kThreshold);
    ASSERT_LT(i + 1, s.result.trials.size());
    const TrialResult& failed = s.result.trials[i + 1];
    EXPECT_EQ(failed.outcome, TrialOutcome::kOutOfMemory);
    EXPECT_GT(failed.request.micro_batch_size, kThreshold);
    EXPECT_NE(failed.reason.find(kNoEngine), std::string::npos) << failed.reason;
    EXPECT_NE(failed.reason.find("fit when re-run with the cache emptied"), std::string::npos)
        << failed.reason;
  }
  EXPECT_GE(reruns, 1);
}

// The same text at every batch, the smallest included, after one batch fitted: the re-run fails
// too, so it is the model's or the install's error and leaves unchanged (exit 1 in the CLI), never
// "does not fit". Catches a runner that maps every such text to out of memory.
TEST(FaultTest, AmbiguousFailureThatPersistsInTheRerunIsTheModelsError) {
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  ASSERT_EQ(runner.run({4, 1, {}}).outcome, TrialOutcome::kFits);
  const InjectedLibraryError error([](const TrialPoint& p, std::int64_t) {
    return p.phase == TrialPhase::kForward ? kNoEngine : "";
  });
  try {
    (void)runner.run({8, 1, {}});
    FAIL() << "expected the library's error";
  } catch (const Error& e) {
    FAIL() << "must leave unchanged, not as autobatch::Error: " << e.what();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(kNoEngine), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

// Nothing has fitted yet: there is no batch to re-run, and the failing batch is the smallest
// tried: out of memory, and "nothing fits" names the message.
TEST(FaultTest, AmbiguousFailureBeforeAnyFitIsOutOfMemoryNamingTheMessage) {
  auto m = testing::mlp(16, 32, 8);
  TrialRunner runner(m, mlpSpec(), searchOptions());
  const InjectedLibraryError error([](const TrialPoint& p, std::int64_t) {
    return p.phase == TrialPhase::kForward ? kNoEngine : "";
  });
  const TrialResult r = runner.run({1, 1, {}});
  EXPECT_EQ(r.outcome, TrialOutcome::kOutOfMemory);
  EXPECT_NE(r.reason.find(kNoEngine), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("nothing has fitted yet"), std::string::npos) << r.reason;
  EXPECT_EQ(r.classification_rerun, nullptr);
}

std::vector<torch::Tensor> stateOf(torch::jit::Module& m) {
  std::vector<torch::Tensor> state;
  for (const auto& p : m.parameters()) state.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) state.push_back(b.detach().clone());
  return state;
}

TEST(FaultTest, CallersModuleIsUnchangedAfterFindMaxBatch) {
  for (const bool training : {true, false}) {
    auto m = testing::convNet(8);
    m.train(training);
    const auto before = stateOf(m);
    TrainingSpec spec;
    spec.inputs = parseInputSpecs("3x16x16");
    spec.loss = LossKind::kCrossEntropy;
    std::int64_t baseline_before = 0;
    { baseline_before = TrialRunner(m, spec, searchOptions()).baselineBytes(); }
    SearchOptions o = searchOptions(baseline_before + (std::int64_t{24} << 20));
    o.max_batch = 0;
    const MaxBatchResult r = findMaxBatch(m, spec, o);
    EXPECT_EQ(r.search.status, SearchStatus::kFound);
    EXPECT_GT(r.search.max_micro_batch, 1);
    EXPECT_EQ(m.is_training(), training);
    const auto after = stateOf(m);
    ASSERT_EQ(after.size(), before.size());
    for (std::size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(torch::equal(after[i], before[i])) << "tensor " << i;
    }
    for (const auto& p : m.parameters()) EXPECT_FALSE(p.grad().defined());
    // Nothing the search allocated is still counted: a new runner starts from the same bytes.
    EXPECT_EQ(TrialRunner(m, spec, searchOptions()).baselineBytes(), baseline_before);
    // And the launcher can train right away.
    const auto out = m.forward({torch::randn({4, 3, 16, 16})}).toTensor();
    EXPECT_EQ(out.size(0), 4);
  }
}

// A real allocator failure: this binary re-runs itself with RLIMIT_DATA set and the budget out of
// the way, so the default CPU allocator (oneDNN convolutions included) fails; a whole search must
// complete with a size that fits when checked again.
// The model, input and cap both child processes below use.
constexpr std::int64_t kChildDataHeadroom = std::int64_t{384} << 20;
TrainingSpec childSpec() {
  TrainingSpec spec;
  spec.inputs = parseInputSpecs("3x32x32");
  spec.loss = LossKind::kCrossEntropy;
  return spec;
}
SearchOptions childOptions() {
  SearchOptions o;
  o.memory_limit_bytes = kUnlimited;  // the budget never refuses: the real allocator does
  o.margin_bytes = 0;
  o.max_batch = 2048;
  return o;
}

TEST(FaultChildTest, SearchUnderRlimitDataWithOneDnn) {
  if (std::getenv("AUTOBATCH_FAULT_CHILD") == nullptr) GTEST_SKIP() << "run by the parent test";
  ASSERT_TRUE(at::globalContext().userEnabledMkldnn());
  // One malloc arena: each thread's arena reserves up to 64 MiB of address space that RLIMIT_DATA
  // counts, and how many threads made one depends on scheduling.
  ASSERT_EQ(mallopt(M_ARENA_MAX, 1), 1);
  ASSERT_TRUE(testing::capDataSegment(kChildDataHeadroom));
  auto m = testing::plainConvNet(32);
  const MaxBatchResult r = findMaxBatch(m, childSpec(), childOptions());
  int ooms = 0;
  for (const auto& t : r.search.trials) {
    std::cout << "child: B=" << t.request.micro_batch_size << " " << toString(t.outcome) << " "
              << t.reason << "\n";
    if (t.outcome == TrialOutcome::kOutOfMemory) ++ooms;
  }
  EXPECT_EQ(r.search.status, SearchStatus::kFound);
  EXPECT_GT(ooms, 0);
  ASSERT_GT(r.search.max_micro_batch, 16);
  EXPECT_LT(r.search.max_micro_batch, 2048);
  std::cout << "child: max_micro_batch=" << r.search.max_micro_batch << "\n";
}

// The found batch, in a fresh process under the same cap, as the user's job runs it. Not in the
// searching process: there real memory is less than it was (glibc keeps freed pages, oneDNN caches
// a primitive per shape tried), and CI saw 3/4 of the maximum fail there with oneDNN's "could not
// create a primitive" after the search.
TEST(FaultChildTest, FreshProcessFitsTheFoundBatch) {
  const char* batch_text = std::getenv("AUTOBATCH_FAULT_CHECK_BATCH");
  if (batch_text == nullptr) GTEST_SKIP() << "run by the parent test";
  ASSERT_EQ(mallopt(M_ARENA_MAX, 1), 1);
  ASSERT_TRUE(testing::capDataSegment(kChildDataHeadroom));
  auto m = testing::plainConvNet(32);
  TrialRunner runner(m, childSpec(), childOptions());
  const TrialResult t = runner.run({std::stoll(batch_text), 1, {}});
  EXPECT_EQ(t.outcome, TrialOutcome::kFits) << t.reason;
  EXPECT_EQ(runner.currentBytes(), runner.baselineBytes());
}

// Catches a search that takes a real allocator failure for a model error (the search throws), or
// that reports a batch it never saw fit (the fresh process fails it).
TEST(FaultTest, SearchUnderARealAllocatorFailureInAChildProcess) {
  std::string output;
  testing::expectChildPasses("AUTOBATCH_FAULT_CHILD",
                             "FaultChildTest.SearchUnderRlimitDataWithOneDnn", "1", &output);
  const std::string key = "child: max_micro_batch=";
  const std::size_t at = output.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::string batch = output.substr(at + key.size(), output.find('\n', at) - at - key.size());
  testing::expectChildPasses("AUTOBATCH_FAULT_CHECK_BATCH",
                             "FaultChildTest.FreshProcessFitsTheFoundBatch", batch);
}

}  // namespace faults_test
}  // namespace
}  // namespace autobatch
