// scratch_files.h (internal) — files autobatch writes for a moment outside the user's outputs (a
// pt2 package's compiled code, extracted for LibTorch's loader), kept in a table that a signal
// handler can empty: autobatch::removeScratchFiles() (autobatch.h) unlinks them with
// async-signal-safe calls only, before the CLI's second signal _exit()s (issue 27, row 6).
// Thread safety: registering and releasing are safe from any thread; the table holds
// kScratchSlots paths at once.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace autobatch::detail {

/// Paths the table holds at once; a path registered beyond them is removed by its owner only.
inline constexpr std::size_t kScratchSlots = 32;

/// A folder under $TMPDIR (else /tmp; "" or a relative TMPDIR counts as unset) named
/// "<prefix>XXXXXX", created with mode 0700 and registered. The files written into it with
/// writeFile() are registered too. The destructor removes them and the folder (whatever the
/// exit path: exceptions, returns) and releases the table's slots.
class ScratchFolder {
 public:
  /// Throws: autobatch::Error naming the folder and the reason when it cannot be created.
  explicit ScratchFolder(const std::string& prefix);
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;

  const std::string& path() const { return path_; }
  /// Writes `bytes` bytes at `data` to <path()>/<name> (a plain name, no '/'); returns its path.
  /// Throws: autobatch::Error naming the file and the reason (a full disk, say).
  std::string writeFile(const std::string& name, const void* data, std::size_t bytes);

 private:
  std::string path_;
  int slot_ = -1;
  struct File {
    std::string path;
    int slot = -1;
  };
  std::vector<File> files_;
};

/// The folder extraction uses: $TMPDIR when it is an absolute path, else /tmp.
std::string scratchRoot();

}  // namespace autobatch::detail
