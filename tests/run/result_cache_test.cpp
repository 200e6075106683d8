// The result cache's entries (autobatch/run/result_cache.h): what is read back, and what is
// refused.
#include "autobatch/run/result_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace result_cache_test {

namespace fs = std::filesystem;
using nlohmann::json;

CacheKey testKey() {
  CacheKey key;
  key.hash = "0123456789abcdef0123456789abcdef01234567";
  key.fields = {{"model_sha1", "abc"}, {"inputs", "float32:64"}};
  return key;
}

// An entry as storeCachedResult writes it (checked below: the stored text parses to this).
json validEntry() {
  return {{"schema_version", 1},
          {"key", testKey().hash},
          {"fields", {{"model_sha1", "abc"}, {"inputs", "float32:64"}}},
          {"stored_at", "2026-11-30T20:15:03Z"},
          {"status", "found"},
          {"max_micro_batch", 120},
          {"safe_micro_batch", 110},
          {"memory_limit_bytes", 67108864},
          {"margin_bytes", 3355443},
          {"capped_by", "memory"},
          {"accumulation_max_micro_batch", 100},
          {"trials", 7},
          {"search_s", 1.5}};
}

std::string errorOf(const json& entry) {
  try {
    parseCachedResult(entry.dump(), testKey());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A folder of its own per run (ctest runs the tests of a file in parallel processes).
fs::path freshDir(const std::string& name) {
  fs::path dir = fs::path(AUTOBATCH_TEST_TMP) / "result_cache" /
                 (name + "-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

TEST(ResultCacheTest, AStoredEntryReadsBackWhole) {
  const fs::path dir = freshDir("roundtrip");
  CachedResult r;
  r.stored_at = "2026-11-30T20:15:03Z";
  r.status = "found";
  r.max_micro_batch = 120;
  r.safe_micro_batch = 110;
  r.memory_limit_bytes = 64 << 20;
  r.margin_bytes = 3355443;
  r.capped_by = "max-batch";
  r.accumulation_max_micro_batch = 100;
  r.trials = 7;
  r.search_s = 1.25;
  ASSERT_EQ(storeCachedResult(dir.string(), testKey(), r), "");
  std::vector<std::string> warnings;
  const auto back = loadCachedResult(dir.string(), testKey(), warnings);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(back->key, testKey().hash);
  EXPECT_EQ(back->max_micro_batch, 120);
  EXPECT_EQ(back->safe_micro_batch, 110);
  EXPECT_EQ(back->margin_bytes, 3355443);
  EXPECT_EQ(back->capped_by, "max-batch");
  EXPECT_EQ(back->accumulation_max_micro_batch, 100);
  EXPECT_EQ(back->trials, 7);
  EXPECT_DOUBLE_EQ(back->search_s, 1.25);
}

// Issue 27, row 20: entries were only partly validated.
// A fractional batch (2.5 read as 2 by get<int64_t>), a foreign status, an unknown schema version,
// negative counts and values of the wrong type were hits. Each is refused naming its field.
// Catches a reader that truncates numbers, skips a field it reads, or checks only the batch
// sizes.
TEST(ResultCacheTest, EveryFieldIsCheckedAndTheFirstInvalidOneIsNamed) {
  ASSERT_EQ(errorOf(validEntry()), "");
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"safe_micro_batch", 2.5,
       "safe_micro_batch: expected a whole number in [1, 120], but got 2.5"},
      {"max_micro_batch", -3,
       "max_micro_batch: expected a whole number in [1, 1099511627776], but got -3"},
      {"max_micro_batch", "120", "max_micro_batch: expected a whole number"},
      {"safe_micro_batch", 121, "safe_micro_batch: expected a whole number in [1, 120]"},
      {"safe_micro_batch", true, "safe_micro_batch: expected a whole number"},
      {"status", "nothing-fits", "status: expected found, but got \"nothing-fits\""},
      {"status", 1, "status: expected a string, but got 1"},
      {"schema_version", 2, "schema_version: expected 1 (this autobatch's format), but got 2"},
      {"schema_version", "1", "schema_version: expected 1"},
      {"trials", -1, "trials: expected a whole number in [0, 2147483647], but got -1"},
      {"trials", 4294967296.0, "trials: expected a whole number"},
      {"margin_bytes", -5, "margin_bytes: expected a whole number in [0, 67108863], but got -5"},
      {"margin_bytes", 67108864, "margin_bytes: expected a whole number in [0, 67108863]"},
      {"memory_limit_bytes", -1, "memory_limit_bytes: expected a whole number in [0, "},
      {"memory_limit_bytes", 18446744073709551615ULL, "memory_limit_bytes: expected a whole"},
      {"accumulation_max_micro_batch", 121,
       "accumulation_max_micro_batch: expected a whole "
       "number in [0, 120]"},
      {"capped_by", "gremlins",
       "capped_by: expected memory, size-limit, max-batch or "
       "dataset-size, but got \"gremlins\""},
      {"search_s", -0.5, "search_s: expected a number of seconds >= 0, but got -0.5"},
      {"search_s", "fast", "search_s: expected a number of seconds >= 0"},
      {"stored_at", "yesterday", "stored_at: expected a UTC time such as 2026-11-30T20:15:03Z"},
      {"key", "ffff", "key: expected this run's key 0123456789abcdef"},
      {"fields", json::array(), "fields: expected an object, but got []"},
  };
  for (const auto& [field, value, message] : cases) {
    json entry = validEntry();
    entry[field] = value;
    const std::string error = errorOf(entry);
    EXPECT_EQ(error.rfind(message, 0), 0U) << field << " = " << value.dump() << ": " << error;
  }
  for (const char* field : {"status", "trials", "search_s", "capped_by", "schema_version"}) {
    json entry = validEntry();
    entry.erase(field);
    EXPECT_EQ(errorOf(entry), std::string(field) +
                                  ": expected a value, but got none (the field "
                                  "is missing)");
  }
  json other = validEntry();
  other["fields"]["inputs"] = "float32:512";
  EXPECT_EQ(errorOf(other),
            "fields.inputs: expected this run's 'float32:64', but got \"float32:512\"");
  EXPECT_EQ(errorOf(json::array({1, 2})), "expected a JSON object, but got [1,2]");
  EXPECT_EQ(errorOf(json("x")), "expected a JSON object, but got \"x\"");
  EXPECT_EQ(std::string(errorOf(validEntry())), "");
  try {
    parseCachedResult(R"({"key": "trunc)", testKey());
    FAIL() << "a truncated entry parsed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("not JSON: ", 0), 0U) << e.what();
  }
}

// An invalid entry on disk is a miss with a warning naming the file and the field; it stays in
// place until the search's answer replaces it. Catches a loader that answers from it, and one that
// warns without saying which field.
TEST(ResultCacheTest, AnInvalidEntryIsAMissWithAWarningNamingTheField) {
  const fs::path dir = freshDir("invalid");
  json entry = validEntry();
  entry["safe_micro_batch"] = 2.5;
  const std::string path = cacheEntryPath(dir.string(), testKey());
  std::ofstream(path) << entry.dump();
  std::vector<std::string> warnings;
  EXPECT_FALSE(loadCachedResult(dir.string(), testKey(), warnings).has_value());
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_EQ(warnings[0], "result cache: ignoring the invalid entry " + path +
                             " (safe_micro_batch: expected a whole number in [1, 120], but got "
                             "2.5); searching instead");
}

// An entry path that is a folder: the store said "cannot rename ...: Success" (the error code of
// the clean-up after the failed rename, not the rename's). Catches any file-system error that
// loses its reason, and a loader that calls a folder an unreadable JSON.
TEST(ResultCacheTest, AFolderInTheEntrysPlaceIsNamedAndTheStoreSaysWhyItFailed) {
  const fs::path dir = freshDir("folder");
  const std::string path = cacheEntryPath(dir.string(), testKey());
  fs::create_directories(fs::path(path) / "inside");
  std::vector<std::string> warnings;
  EXPECT_FALSE(loadCachedResult(dir.string(), testKey(), warnings).has_value());
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("it is a directory, not an entry autobatch wrote"), std::string::npos)
      << warnings[0];
  CachedResult r;
  r.safe_micro_batch = r.max_micro_batch = 1;
  const std::string why = storeCachedResult(dir.string(), testKey(), r);
  EXPECT_EQ(why.rfind("cannot rename ", 0), 0U) << why;
  EXPECT_NE(why.find(": Is a directory"), std::string::npos) << why;
  EXPECT_EQ(why.find("Success"), std::string::npos) << why;
  // The temporary file is gone: only the folder is left.
  int files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  // A cache folder that is a file: the reason, not a bare failure.
  const fs::path blocked = dir / "blocked";
  std::ofstream(blocked) << "x";
  const std::string under_file = storeCachedResult((blocked / "sub").string(), testKey(), r);
  EXPECT_EQ(under_file.rfind("cannot create " + (blocked / "sub").string() + ": ", 0), 0U)
      << under_file;
  EXPECT_NE(under_file.find("Not a directory"), std::string::npos) << under_file;
}

// Issue 68 row 5 (a, b). Catches an entry whose removal failed reported as dropped (every later
// run repeated its failing confirming trial) and a dangling symbolic link in the folder's place
// reported as "File exists".
TEST(ResultCacheTest, AnEntryThatCannotBeDroppedAndADanglingLinkAreNamed) {
  const fs::path dir = freshDir("undroppable");
  const std::string path = cacheEntryPath(dir.string(), testKey());
  fs::create_directories(fs::path(path) / "inside");  // fs::remove fails: "Directory not empty"
  const std::string why = dropCachedResult(dir.string(), testKey());
  EXPECT_EQ(why.rfind("cannot remove " + path + ": ", 0), 0U) << why;
  EXPECT_TRUE(dropCachedResult(dir.string(), CacheKey{}).empty());  // missing: nothing to do
  const fs::path link = dir / "link";
  fs::create_symlink(dir / "nowhere", link);
  CachedResult r;
  r.safe_micro_batch = r.max_micro_batch = 1;
  const std::string dangling = storeCachedResult(link.string(), testKey(), r);
  EXPECT_NE(dangling.find("it is a symbolic link to '" + (dir / "nowhere").string() +
                          "', which does not exist"),
            std::string::npos)
      << dangling;
}

}  // namespace result_cache_test
}  // namespace
}  // namespace autobatch
