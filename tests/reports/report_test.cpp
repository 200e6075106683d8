// The outputs a launcher reads: env lines, the JSON's plans, report files
// (autobatch/reports/report.h).
#include "autobatch/reports/report.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace report_test {

namespace fs = std::filesystem;

fs::path testDir() {
  fs::path dir = fs::path(AUTOBATCH_TEST_TMP) / "report" /
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A search that found `safe` (and `max`) with `plans` for its target.
ReportData searchReport(std::int64_t max, std::int64_t safe,
                        std::optional<AccumulationPlans> plans = std::nullopt) {
  ReportData d;
  d.status = "found";
  d.result.emplace();
  d.result->search.max_micro_batch = max;
  d.result->search.safe_micro_batch = safe;
  d.result->search.capped_by = "memory";
  d.result->search.plan = std::move(plans);
  return d;
}

// Runs `script` in sh inside `dir`; returns its stdout.
std::string shell(const fs::path& dir, const std::string& script) {
  const fs::path file = dir / "script.sh";
  std::ofstream(file) << script;
  const fs::path out = dir / "script.out";
  const std::string command = "cd '" + dir.string() + "' && sh script.sh > script.out 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << readFile(out);
  return readFile(out);
}

// Issue 27, rows 2 and 3: env lines that are only data, plans described by their groups.

// Catches env lines that write a value bare or inside double quotes: a status (or any text) with
// $(...), backquotes or a single quote would run, or break the line, when a launcher evals them.
TEST(ReportTest, EnvLinesAreShellWordsThatEvalBackToTheirValues) {
  const fs::path dir = testDir();
  ReportData d = searchReport(8, 8);
  d.status = "found'$(touch pwned)`touch pwned2`\"; touch pwned3";
  const std::string lines = envLines(d);
  EXPECT_NE(lines.find("AUTOBATCH_STATUS='found'\\''$(touch pwned)`touch pwned2`\"; touch "
                       "pwned3'\n"),
            std::string::npos)
      << lines;
  const std::string out = shell(dir, lines +
                                         "printf '%s|%s' \"$AUTOBATCH_STATUS\" "
                                         "\"$AUTOBATCH_MICRO_BATCH\"\n");
  EXPECT_EQ(out, d.status + "|8");
  EXPECT_FALSE(fs::exists(dir / "pwned"));
  EXPECT_FALSE(fs::exists(dir / "pwned2"));
  EXPECT_FALSE(fs::exists(dir / "pwned3"));
  // Plain words stay bare, as launchers that grep them expect.
  EXPECT_NE(envLines(searchReport(8, 8)).find("AUTOBATCH_STATUS=found\nAUTOBATCH_MICRO_BATCH=8\n"),
            std::string::npos);
}

// Catches a report that lists every micro-batch of a plan: a target of 2^40 at a maximum of 3 is
// 2^39 micro-batches (std::bad_alloc, exit 134, a 0-byte JSON file).
TEST(ReportTest, HugePlansAreDescribedByTheirGroups) {
  const std::int64_t target = std::int64_t{1} << 40;
  ReportData d = searchReport(3, 3, planAccumulation(3, target, 1, PlanKind::kUniform));
  d.options.target_batch = target;
  const std::string json = toJson(d);
  EXPECT_LT(json.size(), 20000U);
  const auto doc = nlohmann::json::parse(json);
  const auto& uniform = doc["plans"]["uniform"];
  EXPECT_TRUE(uniform["micro_batches"].is_null());
  EXPECT_EQ(uniform["groups"].size(), 1U);
  EXPECT_EQ(uniform["groups"][0]["micro_batch_size"], 2);
  EXPECT_EQ(uniform["groups"][0]["count"], std::int64_t{1} << 39);
  EXPECT_EQ(uniform["accumulation_steps"], std::int64_t{1} << 39);
  EXPECT_EQ(uniform["effective_batch"], target);
  const std::string lines = envLines(d);
  EXPECT_NE(lines.find("AUTOBATCH_EFFECTIVE_BATCH=1099511627776\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("AUTOBATCH_ACCUM_STEPS=549755813888\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("AUTOBATCH_MICRO_BATCHES=''\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("AUTOBATCH_MICRO_BATCH_GROUPS='2:549755813888'\n"), std::string::npos)
      << lines;
  EXPECT_LT(lines.size(), 1000U);
  // At the bound the sizes are still listed, one by one.
  ReportData listed =
      searchReport(3, 3, planAccumulation(3, 3 * kMicroBatchListLimit - 1, 1, PlanKind::kBalanced));
  const auto balanced = nlohmann::json::parse(toJson(listed))["plans"]["balanced"];
  EXPECT_EQ(balanced["micro_batches"].size(), static_cast<std::size_t>(kMicroBatchListLimit));
  EXPECT_EQ(balanced["groups"][0]["count"], kMicroBatchListLimit - 1);
  EXPECT_NE(envLines(listed).find("AUTOBATCH_MICRO_BATCH_GROUPS='3:4095 2:1'\n"),
            std::string::npos);
}

// Issue 27, row 9: catches AUTOBATCH_MAX_MICRO_BATCH=0 while the JSON's max_micro_batch is 1
// (batch 1 fit, only above the margin): the env lines report the raw maximum as the JSON does.
TEST(ReportTest, EnvLinesReportTheRawMaximumWhenNothingIsUnderTheMargin) {
  ReportData d = searchReport(1, 0);
  d.status = "nothing-fits";
  const std::string lines = envLines(d);
  EXPECT_NE(lines.find("AUTOBATCH_STATUS=nothing-fits\nAUTOBATCH_MICRO_BATCH=0\n"),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find("AUTOBATCH_MAX_MICRO_BATCH=1\nAUTOBATCH_SAFE_MICRO_BATCH=0\n"),
            std::string::npos)
      << lines;
}

// Issue 27, row 7: report files.

// Catches a report written in place (std::ofstream truncates first): when the write fails (here
// past RLIMIT_FSIZE, as on a full disk) the old file must stay whole and no temporary file stay.
TEST(ReportTest, AReportFileIsReplacedWholeOrNotAtAll) {
  const fs::path dir = testDir();
  const fs::path path = dir / "report.json";
  std::ofstream(path) << "previous report\n";
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(writeReportFile(path.string(), "{\"new\": 1}\n"), "");
  EXPECT_EQ(readFile(path), "{\"new\": 1}\n");
  // Replaced, yet with the old file's permissions.
  EXPECT_EQ(fs::status(path).permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);

  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string why = writeReportFile(path.string(), std::string(100, 'x'));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(why, "File too large");
  EXPECT_EQ(readFile(path), "{\"new\": 1}\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  EXPECT_EQ(writeReportFile("/dev/full", "{}\n"), "No space left on device");
  EXPECT_EQ(writeReportFile((dir / "missing" / "r.json").string(), "{}\n"),
            "No such file or directory");
}

// Catches output paths found bad only after the search, an empty path taken as "no report", and a
// report path that names the model (the baseline replaced the model with the JSON).
TEST(ReportTest, ReportPathsAreCheckedBeforeAnyTrial) {
  const fs::path dir = testDir();
  const fs::path model = dir / "net.pt";
  std::ofstream(model) << "PK model";
  fs::create_symlink(model, dir / "link.pt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "--json: expected a file path (or - for standard output), but got an empty path"},
      {dir.string(), "--json '" + dir.string() +
                         "': expected a file to write the report to, but it is a directory"},
      {(dir / "missing" / "r.json").string(), "expected a path in an existing folder, but '" +
                                                  (dir / "missing").string() + "' does not exist"},
      {model.string(), "expected a file other than the run's input, but it is the model '" +
                           model.string() + "' itself"},
      {(dir / "link.pt").string(), "but it is the model"},
      {"/proc/autobatch-report.json", "refuses a new file (No such file or directory)"},
  };
  for (const auto& [path, message] : cases) {
    try {
      checkReportPath("--json", path, {model.string()});
      ADD_FAILURE() << "expected autobatch::Error for '" << path << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(readFile(model), "PK model");
  EXPECT_NO_THROW(checkReportPath("--json", "-", {model.string()}));
  EXPECT_NO_THROW(checkReportPath("--json", (dir / "new.json").string(), {model.string()}));
  EXPECT_NO_THROW(checkReportPath("--json", "/dev/null", {model.string()}));
  EXPECT_FALSE(fs::exists(dir / "new.json"));  // the check creates nothing
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
}

}  // namespace report_test
}  // namespace
}  // namespace autobatch
