// The result cache around any probe (findMaxBatchThroughCache): LibTorch-free, in the core (the
// Python extension's search goes through it); the runner's front door is cached_search_runner.cpp.
#include "autobatch/workflows/cached_search.h"

#include <array>
#include <chrono>
#include <ctime>
#include <utility>
#include <vector>

#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"
#include "run/workflow_budget.h"

namespace autobatch {
namespace {

using Clock = std::chrono::steady_clock;

std::string utcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::array<char, 32> text{};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text.data();
}

// The confirming trial of a hit (none when trusted), through the search's hooks.
std::optional<TrialResult> confirmHit(const CachedResult& entry, const SearchOptions& options,
                                      const Probe& probe, bool trust) {
  if (trust) return std::nullopt;
  const TrialRequest request = confirmRequest(entry, options, options.micro_batches_per_step);
  if (options.before_trial) options.before_trial(request);
  TrialResult confirm = probe(request);
  if (options.on_trial) options.on_trial(confirm);
  return confirm;
}

// A hit that confirmed (or was trusted): the cached answer.
SearchResult answerHit(const CachedResult& entry, const SearchOptions& options,
                       const std::optional<TrialResult>& confirm, CacheReport& cache,
                       std::vector<std::string> warnings, Clock::time_point start) {
  cache.outcome = "hit";
  cache.trusted = !confirm.has_value();
  cache.stored_at = entry.stored_at;
  cache.cached_trials = entry.trials;
  cache.cached_search_s = entry.search_s;
  SearchResult search = searchResultFromCache(entry, options, confirm);
  search.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  search.warnings = std::move(warnings);
  return search;
}

// A confirming trial that did not confirm: the entry is dropped, unless the trial was interrupted
// (the signal may have come while the model loaded): then it neither confirms nor refutes.
void refuteHit(const CachedResult& entry, const TrialResult& confirm, CacheReport& cache,
               std::vector<std::string>& warnings) {
  if (confirm.cancelled) {
    warnings.push_back("result cache: the confirming trial was interrupted; the entry of " +
                       entry.stored_at + " is kept");
    cache.outcome = "miss";
    return;
  }
  const std::string kept = dropCachedResult(cache.dir, cache.key);
  // A removal that failed (a read-only folder) is said: every later run would repeat the
  // confirming trial that fails.
  warnings.push_back("result cache: the entry of " + entry.stored_at + " did not confirm (batch " +
                     std::to_string(confirm.request.micro_batch_size) + " x " +
                     std::to_string(confirm.request.micro_batches_per_step) + ": " +
                     std::string(toString(confirm.outcome)) + "); " +
                     (kept.empty() ? "dropped it"
                                   : "it could not be dropped (" + kept +
                                         "), so later runs will try it again; remove it or make "
                                         "the folder writable") +
                     " and searched again");
  cache.outcome = "confirm-failed";
}

}  // namespace

SearchResult findMaxBatchThroughCache(const Probe& probe, const SearchOptions& options,
                                      CacheReport& cache, bool trust) {
  if (cache.dir.empty()) throw Error("result cache: expected a folder, but got an empty path");
  const auto start = Clock::now();
  std::vector<std::string> warnings;
  std::optional<TrialResult> failed_confirm;
  if (auto entry = loadCachedResult(cache.dir, cache.key, warnings)) {
    std::optional<TrialResult> confirm = confirmHit(*entry, options, probe, trust);
    if (trust || confirms(*entry, *confirm)) {
      return answerHit(*entry, options, confirm, cache, std::move(warnings), start);
    }
    refuteHit(*entry, *confirm, cache, warnings);
    failed_confirm = confirm;
  } else {
    cache.outcome = "miss";
  }
  SearchResult search = findMaxBatch(probe, options);
  if (failed_confirm) search.trials.insert(search.trials.begin(), *failed_confirm);
  search.warnings.insert(search.warnings.begin(), warnings.begin(), warnings.end());
  if (!cancelled(options)) {
    if (auto stored = cachedResultOf(search, utcNow())) {
      cache.store_error = storeCachedResult(cache.dir, cache.key, *stored);
      if (!cache.store_error.empty()) {
        search.warnings.push_back("result cache: not stored: " + cache.store_error);
      }
    }
  }
  return search;
}

}  // namespace autobatch
