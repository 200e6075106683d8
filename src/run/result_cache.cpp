#include "autobatch/run/result_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>
#include <system_error>

#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/error.h"
#include "vocabulary/os_text.h"

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

namespace {

constexpr std::int64_t kCacheSchemaVersion = 1;
// An entry is a few hundred bytes; a larger file is not one autobatch wrote.
constexpr std::int64_t kMaxEntryBytes = std::int64_t{1} << 20;
// The CLI's bound on any micro-batch (--max-batch, --target-batch).
constexpr std::int64_t kMaxMicroBatch = std::int64_t{1} << 40;
constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

// A value as a message shows it: its JSON text, cut to 40 characters.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

[[noreturn]] void invalid(std::string_view name, const std::string& expected,
                          const std::string& got) {
  throw Error(std::string(name) + ": expected " + expected + ", but got " + got);
}

const json& member(const json& doc, std::string_view name) {
  const auto it = doc.find(std::string(name));
  if (it == doc.end()) invalid(name, "a value", "none (the field is missing)");
  return *it;
}

std::string textField(const json& doc, std::string_view name) {
  const json& value = member(doc, name);
  if (!value.is_string()) invalid(name, "a string", shown(value));
  return value.get<std::string>();
}

// A whole number in [min, max]: 2.5, "3", true and -1 (for min 0) are refused, never truncated.
std::int64_t wholeField(const json& doc, std::string_view name, std::int64_t min,
                        std::int64_t max) {
  const json& value = member(doc, name);
  const std::string range =
      "a whole number in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (!value.is_number_integer()) invalid(name, range, shown(value));
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(max) || static_cast<std::int64_t>(u) < min) {
      invalid(name, range, shown(value));
    }
    return static_cast<std::int64_t>(u);
  }
  const auto n = value.get<std::int64_t>();
  if (n < min || n > max) invalid(name, range, shown(value));
  return n;
}

// "2026-11-30T20:15:03Z", as utcNow() in the CLI writes it.
bool isUtcTime(const std::string& t) {
  constexpr std::string_view kPattern = "dddd-dd-ddTdd:dd:ddZ";
  if (t.size() != kPattern.size()) return false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const bool digit = std::isdigit(static_cast<unsigned char>(t[i])) != 0;
    if (kPattern[i] == 'd' ? !digit : t[i] != kPattern[i]) return false;
  }
  return true;
}

// The key and its fields: an entry of another key (or a hash collision) is not this run's answer.
void checkKey(const json& doc, const CacheKey& key) {
  const std::string stored = textField(doc, "key");
  if (stored != key.hash) invalid("key", "this run's key " + key.hash, shown(doc.at("key")));
  const json& fields = member(doc, "fields");
  if (!fields.is_object()) invalid("fields", "an object", shown(fields));
  for (const auto& [name, value] : key.fields) {
    const auto it = fields.find(name);
    if (it == fields.end() || !it->is_string() || it->get<std::string>() != value) {
      invalid("fields." + name, "this run's '" + value + "'",
              it == fields.end() ? "none (the field is missing)" : shown(*it));
    }
  }
}

void readAnswer(const json& doc, CachedResult& r) {
  r.stored_at = textField(doc, "stored_at");
  if (!isUtcTime(r.stored_at)) {
    invalid("stored_at", "a UTC time such as 2026-11-30T20:15:03Z", shown(doc.at("stored_at")));
  }
  r.status = textField(doc, "status");
  // Only a closed search is stored (cachedResultOf).
  if (r.status != "found") invalid("status", "found", shown(doc.at("status")));
  r.max_micro_batch = wholeField(doc, "max_micro_batch", 1, kMaxMicroBatch);
  r.safe_micro_batch = wholeField(doc, "safe_micro_batch", 1, r.max_micro_batch);
  r.memory_limit_bytes = wholeField(doc, "memory_limit_bytes", 0, kMaxInt64);
  r.margin_bytes = wholeField(doc, "margin_bytes", 0,
                              r.memory_limit_bytes > 0 ? r.memory_limit_bytes - 1 : kMaxInt64);
  r.capped_by = textField(doc, "capped_by");
  static constexpr std::array<std::string_view, 7> kCappedBy{
      "memory",       "size-limit",  "max-batch", "dataset-size",
      "trial-budget", "time-budget", "cancelled"};
  if (std::find(kCappedBy.begin(), kCappedBy.end(), r.capped_by) == kCappedBy.end()) {
    invalid("capped_by", "memory, size-limit, max-batch or dataset-size",
            shown(doc.at("capped_by")));
  }
  r.accumulation_max_micro_batch =
      wholeField(doc, "accumulation_max_micro_batch", 0, r.max_micro_batch);
  r.trials = static_cast<int>(wholeField(doc, "trials", 0, std::numeric_limits<int>::max()));
  const json& seconds = member(doc, "search_s");
  if (!seconds.is_number() || !(seconds.get<double>() >= 0.0) ||
      !std::isfinite(seconds.get<double>())) {
    invalid("search_s", "a number of seconds >= 0", shown(seconds));
  }
  r.search_s = seconds.get<double>();
}

