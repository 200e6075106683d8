// Golden files (tests/golden/README.md): a test compares a text it produced with a committed
// expected file and, on a mismatch, shows the first line that differs, with its number and the
// lines before it, in the style of a unified diff. With AUTOBATCH_UPDATE_GOLDEN=1 in the
// environment the test rewrites the file instead of comparing (then review `git diff
// tests/golden`).
//
// AUTOBATCH_GOLDEN_DIR (a compile definition) is the source folder tests/golden. Thread safety:
// one test at a time per file.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace autobatch::testing {

/// True when AUTOBATCH_UPDATE_GOLDEN=1: the golden files are rewritten, not compared.
inline bool updatingGolden() {
  const char* value = std::getenv("AUTOBATCH_UPDATE_GOLDEN");
  return value != nullptr && std::string(value) == "1";
}

/// `text` cut at '\n' (a text ending in '\n' gives a last, empty line).
inline std::vector<std::string> goldenLines(const std::string& text) {
  std::vector<std::string> lines;
  std::string::size_type start = 0;
  while (true) {
    const auto end = text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(text.substr(start));
      return lines;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

/// "" when equal; else the first differing line as a unified-diff hunk: up to 3 lines of
/// context, "-" the expected line, "+" the actual one ("<end of file>" past either end).
inline std::string firstDifference(const std::string& name, const std::string& expected,
                                   const std::string& actual) {
  if (expected == actual) return "";
  const auto want = goldenLines(expected);
  const auto got = goldenLines(actual);
  std::size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const std::size_t first = i >= 3 ? i - 3 : 0;
  std::ostringstream out;
  out << name << ": first difference at line " << i + 1 << " (expected " << want.size()
      << " lines, got " << got.size() << ")\n--- " << name << " (expected)\n+++ actual\n@@ -"
      << first + 1 << " +" << first + 1 << " @@\n";
  for (std::size_t k = first; k < i; ++k) out << " " << want[k] << "\n";
  out << "-" << (i < want.size() ? want[i] : "<end of file>") << "\n";
  out << "+" << (i < got.size() ? got[i] : "<end of file>") << "\n";
  out << "(an intended change: rerun with AUTOBATCH_UPDATE_GOLDEN=1 and review git diff)";
  return out.str();
}

/// Compares `actual` with AUTOBATCH_GOLDEN_DIR/`relative`, or rewrites that file when
/// updatingGolden(). A missing file fails, naming the update mode.
inline void expectGolden(const std::string& relative, const std::string& actual) {
  const std::filesystem::path path = std::filesystem::path(AUTOBATCH_GOLDEN_DIR) / relative;
  if (updatingGolden()) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "tests/golden/" << relative
                  << " is missing: run the test with AUTOBATCH_UPDATE_GOLDEN=1 to write it";
    return;
  }
  std::stringstream expected;
  expected << in.rdbuf();
  const std::string diff = firstDifference("tests/golden/" + relative, expected.str(), actual);
  EXPECT_TRUE(diff.empty()) << diff;
}

}  // namespace autobatch::testing
