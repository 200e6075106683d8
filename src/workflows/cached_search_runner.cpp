// findMaxBatchCached: the result cache in front of a trial runner (the CLI's --cache); the probe
// part, LibTorch-free, is cached_search.cpp.
#include <chrono>
#include <filesystem>
#include <utility>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/workflows/cached_search.h"

namespace autobatch {
namespace {

using Clock = std::chrono::steady_clock;

// The key of this run: what the answer depends on, from the set-up runner's facts.
CacheKey cacheKeyOf(const TrainingSpec& spec, const SearchOptions& options,
                    const ResultCacheOptions& cache, const TrialRunner& runner) {
  ReportData data;
  data.spec = spec;
  data.options = options;
  data.build = cache.build ? *cache.build : buildInfo();
  data.model_sha1 = cache.model_sha1;
  data.model_file_bytes = cache.model_file_bytes;
  if (data.model_sha1.empty()) {
    data.model_file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(spec.model_path));
    data.model_sha1 = fileSha1(spec.model_path);
  }
  data.result = runnerFacts(runner);
  CacheKey key = cacheKeyFields(data);
  key.hash = sha1Hex(key.canonicalText());
  return key;
}

}  // namespace

CachedSearchResult findMaxBatchCached(const TrainingSpec& spec, const SearchOptions& options,
                                      const ResultCacheOptions& cache_options) {
  if (cache_options.dir.empty()) {
    throw Error("result cache: expected a folder, but got an empty path");
  }
  const auto start = Clock::now();
  TrialRunner runner(spec, options);
  if (cache_options.on_setup) cache_options.on_setup(runnerFacts(runner));
  CacheReport cache;
  cache.dir = cache_options.dir;
  cache.key = cacheKeyOf(spec, options, cache_options, runner);
  SearchResult search = findMaxBatchThroughCache(
      runner.probe(), runnerSearchOptions(runner, options), cache, cache_options.trust);
  // The runner's facts after the trials: the optimizer's state exists once a step ran.
  CachedSearchResult out{runnerFacts(runner), std::move(cache)};
  out.result.search = std::move(search);
  if (out.cache.outcome == "hit") {  // this call's wall time, the runner's set-up included
    out.result.search.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return out;
}

}  // namespace autobatch
