// Scratch files and their signal-safe table (scratch_files.h).
#include "memory/scratch_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "autobatch/autobatch.h"
#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {
namespace {

constexpr std::size_t kMaxPath = 4096;  // PATH_MAX on Linux

// One path the signal handler may remove. state: 0 free, 1 being written by its owner, 2 ready
// (the handler reads only these), 3 being released.
struct Slot {
  std::atomic<int> state{0};
  bool folder = false;
  std::array<char, kMaxPath> path{};
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads the table");

std::array<Slot, kScratchSlots>& slots() {
  static std::array<Slot, kScratchSlots> table;
  return table;
}

// A slot holding `path`, or -1 when the table is full or the path too long.
int registerPath(const std::string& path, bool folder) {
  if (path.size() >= kMaxPath) return -1;
  for (std::size_t i = 0; i < slots().size(); ++i) {
    Slot& slot = slots()[i];
    int expected = 0;
    if (!slot.state.compare_exchange_strong(expected, 1)) continue;
    slot.folder = folder;
    std::memcpy(slot.path.data(), path.c_str(), path.size() + 1);
    slot.state.store(2);
    return static_cast<int>(i);
  }
  return -1;
}

void release(int slot) {
  if (slot >= 0) slots()[static_cast<std::size_t>(slot)].state.store(0);
}

// Removes the ready paths of one kind; async-signal-safe (an atomic exchange, unlink, rmdir).
void removeReady(bool folders) {
  for (Slot& slot : slots()) {
    if (slot.folder != folders) continue;
    int expected = 2;
    if (!slot.state.compare_exchange_strong(expected, 3)) continue;
    if (folders) {
      ::rmdir(slot.path.data());
    } else {
      ::unlink(slot.path.data());
    }
    slot.state.store(0);
  }
}

}  // namespace

std::string scratchRoot() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && tmpdir[0] == '/' ? std::string(tmpdir) : std::string("/tmp");
}

ScratchFolder::ScratchFolder(const std::string& prefix) {
  std::string root = scratchRoot();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::string pattern = (root == "/" ? "" : root) + "/" + prefix + "XXXXXX";
  std::string name = pattern;
  if (::mkdtemp(name.data()) == nullptr) {
    throw Error("temporary folder '" + pattern + "': expected to create it (TMPDIR or /tmp), but " +
                std::strerror(errno) + "; set TMPDIR to a writable folder");
  }
  path_ = name;
  slot_ = registerPath(path_, /*folder=*/true);
}

std::string ScratchFolder::writeFile(const std::string& name, const void* data, std::size_t bytes) {
  std::string path = path_ + "/" + name;
  // Registered before it exists: a signal between open() and the end of the write still has it.
  files_.push_back({path, registerPath(path, /*folder=*/false)});
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
  int error = fd < 0 ? errno : 0;
  const auto* at = static_cast<const char*>(data);
  for (std::size_t done = 0; fd >= 0 && done < bytes;) {
    const ssize_t n = ::write(fd, at + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (fd >= 0 && ::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    throw Error("temporary file '" + path + "': expected to write " + std::to_string(bytes) +
                " bytes, but " + std::strerror(error) + "; free space under " + scratchRoot() +
                " or set TMPDIR to another folder");
  }
  return path;
}

ScratchFolder::~ScratchFolder() {
  for (const auto& file : files_) {
    ::unlink(file.path.c_str());
    release(file.slot);
  }
  ::rmdir(path_.c_str());
  release(slot_);
}

}  // namespace autobatch::detail

namespace autobatch {

void removeScratchFiles() noexcept {
  detail::removeReady(/*folders=*/false);
  detail::removeReady(/*folders=*/true);
}

}  // namespace autobatch
