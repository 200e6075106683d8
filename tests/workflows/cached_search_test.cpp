// findMaxBatchCached (autobatch/workflows/cached_search.h) on a tiny TorchScript MLP under the CPU
// budget allocator, with a result folder of the test's own; no CLI.
#include "autobatch/workflows/cached_search.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace cached_search_test {

namespace fs = std::filesystem;

fs::path freshDir(const std::string& name) {
  fs::path dir = fs::path(AUTOBATCH_TEST_TMP) / "cached_search" /
                 (name + "-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

// float32 [batch, 64] -> [batch, 10], saved without metadata.
std::string mlpModel(const fs::path& dir) {
  const fs::path path = dir / "mlp.pt";
  torch::manual_seed(0);
  torch::jit::Module net("Mlp");
  net.register_parameter("w1", torch::randn({64, 256}).requires_grad_(), false);
  net.register_parameter("w2", torch::randn({256, 10}).requires_grad_(), false);
  net.define(R"(
    def forward(self, x):
        return torch.matmul(torch.relu(torch.matmul(x, self.w1)), self.w2)
  )");
  net.save(path.string());
  return path.string();
}

struct CacheCase {
  fs::path dir;
  TrainingSpec spec;
  SearchOptions options;
  ResultCacheOptions cache;
};

CacheCase newCase(const std::string& name) {
  CacheCase s;
  s.dir = freshDir(name);
  s.spec.model_path = mlpModel(s.dir);
  s.spec.inputs = parseInputSpecs("64");
  s.spec.loss = LossKind::kCrossEntropy;
  s.spec.device = "cpu";
  s.options.memory_limit_bytes = 16LL << 20;
  s.cache.dir = (s.dir / "results").string();
  return s;
}

std::string field(const CacheKey& key, const std::string& name) {
  for (const auto& [n, v] : key.fields) {
    if (n == name) return v;
  }
  return "<missing>";
}

// A miss searches and stores; the same call again answers from the entry with one confirming
// trial at the cached safe batch; trusted, with none. Catches a cache that searches every time,
// that answers a hit with a different batch, that skips the confirming trial (or runs it without
// the hooks), and that reports the runner's facts after the trials instead of before.
TEST(CachedSearchTest, AMissStoresAndTheSameSearchThenHitsWithOneTrial) {
  CacheCase s = newCase("hit");
  std::vector<std::string> events;
  s.options.before_trial = [&](const TrialRequest& r) {
    events.push_back("trial " + std::to_string(r.micro_batch_size));
  };
  s.cache.on_setup = [&](const MaxBatchResult& facts) {
    events.push_back("setup " + std::to_string(facts.context.memory_limit_bytes > 0));
    EXPECT_TRUE(facts.search.trials.empty());
  };
  const CachedSearchResult miss = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(miss.cache.outcome, "miss");
  EXPECT_EQ(miss.cache.dir, s.cache.dir);
  EXPECT_EQ(miss.cache.key.hash.size(), 40U);
  EXPECT_EQ(miss.cache.store_error, "");
  EXPECT_TRUE(fs::exists(cacheEntryPath(s.cache.dir, miss.cache.key)));
  EXPECT_EQ(miss.result.search.status, SearchStatus::kFound);
  const std::int64_t safe = miss.result.search.safe_micro_batch;
  ASSERT_GT(safe, 1);
  ASSERT_GT(miss.result.search.trials.size(), 2U);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front(), "setup 1");
  EXPECT_EQ(events.size(), miss.result.search.trials.size() + 1);

  events.clear();
  const CachedSearchResult hit = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(hit.cache.outcome, "hit");
  EXPECT_FALSE(hit.cache.trusted);
  EXPECT_EQ(hit.cache.key.hash, miss.cache.key.hash);
  EXPECT_EQ(hit.cache.cached_trials, static_cast<int>(miss.result.search.trials.size()));
  EXPECT_FALSE(hit.cache.stored_at.empty());
  EXPECT_EQ(hit.result.search.safe_micro_batch, safe);
  EXPECT_EQ(hit.result.search.max_micro_batch, miss.result.search.max_micro_batch);
  ASSERT_EQ(hit.result.search.trials.size(), 1U);
  EXPECT_EQ(hit.result.search.trials[0].request.micro_batch_size, safe);
  EXPECT_EQ(events, (std::vector<std::string>{"setup 1", "trial " + std::to_string(safe)}));

  s.cache.trust = true;
  const CachedSearchResult trusted = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(trusted.cache.outcome, "hit");
  EXPECT_TRUE(trusted.cache.trusted);
  EXPECT_TRUE(trusted.result.search.trials.empty());
  EXPECT_EQ(trusted.result.search.safe_micro_batch, safe);
}

// An entry whose batch no longer fits (edited here to 10^6 samples) fails its confirming trial:
// it is dropped, the search runs again on the same runner and stores the right answer. Catches a
// cache that trusts a failed confirmation, loses the failed trial, or keeps the bad entry.
TEST(CachedSearchTest, AnEntryThatDoesNotConfirmIsDroppedAndSearchedAgain) {
  CacheCase s = newCase("refute");
  const CachedSearchResult miss = findMaxBatchCached(s.spec, s.options, s.cache);
  const std::int64_t safe = miss.result.search.safe_micro_batch;
  const std::string entry_path = cacheEntryPath(s.cache.dir, miss.cache.key);
  std::stringstream text;
  text << std::ifstream(entry_path).rdbuf();
  nlohmann::json entry = nlohmann::json::parse(text.str());
  entry["max_micro_batch"] = 1000000;
  entry["safe_micro_batch"] = 1000000;
  std::ofstream(entry_path) << entry.dump();

  const CachedSearchResult again = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(again.cache.outcome, "confirm-failed");
  ASSERT_GE(again.result.search.trials.size(), 2U);
  EXPECT_EQ(again.result.search.trials[0].request.micro_batch_size, 1000000);
  EXPECT_EQ(again.result.search.trials[0].outcome, TrialOutcome::kOutOfMemory);
  EXPECT_EQ(again.result.search.safe_micro_batch, safe);
  ASSERT_FALSE(again.result.search.warnings.empty());
  EXPECT_NE(again.result.search.warnings[0].find("did not confirm (batch 1000000 x 1: "),
            std::string::npos)
      << again.result.search.warnings[0];
  std::vector<std::string> warnings;
  const auto stored = loadCachedResult(s.cache.dir, miss.cache.key, warnings);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->safe_micro_batch, safe);
}

