// The trial verdict table (tests/fixtures/trial_verdicts.json) replayed against the C++ door:
// each case's trials run in order on one TrialRunner over an MLP on the CPU under the budget
// allocator, with the allocator's test seams (src/memory/memory_backend.h) making what the case
// scripts: an injected fault (c10::OutOfMemoryError) for a trial that ran out of memory, an
// injected library error (c10::Error with the case's text) for the failing trial and a failing
// re-run, and the process limit's answer. The Python door replays the same table
// (tests/python/test_verdicts.py); both call the one rule, TrialEvidence
// (src/probes/trial_evidence.h). Each case names the wrong rule it catches in its "catches".
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "autobatch/probes/trial_runner.h"
#include "memory/memory_backend.h"
#include "support/test_models.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace trial_verdicts_test {

using detail::TrialPhase;
using detail::TrialPoint;

nlohmann::json table() {
  std::ifstream in(std::string(AUTOBATCH_TEST_FIXTURES) + "/trial_verdicts.json");
  return nlohmann::json::parse(in);
}

// x [B, 16] -> [B, 4], holding `hold` bytes (a float tensor) first when the batch is
// `hold_batch`: the failing trial's extra peak, as the Python door's scripted model holds it.
torch::jit::Module holdingMlp(std::int64_t hold, std::int64_t hold_batch) {
  torch::manual_seed(0);
  auto m = testing::newModule("HoldingMlp");
  testing::param(m, "w1", torch::randn({16, 16}) * 0.1);
  testing::param(m, "w2", torch::randn({16, 4}) * 0.1);
  m.register_attribute("hold", c10::IntType::get(), hold);
  m.register_attribute("hold_batch", c10::IntType::get(), hold_batch);
  m.define(R"(
    def forward(self, x):
        held = torch.zeros([1])
        if x.size(0) == self.hold_batch and self.hold > 0:
            held = torch.ones([self.hold // 4])
        return torch.matmul(torch.tanh(torch.matmul(x, self.w1)), self.w2) + held.sum() * 0
  )");
  return m;
}

// What the allocator does in a trial, by the case's order (the trials before, the failing trial,
// the re-run): nothing, run out of memory, or raise a library error in forward.
struct Action {
  bool oom = false;
  std::string raise;
};

// Installs the three seams for the test's lifetime.
class Scripted {
 public:
  Scripted(std::map<int, Action> actions, std::int64_t hold, const nlohmann::json& limit)
      : actions_(std::move(actions)) {
    detail::setInjectedFault([this](const TrialPoint& p, std::int64_t) {
      const auto it = actions_.find(p.trial_index);
      return it != actions_.end() && it->second.oom && p.phase == TrialPhase::kForward;
    });
    // In forward, at the second allocation, the held tensor (`hold` bytes) not counted: after
    // the held tensor or its 4-byte stand-in.
    detail::setInjectedError([this, hold](const TrialPoint& p, std::int64_t bytes) {
      const auto it = actions_.find(p.trial_index);
      if (it == actions_.end() || it->second.raise.empty() || p.phase != TrialPhase::kForward ||
          bytes == hold) {
        return std::string();
      }
      if (p.trial_index != counted_trial_) {
        counted_trial_ = p.trial_index;
        forward_allocations_ = 0;
      }
      return ++forward_allocations_ >= 2 ? it->second.raise : std::string();
    });
    if (limit.is_null()) {
      detail::setInjectedProcessLimit([](std::int64_t, std::int64_t) { return false; });
    } else {
      const auto at_peak = limit.at("near_at_peak").get<std::int64_t>();
      detail::setInjectedProcessLimit([at_peak](std::int64_t peak, std::int64_t request) {
        return request > 0 || peak >= at_peak;
      });
    }
  }
  ~Scripted() {
    detail::setInjectedFault({});
    detail::setInjectedError({});
    detail::setInjectedProcessLimit({});
  }
  Scripted(const Scripted&) = delete;
  Scripted& operator=(const Scripted&) = delete;

 private:
  std::map<int, Action> actions_;
  int counted_trial_ = -1;
  int forward_allocations_ = 0;
};

std::map<int, Action> script(const nlohmann::json& c) {
  std::map<int, Action> actions;
  const auto& before = c.at("before");
  for (std::size_t i = 0; i < before.size(); ++i) {
    actions[static_cast<int>(i)].oom = before[i][1].get<std::string>() == "out-of-memory";
  }
  const int failing = static_cast<int>(before.size());
  actions[failing].raise = c.at("trial").at("message").get<std::string>();
  const auto& rerun = c.at("rerun");
  if (!rerun.is_null() && rerun.at("does") != "fits") {
    if (rerun.at("does") == "out-of-memory") {
      actions[failing + 1].oom = true;
    } else {
      actions[failing + 1].raise = rerun.at("message").get<std::string>();
    }
  }
  return actions;
}

TEST(TrialVerdictsTest, TheCppDoorGivesTheTablesVerdict) {
  const nlohmann::json cases = table().at("cases");
  ASSERT_GE(cases.size(), 10U);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const auto& trial = c.at("trial");
    const auto& expect = c.at("expect");
    const auto hold = trial.at("hold_bytes").get<std::int64_t>();
    const auto batch = trial.at("micro_batch").get<std::int64_t>();
    auto model = holdingMlp(hold, batch);
    TrainingSpec spec;
    spec.inputs = parseInputSpecs("16");
    spec.loss = LossKind::kCrossEntropy;
    spec.optimizer = OptimizerKind::kSgd;
    SearchOptions options;
    options.memory_limit_bytes = std::int64_t{256} << 20;
    TrialRunner runner(model, spec, options);
    const Scripted scripted(script(c), hold, c.at("process_limit"));
    std::ostringstream logged;
    const auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logged);
    spdlog::default_logger()->sinks().push_back(sink);
    for (const auto& before : c.at("before")) {
      const TrialResult r = runner.run({before[0].get<std::int64_t>(), 1, {}});
      EXPECT_EQ(toString(r.outcome), before[1].get<std::string>());
    }
    const std::string verdict = expect.at("verdict").get<std::string>();
    const std::string text = expect.at("text").get<std::string>();
    TrialResult r;
    if (verdict == "rethrow") {
      try {
        (void)runner.run({batch, 1, {}});
        ADD_FAILURE() << "expected the library's error to leave";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      }
    } else {
      r = runner.run({batch, 1, {}});
      EXPECT_EQ(toString(r.outcome), verdict) << r.reason;
      EXPECT_NE(r.reason.find(text), std::string::npos) << r.reason;
    }
    spdlog::default_logger()->sinks().pop_back();
    if (expect.at("warning").is_null()) {
      EXPECT_EQ(logged.str().find("re-run"), std::string::npos) << logged.str();
    } else {
      EXPECT_NE(logged.str().find(expect.at("warning").get<std::string>()), std::string::npos)
          << logged.str();
    }
    if (expect.at("rerun_micro_batch").is_null()) {
      EXPECT_EQ(r.classification_rerun, nullptr);
    } else {
      ASSERT_NE(r.classification_rerun, nullptr);
      EXPECT_EQ(r.classification_rerun->request.micro_batch_size,
                expect.at("rerun_micro_batch").get<std::int64_t>());
      EXPECT_EQ(r.classification_rerun->reason.rfind("re-run to classify: ", 0), 0U)
          << r.classification_rerun->reason;
    }
  }
}

}  // namespace trial_verdicts_test
}  // namespace
}  // namespace autobatch
