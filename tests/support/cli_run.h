// Runs the autobatch binary (AUTOBATCH_CLI) in a child process, as users and launch scripts meet
// it, for the CLI tests and the GPU tests. Each test writes into a folder of its own (ctest runs
// the tests of a file in parallel processes).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace autobatch::testing {

struct CliRun {
  int exit_code = -1;  ///< the exit status, or 128 + the signal that ended it
  std::string out;     ///< stdout
  std::string err;     ///< stderr
};

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// AUTOBATCH_TEST_TMP/<group>/<the running test's name>, created.
inline std::filesystem::path testDir(const std::string& group) {
  std::filesystem::path dir = std::filesystem::path(AUTOBATCH_TEST_TMP) / group /
                              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(dir);
  return dir;
}

/// The binary under test: AUTOBATCH_TEST_CLI when set (to run today's tests against another
/// build, e.g. the one before a fix, and see them fail there), else the build's AUTOBATCH_CLI.
inline std::string cliPath() {
  const char* other = std::getenv("AUTOBATCH_TEST_CLI");
  return other != nullptr && *other != '\0' ? std::string(other) : std::string(AUTOBATCH_CLI);
}

/// Runs `cliPath() args` (args already shell-quoted where needed) with no standard input;
/// its stdout and stderr go to `<dir>/<tag>.out` / `.err` and come back in the result.
inline CliRun runCliIn(const std::filesystem::path& dir, const std::string& tag,
                       const std::string& args) {
  const std::filesystem::path out = dir / (tag + ".out");
  const std::filesystem::path err = dir / (tag + ".err");
  const std::string command =
      cliPath() + " " + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  const int status = std::system(command.c_str());
  CliRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = readFile(out);
  run.err = readFile(err);
  return run;
}

}  // namespace autobatch::testing
