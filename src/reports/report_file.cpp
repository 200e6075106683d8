// Report files (autobatch/reports/report.h): the check before any trial that a path can take the
// report, and the write that never leaves it truncated (a temporary file renamed over it).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "autobatch/reports/report.h"
#include "autobatch/vocabulary/error.h"
#include "vocabulary/os_text.h"

namespace autobatch {

namespace {

namespace fs = std::filesystem;

// Where a report for `path` goes: a symbolic link's target (a rename would replace the link).
fs::path reportTarget(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    fs::path resolved = fs::canonical(path, ec);
    if (!ec) return resolved;
  }
  return path;
}

fs::path folderOf(const fs::path& target) {
  return target.parent_path().empty() ? fs::path(".") : target.parent_path();
}

// A temporary file next to `target` (same folder, so the rename cannot cross file systems); its
// descriptor, or -1 with errno set. `name` receives its path.
int temporaryNextTo(const fs::path& target, std::string& name) {
  name = (folderOf(target) / ("." + target.filename().string() + ".autobatch-XXXXXX")).string();
  return mkostemp(name.data(), O_CLOEXEC);
}

}  // namespace

void checkReportPath(const std::string& flag, const std::string& path,
                     const std::vector<std::string>& inputs) {
  if (path.empty()) {
    throw Error(flag + ": expected a file path (or - for standard output), but got an empty path");
  }
  if (path == "-") return;
  const std::string what = flag + " '" + path + "'";
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) {
    throw Error(what + ": expected a file to write the report to, but it is a directory; name a " +
                "file in it, e.g. " + (fs::path(path) / "report.json").string());
  }
  if (fs::exists(status)) {
    for (const auto& input : inputs) {
      if (!input.empty() && fs::equivalent(path, input, ec)) {
        throw Error(what + ": expected a file other than the run's input, but it is the model '" +
                    input + "' itself; the report would replace it");
      }
    }
    // Opened without O_TRUNC: the check writes nothing.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && !(fs::is_fifo(status) && errno == ENXIO)) {  // a FIFO with no reader yet
      throw Error(what + ": expected a file that can be written, but it cannot be opened for " +
                  "writing (" + errnoText(errno) + ")");
    }
    if (fd >= 0) ::close(fd);
    if (!fs::is_regular_file(status)) return;  // written in place
  }
  const fs::path target = reportTarget(path);
  const fs::path folder = folderOf(target);
  if (!fs::is_directory(folder, ec)) {
    throw Error(what + ": expected a path in an existing folder, but '" + folder.string() + "' " +
                (fs::exists(folder, ec) ? "is not a folder" : "does not exist"));
  }
  std::string probe;
  const int fd = temporaryNextTo(target, probe);
  if (fd < 0) {
    throw Error(what + ": expected a folder where the report can be created, but '" +
                folder.string() + "' refuses a new file (" + errnoText(errno) + ")");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string writeReportTo(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoText(errno);
    done += static_cast<std::size_t>(n);
  }
  return "";
}

std::string writeReportFile(const std::string& path, const std::string& text) {
  const fs::path target = reportTarget(path);
  struct stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  if (exists && !S_ISREG(existing.st_mode)) {  // a device or a pipe: no file to replace
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errnoText(errno);
    std::string why = writeReportTo(fd, text);
    if (::close(fd) != 0 && why.empty()) why = errnoText(errno);
    return why;
  }
  std::string temporary;
  const int fd = temporaryNextTo(target, temporary);
  if (fd < 0) return errnoText(errno);
  mode_t mode = existing.st_mode & 07777;
  if (!exists) {
    // The umask cannot be read without setting it; no other thread creates files at this point.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  std::string why = writeReportTo(fd, text);
  if (why.empty() && ::fchmod(fd, mode) != 0) why = errnoText(errno);
  if (why.empty() && ::fsync(fd) != 0) why = errnoText(errno);
  if (::close(fd) != 0 && why.empty()) why = errnoText(errno);
  if (why.empty() && ::rename(temporary.c_str(), target.c_str()) != 0) why = errnoText(errno);
  if (!why.empty()) ::unlink(temporary.c_str());
  return why;
}

}  // namespace autobatch
