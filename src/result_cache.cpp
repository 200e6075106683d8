#include "autobatch/result_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>

#include "autobatch/error.h"
#include "autobatch/planner.h"

namespace autobatch {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json toJson(const CacheKey& key, const CachedResult& r) {
  json fields = json::object();
  for (const auto& [name, value] : key.fields) fields[name] = value;
  return {{"schema_version", 1},
          {"key", key.hash},
          {"fields", fields},
          {"stored_at", r.stored_at},
          {"status", r.status},
          {"max_micro_batch", r.max_micro_batch},
          {"safe_micro_batch", r.safe_micro_batch},
          {"memory_limit_bytes", r.memory_limit_bytes},
          {"margin_bytes", r.margin_bytes},
          {"capped_by", r.capped_by},
          {"accumulation_max_micro_batch", r.accumulation_max_micro_batch},
          {"trials", r.trials},
          {"search_s", r.search_s}};
}

}  // namespace

std::string CacheKey::canonicalText() const {
  std::string text;
  for (const auto& [name, value] : fields) text += name + "=" + value + "\n";
  return text;
}

std::string defaultCacheDir(const EnvLookup& env) {
  if (auto dir = env("AUTOBATCH_CACHE_DIR"); dir && !dir->empty()) return *dir;
  if (auto xdg = env("XDG_CACHE_HOME"); xdg && !xdg->empty()) return *xdg + "/autobatch/results";
  if (auto home = env("HOME"); home && !home->empty()) return *home + "/.cache/autobatch/results";
  throw Error(
      "--cache: expected AUTOBATCH_CACHE_DIR, XDG_CACHE_HOME or HOME to name a folder for the "
      "result cache, but none is set; set AUTOBATCH_CACHE_DIR");
}

std::string cacheEntryPath(const std::string& dir, const CacheKey& key) {
  return (fs::path(dir) / (key.hash + ".json")).string();
}

std::optional<CachedResult> loadCachedResult(const std::string& dir, const CacheKey& key,
                                             std::vector<std::string>& warnings) {
  const std::string path = cacheEntryPath(dir, key);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open it");
    const json doc = json::parse(in);
    CachedResult r;
    r.key = doc.at("key").get<std::string>();
    if (r.key != key.hash) throw std::runtime_error("it holds key " + r.key);
    for (const auto& [name, value] : key.fields) {
      if (doc.at("fields").at(name).get<std::string>() != value) {
        throw std::runtime_error("its field " + name + " differs");
      }
    }
    r.stored_at = doc.at("stored_at").get<std::string>();
    r.status = doc.at("status").get<std::string>();
    r.max_micro_batch = doc.at("max_micro_batch").get<std::int64_t>();
    r.safe_micro_batch = doc.at("safe_micro_batch").get<std::int64_t>();
    r.memory_limit_bytes = doc.at("memory_limit_bytes").get<std::int64_t>();
    r.margin_bytes = doc.at("margin_bytes").get<std::int64_t>();
    r.capped_by = doc.at("capped_by").get<std::string>();
    r.accumulation_max_micro_batch = doc.at("accumulation_max_micro_batch").get<std::int64_t>();
    r.trials = doc.at("trials").get<int>();
    r.search_s = doc.at("search_s").get<double>();
    if (r.safe_micro_batch < 1 || r.max_micro_batch < r.safe_micro_batch) {
      throw std::runtime_error("its batch sizes are invalid");
    }
    return r;
  } catch (const std::exception& e) {
    warnings.push_back("result cache: ignoring the unreadable entry " + path + " (" + e.what() +
                       "); searching instead");
    return std::nullopt;
  }
}

std::string storeCachedResult(const std::string& dir, const CacheKey& key,
                              const CachedResult& result) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return "cannot create " + dir + ": " + ec.message();
  // Unique within the folder: the pid, and a random suffix for several stores in one process.
  static std::atomic<unsigned> counter{0};
  std::random_device random;
  const std::string tmp =
      (fs::path(dir) / ("." + key.hash + "." + std::to_string(::getpid()) + "." +
                        std::to_string(random()) + "." + std::to_string(counter++) + ".tmp"))
          .string();
  {
    std::ofstream out(tmp);
    out << toJson(key, result).dump(2) << "\n";
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return "cannot write " + tmp;
    }
  }
  fs::rename(tmp, cacheEntryPath(dir, key), ec);
  if (ec) {
    fs::remove(tmp, ec);
    return "cannot rename " + tmp + " to " + cacheEntryPath(dir, key) + ": " + ec.message();
  }
  return "";
}

