#include "memory/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "autobatch/vocabulary/units.h"

namespace autobatch::detail {

std::int64_t processMemoryMarginBytes(std::int64_t limit_bytes) {
  return std::max<std::int64_t>(std::int64_t{64} << 20, limit_bytes / 50);
}

// One watched limit: a cgroup (its usage and memory.stat files kept open) or the system.
struct ProcessMemoryGuard::Watch {
  bool system = false;           // anonymous resident bytes against MemAvailable
  int version = 0;               // cgroup version
  int usage_fd = -1;             // memory.usage_in_bytes / memory.current
  int stat_fd = -1;              // memory.stat
  int limit_fd = -1;             // memory.limit_in_bytes / memory.max: it can be lowered any time
  std::int64_t limit_bytes = 0;  // cgroup: its limit; system: anon + MemAvailable at the baseline
  // The limits it was changed to since, in order; capacity reserved at creation (no allocation
  // while admitting): past kMaxLimitChanges the last entry is overwritten.
  std::vector<std::int64_t> changed_to;
  static constexpr std::size_t kMaxLimitChanges = 8;
  std::int64_t margin_bytes = 0;
  std::int64_t need_ref_bytes = 0;    // need at the last exact read
  std::int64_t follow_ref_bytes = 0;  // the followed figure then (followed())
  std::int64_t anon_ref_bytes = 0;    // this process's anonymous resident bytes then
  int checks_since_read = 0;
  bool throttles = false;  // memory.high: passing it throttles the process instead of killing it
  std::string what;
};

namespace {

long pageBytes() {
  static const long bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

// A number at the start of a small file kept open, read without allocating; nullopt on failure.
std::optional<std::int64_t> preadNumber(int fd) {
  std::array<char, 64> buffer{};
  const ssize_t n = pread(fd, buffer.data(), buffer.size() - 1, 0);
  if (n <= 0) return std::nullopt;
  std::int64_t value = 0;
  ssize_t i = 0;
  for (; i < n && buffer[static_cast<std::size_t>(i)] >= '0' &&
         buffer[static_cast<std::size_t>(i)] <= '9';
       ++i) {
    value = std::min<std::int64_t>(value * 10 + (buffer[static_cast<std::size_t>(i)] - '0'),
                                   kStatValueMax);
  }
  if (i == 0) return std::nullopt;
  return value;
}

}  // namespace

ProcessMemoryGuard::ProcessMemoryGuard() {
  statm_fd_ = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
}

ProcessMemoryGuard::~ProcessMemoryGuard() {
  for (const Watch& w : watches_) {
    if (w.usage_fd >= 0) close(w.usage_fd);
    if (w.stat_fd >= 0) close(w.stat_fd);
    if (w.limit_fd >= 0) close(w.limit_fd);
  }
  if (statm_fd_ >= 0) close(statm_fd_);
}

// /proc/self/statm: "size resident shared text lib data dt", in pages; resident - shared is the
// process's anonymous resident memory (heap, tensors, stacks).
std::int64_t ProcessMemoryGuard::anonBytes() const {
  std::array<char, 256> buffer{};
  const ssize_t n = statm_fd_ < 0 ? -1 : pread(statm_fd_, buffer.data(), buffer.size() - 1, 0);
  if (n <= 0) return 0;
  std::array<std::int64_t, 3> fields{};
  std::size_t field = 0;
  bool in_number = false;
  for (ssize_t i = 0; i < n && field < fields.size(); ++i) {
    const char c = buffer[static_cast<std::size_t>(i)];
    if (c >= '0' && c <= '9') {
      fields[field] = fields[field] * 10 + (c - '0');
      in_number = true;
    } else if (in_number) {
      ++field;
      in_number = false;
    }
  }
  return std::max<std::int64_t>(fields[1] - fields[2], 0) * pageBytes();
}

// The watch's need now from the kernel's own figures; nullopt when unreadable.
// Between exact reads the need is followed by one figure read with one pread: a cgroup's raw usage
// (it sees every process in the cgroup; page cache it gains counts until the next exact read),
// or this process's anonymous bytes for the system.
std::optional<std::int64_t> ProcessMemoryGuard::followed(const Watch& w, std::int64_t anon_bytes) {
  if (w.system) return anon_bytes;
  return preadNumber(w.usage_fd);
}

// The limit can be lowered while the search runs (an operator, a job scheduler): read at every
// check, one pread. "max" now, or unreadable: the old one is kept.
void ProcessMemoryGuard::refreshLimit(Watch& w) {
  if (w.system || w.limit_fd < 0) return;
  if (const auto limit = preadNumber(w.limit_fd); limit && *limit > 0 && *limit < kNoLimitFrom) {
    if (*limit != w.limit_bytes) {
      w.limit_bytes = *limit;
      w.margin_bytes = processMemoryMarginBytes(*limit);
      if (w.changed_to.size() < Watch::kMaxLimitChanges) {
        w.changed_to.push_back(*limit);  // within the reserved capacity
      } else {
        w.changed_to.back() = *limit;
      }
    }
  }
}

std::optional<std::int64_t> ProcessMemoryGuard::exactNeed(Watch& w) {
  if (w.system) {
    const auto available =
        readKbLine("/proc/meminfo", "MemAvailable");  // allocates; never on the fast path
    if (!available) return std::nullopt;
    // The room left is MemAvailable: express it as need against the fixed limit.
    return w.limit_bytes - *available;
  }
  refreshLimit(w);
  CgroupMemoryLimit level;
  level.version = w.version;
  level.limit_bytes = w.limit_bytes;
  const auto usage = preadNumber(w.usage_fd);
  if (!usage) return std::nullopt;
  level.usage_bytes = *usage;
  std::array<char, 16384> stat{};
  const ssize_t n = w.stat_fd < 0 ? -1 : pread(w.stat_fd, stat.data(), stat.size(), 0);
  if (n > 0) {
    const MemoryStatFigures figures =
        parseMemoryStat(stat.data(), static_cast<std::size_t>(n), w.version);
    level.file_bytes = figures.file_bytes;
    level.mapped_file_bytes = figures.mapped_file_bytes;
  }
  return level.needBytes();
}

void ProcessMemoryGuard::resync(Watch& w, std::int64_t anon_bytes) {
  const auto now = followed(w, anon_bytes);
  if (const auto need = exactNeed(w)) {
    w.need_ref_bytes = *need;
  } else if (now) {
    w.need_ref_bytes += *now - w.follow_ref_bytes;  // unreadable now: keep the estimate
  }
  if (now) w.follow_ref_bytes = *now;
  w.anon_ref_bytes = anon_bytes;
  w.checks_since_read = 0;
}

void ProcessMemoryGuard::addCgroupWatches(const std::vector<CgroupMemoryLimit>& limits) {
  for (const CgroupMemoryLimit& level : limits) {
    Watch w;
    w.version = level.version;
    w.usage_fd = open(level.usageFile().c_str(), O_RDONLY | O_CLOEXEC);
    if (w.usage_fd < 0) continue;
    w.stat_fd = open((level.dir + "/memory.stat").c_str(), O_RDONLY | O_CLOEXEC);
    w.limit_fd = open(level.limitFile().c_str(), O_RDONLY | O_CLOEXEC);
    w.limit_bytes = level.limit_bytes;
    w.margin_bytes = processMemoryMarginBytes(level.limit_bytes);
    w.throttles = level.high;
    w.what = level.describe();
    watches_.push_back(std::move(w));
  }
}

void ProcessMemoryGuard::addSystemWatch() {
  const auto available = readKbLine("/proc/meminfo", "MemAvailable");
  if (!available || statm_fd_ < 0) return;
  Watch w;
  w.system = true;
  const std::int64_t anon = anonBytes();
  w.limit_bytes = anon + *available;
  w.margin_bytes = processMemoryMarginBytes(*available);
  w.what = "system memory: this process's anonymous resident bytes (" + std::to_string(anon) +
           " at start) may grow by MemAvailable (" + std::to_string(*available) + " at start)";
  watches_.push_back(std::move(w));
}

std::unique_ptr<ProcessMemoryGuard> ProcessMemoryGuard::forCgroups(
    const std::vector<CgroupMemoryLimit>& limits) {
  std::unique_ptr<ProcessMemoryGuard> guard(new ProcessMemoryGuard());
  guard->addCgroupWatches(limits);
  if (guard->watches_.empty()) return nullptr;
  guard->setBaseline();
  guard->startLimitHistory();
  return guard;
}

// A cgroup limit larger than the memory free on the machine leaves the global OOM killer in
// charge: the system is watched beside every cgroup level.
std::unique_ptr<ProcessMemoryGuard> ProcessMemoryGuard::forThisProcess() {
  std::unique_ptr<ProcessMemoryGuard> guard(new ProcessMemoryGuard());
  guard->addCgroupWatches(cgroupMemoryLimitsOfThisProcess());
  guard->addSystemWatch();
  if (guard->watches_.empty()) return nullptr;
  guard->setBaseline();
  guard->startLimitHistory();
  return guard;
}

void ProcessMemoryGuard::startLimitHistory() {
  for (Watch& w : watches_) {
    w.changed_to.clear();
    w.changed_to.reserve(Watch::kMaxLimitChanges);
  }
}

void ProcessMemoryGuard::setBaseline() {
  const std::int64_t anon = anonBytes();
  std::int64_t least_room = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 0; i < watches_.size(); ++i) {
    Watch& w = watches_[i];
    resync(w, anon);
    const std::int64_t room = w.limit_bytes - w.margin_bytes - w.need_ref_bytes;
    if (room < least_room) {
      least_room = room;
      tightest_ = i;
    }
  }
  baseline_need_bytes_ = watches_.empty() ? 0 : watches_[tightest_].need_ref_bytes;
  peak_need_bytes_ = baseline_need_bytes_;
}

std::int64_t ProcessMemoryGuard::baselineNeedBytes() const { return baseline_need_bytes_; }

void ProcessMemoryGuard::resetPeak() {
  if (watches_.empty()) return;
  Watch& w = watches_[tightest_];
  resync(w, anonBytes());
  peak_need_bytes_ = w.need_ref_bytes;
}

std::int64_t ProcessMemoryGuard::peakNeedBytes() const { return peak_need_bytes_; }

bool ProcessMemoryGuard::admits(std::int64_t request_bytes) {
  const std::int64_t anon = anonBytes();
  for (std::size_t i = 0; i < watches_.size(); ++i) {
    Watch& w = watches_[i];
    if (++w.checks_since_read >= kChecksPerStatRead) resync(w, anon);
    refreshLimit(w);
    const auto now = followed(w, anon);
    // Growth since the exact read: the followed figure's, or this process's own anonymous
    // growth when larger. A cgroup at its limit reclaims page cache as the process grows, and
    // its raw usage stays where it is (a model file read cold left ~100 MiB of cache in a
    // 650 MiB cgroup; following raw usage alone, the guard saw no growth and the process was
    // killed in 5 of 9 runs: ProcessMemoryTest.GuardSeesGrowthThatReclaimedPageCacheHides).
    const std::int64_t grown =
        std::max(now ? *now - w.follow_ref_bytes : 0, anon - w.anon_ref_bytes);
    std::int64_t need = w.need_ref_bytes + grown;
    const std::int64_t ceiling = w.limit_bytes - w.margin_bytes;
    // Near the limit, or the raw usage is (so the kernel is trading cache for the process's
    // growth, which no followed figure shows): ask the kernel.
    // Compared as request > ceiling - need: need + request wraps around for a request near 2^63.
    if (request_bytes > ceiling - need || (!w.system && now && request_bytes > ceiling - *now)) {
      resync(w, anon);
      need = w.need_ref_bytes;
    }
    if (request_bytes > ceiling - need) {
      refusal_ = std::string("the process would pass a memory limit the kernel enforces by ") +
                 (w.throttles ? "throttling it (the step would run far slower than measured): "
                              : "killing it: ") +
                 formatBytes(need) + " in use + " + formatBytes(request_bytes) + " requested > " +
                 formatBytes(w.limit_bytes) + " less a margin of " + formatBytes(w.margin_bytes) +
                 " for memory the budget does not count (" + w.what + ")";
      return false;
    }
    if (i == tightest_) peak_need_bytes_ = std::max(peak_need_bytes_, need + request_bytes);
  }
  return true;
}

std::string ProcessMemoryGuard::refusalMessage() const { return refusal_; }

std::string ProcessMemoryGuard::describe() const {
  std::string text;
  for (const Watch& w : watches_) text += (text.empty() ? "" : "; ") + w.what;
  return text;
}

std::vector<std::string> ProcessMemoryGuard::limitChanges() const {
  std::vector<std::string> changes;
  for (const Watch& w : watches_) {
    if (w.system || w.changed_to.empty()) continue;
    std::string values;
    for (std::size_t i = 0; i < w.changed_to.size(); ++i) {
      values += (i == 0 ? "" : ", then ") + std::to_string(w.changed_to[i]);
    }
    changes.push_back(
        w.what + " was changed while the trials ran, to " + values +
        ": each trial was measured against the limit of its time, so the answer (and any "
        "non-monotonic or does-not-fit figure) may belong to an earlier limit; run autobatch "
        "again under the one now");
  }
  return changes;
}

std::int64_t ProcessMemoryGuard::marginBytes() const {
  return watches_.empty() ? 0 : watches_[tightest_].margin_bytes;
}

}  // namespace autobatch::detail