// The key is what the answer depends on: it names the inputs, another bound is another entry, and
// the model's SHA-1 is read from the file when not given (else the one given). Catches a key
// without the search's options (a hit for another bound) and one with an empty fingerprint
// (every model would share the entry).
TEST(CachedSearchTest, TheKeyNamesTheInputsAndTheModelsFingerprint) {
  CacheCase s = newCase("key");
  const CachedSearchResult first = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(field(first.cache.key, "inputs"), "float32:64");
  EXPECT_EQ(field(first.cache.key, "model_sha1"), fileSha1(s.spec.model_path));
  EXPECT_EQ(field(first.cache.key, "model_file_bytes"),
            std::to_string(fs::file_size(s.spec.model_path)));
  EXPECT_EQ(field(first.cache.key, "memory_limit_bytes"), std::to_string(16LL << 20));

  s.options.max_batch = first.result.search.safe_micro_batch / 2;
  const CachedSearchResult bounded = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(bounded.cache.outcome, "miss");
  EXPECT_NE(bounded.cache.key.hash, first.cache.key.hash);

  s.cache.model_sha1 = std::string(40, 'a');
  s.cache.model_file_bytes = 7;
  const CachedSearchResult given = findMaxBatchCached(s.spec, s.options, s.cache);
  EXPECT_EQ(given.cache.outcome, "miss");
  EXPECT_EQ(field(given.cache.key, "model_sha1"), std::string(40, 'a'));
  EXPECT_EQ(field(given.cache.key, "model_file_bytes"), "7");
}

// Catches a cached search that silently writes into the working directory.
TEST(CachedSearchTest, AnEmptyFolderIsAnError) {
  CacheCase s = newCase("empty");
  s.cache.dir.clear();
  try {
    (void)findMaxBatchCached(s.spec, s.options, s.cache);
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "result cache: expected a folder, but got an empty path");
  }
}

}  // namespace cached_search_test
}  // namespace
}  // namespace autobatch