std::optional<CachedResult> cachedResultOf(const SearchResult& search,
                                           const std::string& stored_at) {
  if (search.status != SearchStatus::kFound || search.safe_micro_batch < 1) return std::nullopt;
  CachedResult r;
  r.stored_at = stored_at;
  r.status = std::string(toString(search.status));
  r.max_micro_batch = search.max_micro_batch;
  r.safe_micro_batch = search.safe_micro_batch;
  r.memory_limit_bytes = search.memory_limit_bytes;
  r.margin_bytes = search.margin_bytes;
  r.capped_by = search.capped_by;
  r.trials = static_cast<int>(search.trials.size());
  r.search_s = search.elapsed_s;
  for (const auto& t : search.trials) {
    if (t.request.micro_batches_per_step == 2 && t.outcome == TrialOutcome::kFits && !t.cancelled &&
        (search.memory_limit_bytes <= 0 ||
         t.peak_bytes <= search.memory_limit_bytes - search.margin_bytes)) {
      r.accumulation_max_micro_batch =
          std::max(r.accumulation_max_micro_batch, t.request.micro_batch_size);
    }
  }
  return r;
}

std::optional<AccumulationPlans> cachedPlan(const CachedResult& entry,
                                            const SearchOptions& options) {
  if (options.target_batch <= 0) return std::nullopt;
  std::int64_t max_micro = entry.safe_micro_batch;
  const std::int64_t per_rank = options.target_batch / options.world_size;
  if (per_rank > max_micro && entry.accumulation_max_micro_batch > 0) {
    max_micro = std::min(max_micro, entry.accumulation_max_micro_batch);
  }
  return planAccumulation(max_micro, options.target_batch, options.world_size, options.plan);
}

namespace {
std::int64_t largestOf(const AccumulationPlans& p) {
  return std::max(p.uniform.largestMicroBatch(), p.balanced.largestMicroBatch());
}
}  // namespace

TrialRequest confirmRequest(const CachedResult& entry, const SearchOptions& options,
                            int micro_batches_per_trial) {
  TrialRequest request;
  request.micro_batch_size = entry.safe_micro_batch;
  request.micro_batches_per_step = micro_batches_per_trial;
  request.cancel = options.cancel;
  const auto plan = cachedPlan(entry, options);
  if (plan && plan->primary().accumulation_steps > 1 && micro_batches_per_trial == 1) {
    request.micro_batch_size = largestOf(*plan);
    request.micro_batches_per_step = 2;
  }
  return request;
}

bool confirms(const CachedResult& entry, const TrialResult& trial) {
  if (trial.outcome != TrialOutcome::kFits || trial.cancelled) return false;
  const std::int64_t limit =
      trial.memory_limit_bytes > 0 ? trial.memory_limit_bytes : entry.memory_limit_bytes;
  return limit <= 0 || trial.peak_bytes <= limit - entry.margin_bytes;
}

SearchResult searchResultFromCache(const CachedResult& entry, const SearchOptions& options,
                                   const std::optional<TrialResult>& confirm) {
  SearchResult r;
  r.status = SearchStatus::kFound;
  r.max_micro_batch = entry.max_micro_batch;
  r.safe_micro_batch = entry.safe_micro_batch;
  r.micro_batches_per_step = options.micro_batches_per_step;
  r.memory_limit_bytes = entry.memory_limit_bytes;
  r.margin_bytes = entry.margin_bytes;
  r.capped_by = entry.capped_by;
  if (confirm) r.trials.push_back(*confirm);
  r.plan = cachedPlan(entry, options);
  if (r.plan) {
    r.plan_max_micro_batch = r.plan->max_micro_batch;
    const std::int64_t largest = largestOf(*r.plan);
    r.plan_verified = r.plan->primary().accumulation_steps == 1 ||
                      options.micro_batches_per_step == 2 ||
                      largest <= entry.accumulation_max_micro_batch ||
                      (confirm && confirm->request.micro_batches_per_step == 2 &&
                       confirm->request.micro_batch_size >= largest && confirms(entry, *confirm));
  }
  return r;
}

void dropCachedResult(const std::string& dir, const CacheKey& key) {
  std::error_code ec;
  fs::remove(cacheEntryPath(dir, key), ec);
}

}  // namespace autobatch