// The entry's bytes, or why they cannot be read (errno's reason, never a stale one).
std::string readEntry(const std::string& path, std::string& text) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open it: " + errnoText(errno);
  std::array<char, 4096> chunk{};
  std::string why;
  while (why.empty()) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) why = "cannot read it: " + errnoText(errno);
    if (n <= 0) break;
    text.append(chunk.data(), static_cast<std::size_t>(n));
    if (static_cast<std::int64_t>(text.size()) > kMaxEntryBytes) {
      why = "larger than 1 MiB: not an entry autobatch wrote";
    }
  }
  ::close(fd);
  return why;
}

// Creates `path` (it must not exist) holding `text`; "" or why not, with errno's reason.
std::string writeNewFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + path + ": " + errnoText(errno);
  std::string why;
  for (std::size_t done = 0; done < text.size() && why.empty();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) why = "cannot write " + path + ": " + errnoText(errno);
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && why.empty()) why = "cannot write " + path + ": " + errnoText(errno);
  if (!why.empty()) ::unlink(path.c_str());
  return why;
}

}  // namespace

CachedResult parseCachedResult(std::string_view text, const CacheKey& key) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(std::string("not JSON: ") + e.what());
  }
  if (!doc.is_object()) throw Error("expected a JSON object, but got " + shown(doc));
  const json& version = member(doc, "schema_version");
  if (!version.is_number_integer() || version.get<std::int64_t>() != kCacheSchemaVersion) {
    invalid("schema_version", std::to_string(kCacheSchemaVersion) + " (this autobatch's format)",
            shown(version));
  }
  checkKey(doc, key);
  CachedResult r;
  r.key = key.hash;
  readAnswer(doc, r);
  return r;
}

std::optional<CachedResult> loadCachedResult(const std::string& dir, const CacheKey& key,
                                             std::vector<std::string>& warnings) {
  const std::string path = cacheEntryPath(dir, key);
  auto ignore = [&](const char* kind, const std::string& why) -> std::optional<CachedResult> {
    warnings.push_back("result cache: ignoring the " + std::string(kind) + " entry " + path + " (" +
                       why + "); searching instead");
    return std::nullopt;
  };
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) return std::nullopt;
  if (ec) return ignore("unreadable", "cannot see it: " + ec.message());
  if (status.type() != fs::file_type::regular) {
    return ignore("unreadable", std::string(status.type() == fs::file_type::directory
                                                ? "it is a directory"
                                                : "it is not a regular file") +
                                    ", not an entry autobatch wrote: remove it so that the "
                                    "cache can store here");
  }
  std::string text;
  if (const std::string why = readEntry(path, text); !why.empty()) return ignore("unreadable", why);
  try {
    return parseCachedResult(text, key);
  } catch (const Error& e) {
    const std::string why = e.what();
    return ignore(why.starts_with("not JSON") ? "unreadable" : "invalid", why);
  }
}

std::string storeCachedResult(const std::string& dir, const CacheKey& key,
                              const CachedResult& result) {
  std::error_code ec;
  // A dangling symbolic link in the folder's place: create_directories says only "File exists".
  if (fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(dir, ec)) {
    std::error_code read;
    const fs::path target = fs::read_symlink(dir, read);
    return "cannot create " + dir + ": it is a symbolic link to '" + target.string() +
           "', which does not exist; create that folder or point the link elsewhere";
  }
  fs::create_directories(dir, ec);
  if (ec) return "cannot create " + dir + ": " + ec.message();
  // Unique within the folder: the pid, and a random suffix for several stores in one process.
  static std::atomic<unsigned> counter{0};
  std::random_device random;
  const std::string tmp =
      (fs::path(dir) / ("." + key.hash + "." + std::to_string(::getpid()) + "." +
                        std::to_string(random()) + "." + std::to_string(counter++) + ".tmp"))
          .string();
  if (std::string why = writeNewFile(tmp, toJson(key, result).dump(2) + "\n"); !why.empty()) {
    return why;
  }
  const std::string entry = cacheEntryPath(dir, key);
  if (::rename(tmp.c_str(), entry.c_str()) != 0) {
    // The reason is taken before the clean-up, which would overwrite it ("Success").
    const std::string why = errnoText(errno);
    ::unlink(tmp.c_str());
    return "cannot rename " + tmp + " to " + entry + ": " + why;
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

std::string dropCachedResult(const std::string& dir, const CacheKey& key) {
  std::error_code ec;
  const std::string path = cacheEntryPath(dir, key);
  fs::remove(path, ec);
  return ec ? "cannot remove " + path + ": " + ec.message() : "";
}

}  // namespace autobatch
