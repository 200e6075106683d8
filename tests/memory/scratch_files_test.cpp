// Scratch files (src/memory/scratch_files.h, issue 27 row 6): the folder a pt2 package is extracted
// into honours TMPDIR, is removed by its owner on every path out, and by removeScratchFiles() (the
// CLI's second-signal handler) while it exists.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "autobatch/autobatch.h"
#include "autobatch/vocabulary/error.h"
#include "memory/scratch_files.h"

namespace autobatch::detail {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace scratch_files_test {

namespace fs = std::filesystem;

// TMPDIR set to `value` for one test, restored after.
class TmpdirIs {
 public:
  explicit TmpdirIs(const std::string& value) {
    if (const char* old = std::getenv("TMPDIR")) saved_ = old;
    ::setenv("TMPDIR", value.c_str(), 1);
  }
  ~TmpdirIs() {
    if (saved_) {
      ::setenv("TMPDIR", saved_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  TmpdirIs(const TmpdirIs&) = delete;
  TmpdirIs& operator=(const TmpdirIs&) = delete;

 private:
  std::optional<std::string> saved_;
};

fs::path freshDir(const std::string& name) {
  fs::path dir = fs::path(AUTOBATCH_TEST_TMP) / "scratch_files" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool empty(const fs::path& dir) { return fs::is_empty(dir); }

TEST(ScratchFilesTest, TheFolderIsInTmpdirAndGoesAwayOnEveryPathOut) {
  // Catches a folder made in /tmp whatever TMPDIR says (LibTorch's loader), files left when the
  // owner returns or throws, and a relative TMPDIR taken as a folder of the working directory.
  const fs::path dir = freshDir("paths");
  const TmpdirIs tmpdir(dir.string() + "/");
  {
    ScratchFolder folder("autobatch-pt2-");
    EXPECT_EQ(fs::path(folder.path()).parent_path(), dir);
    EXPECT_EQ(fs::path(folder.path()).filename().string().rfind("autobatch-pt2-", 0), 0U);
    EXPECT_EQ(fs::status(folder.path()).permissions() & fs::perms::all, fs::perms::owner_all);
    const std::string file = folder.writeFile("model0.so", "abc", 3);
    EXPECT_EQ(fs::file_size(file), 3U);
  }
  EXPECT_TRUE(empty(dir));
  try {
    ScratchFolder folder("autobatch-pt2-");
    folder.writeFile("model0.so", "abc", 3);
    throw std::runtime_error("loading failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(empty(dir));
  const TmpdirIs relative("relative/folder");
  EXPECT_EQ(scratchRoot(), "/tmp");
}

TEST(ScratchFilesTest, RemoveScratchFilesEmptiesTheFolderWhileItsOwnerHoldsIt) {
  // What the CLI's second SIGINT/SIGTERM calls before _exit (no destructor runs then). Catches a
  // table that forgets files, removes the folder before its files, or a slot never released
  // (the table would fill after kScratchSlots folders).
  const fs::path dir = freshDir("signal");
  const TmpdirIs tmpdir(dir.string());
  for (std::size_t round = 0; round < 2 * kScratchSlots; ++round) {
    ScratchFolder folder("autobatch-pt2-");
    folder.writeFile("model0.so", "abc", 3);
    folder.writeFile("model0.json", "{}", 2);
    autobatch::removeScratchFiles();
    EXPECT_TRUE(empty(dir)) << round;
  }
  EXPECT_TRUE(empty(dir));
}

TEST(ScratchFilesTest, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  // Catches a silent fallback to another folder and a message naming the random name.
  const fs::path dir = freshDir("missing");
  const TmpdirIs tmpdir((dir / "none").string());
  try {
    ScratchFolder folder("autobatch-pt2-");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "temporary folder '" + (dir / "none").string() +
                  "/autobatch-pt2-XXXXXX': expected to create it (TMPDIR or /tmp), but No such "
                  "file or directory; set TMPDIR to a writable folder");
  }
}

}  // namespace scratch_files_test
}  // namespace
}  // namespace autobatch::detail
