#include "process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "autobatch/units.h"

namespace autobatch::detail {
namespace {

// v1 reports "no limit" as PAGE_COUNTER_MAX pages (2^63 - 4096 with 4 KiB pages); anything this
// large is no limit on any machine.
constexpr std::int64_t kNoLimitFrom = std::int64_t{1} << 60;
// memory.stat values are capped here (no machine has 2^58 bytes), so sums cannot overflow.
constexpr std::int64_t kStatValueMax = std::int64_t{1} << 58;

std::string readWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "max" (v2) is no limit; anything not a whole non-negative number is unreadable.
std::optional<std::int64_t> parseBytes(const std::string& text) {
  std::int64_t value = 0;
  std::size_t i = 0;
  while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  const std::size_t first_digit = i;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (std::numeric_limits<std::int64_t>::max() - 9) / 10) return std::nullopt;
    value = value * 10 + (text[i] - '0');
  }
  if (i == first_digit) return std::nullopt;
  if (i < text.size() && text[i] != '\n' && text[i] != ' ') return std::nullopt;
  return value;
}

// The number at the start of a small file (memory.current, memory.max, ...); nullopt when
// unreadable or "max".
std::optional<std::int64_t> readBytesFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  return parseBytes(text);
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescapeOctal(const std::string& field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '7' &&
        field[i + 2] >= '0' && field[i + 2] <= '7' && field[i + 3] >= '0' && field[i + 3] <= '7') {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

struct CgroupMount {
  std::string root;         // the cgroup path the mount shows at its mount point
  std::string mount_point;  // where it is mounted
};

// Mounts of cgroup v1's memory controller (version 1) or of cgroup2 (version 2).
std::vector<CgroupMount> cgroupMounts(const std::string& mountinfo_text, int version) {
  std::vector<CgroupMount> mounts;
  std::istringstream lines(mountinfo_text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> fields;
    for (std::string w; words >> w;) fields.push_back(w);
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (dash == fields.end() || dash - fields.begin() < 5 || fields.end() - dash < 4) continue;
    const std::string& fstype = *(dash + 1);
    const std::string& super_options = *(dash + 3);
    bool wanted = false;
    if (version == 2) {
      wanted = fstype == "cgroup2";
    } else if (fstype == "cgroup") {
      std::istringstream options(super_options);
      for (std::string option; std::getline(options, option, ',');) {
        wanted = wanted || option == "memory";
      }
    }
    if (wanted) mounts.push_back({unescapeOctal(fields[3]), unescapeOctal(fields[4])});
  }
  return mounts;
}

// Each level from the process's cgroup up to the mount point, with a limit.
void collectLevels(int version, const std::string& cgroup_path, const CgroupMount& mount,
                   const std::string& root, std::vector<CgroupMemoryLimit>& out) {
  // The process's cgroup below the mount's top folder: "" (the top itself) or "/a/b".
  std::string relative;
  if (mount.root == "/") {
    relative = cgroup_path;
  } else if (cgroup_path == mount.root || cgroup_path.rfind(mount.root + "/", 0) == 0) {
    relative = cgroup_path.substr(mount.root.size());
  } else if (mount.root.rfind("/..", 0) != 0) {
    return;  // another part of the hierarchy, bind-mounted elsewhere: not this process's limits
  }  // else: a cgroup namespace shows the mount's root outside it ("/../.."): its top applies.
  while (!relative.empty() && relative.back() == '/') relative.pop_back();
  const std::string top = mount.mount_point == "/" ? "" : mount.mount_point;
  const std::string limit_file = version == 1 ? "memory.limit_in_bytes" : "memory.max";
  const std::string usage_file = version == 1 ? "memory.usage_in_bytes" : "memory.current";
  // A limit in bytes, or 0 for none ("max", v1's "unlimited", unreadable).
  auto limit_in = [](const std::string& file) -> std::int64_t {
    const auto bytes = readBytesFile(file);
    return bytes && *bytes > 0 && *bytes < kNoLimitFrom ? *bytes : 0;
  };
  while (true) {
    const std::string dir = top + relative;
    const std::string base = root + (dir.empty() ? "/" : dir);
    const std::int64_t limit = limit_in(base + "/" + limit_file);
    // memory.high throttles instead of killing; it matters only below memory.max.
    std::int64_t high = version == 2 ? limit_in(base + "/memory.high") : 0;
    if (limit > 0 && high >= limit) high = 0;
    const auto usage = readBytesFile(base + "/" + usage_file);
    if (usage && (limit > 0 || high > 0)) {
      CgroupMemoryLimit level;
      level.version = version;
      level.dir = dir.empty() ? "/" : dir;
      level.usage_bytes = *usage;
      const std::string stat = readWholeFile(base + "/memory.stat");
      const MemoryStatFigures figures = parseMemoryStat(stat.data(), stat.size(), version);
      level.file_bytes = figures.file_bytes;
      level.mapped_file_bytes = figures.mapped_file_bytes;
      if (limit > 0) {
        level.limit_bytes = limit;
        out.push_back(level);
      }
      if (high > 0) {
        level.limit_bytes = high;
        level.high = true;
        out.push_back(level);
      }
    }
    if (relative.empty()) break;
    relative = relative.substr(0, relative.rfind('/'));  // strictly shorter: the walk ends
  }
}

}  // namespace

std::int64_t CgroupMemoryLimit::needBytes() const {
  const std::int64_t unmapped_cache = std::max<std::int64_t>(file_bytes - mapped_file_bytes, 0);
  return std::clamp<std::int64_t>(usage_bytes - unmapped_cache, 0, usage_bytes);
}

MemoryStatFigures parseMemoryStat(const char* text, std::size_t size, int version) {
  MemoryStatFigures figures;
  const char* p = text;
  const char* end = text + size;
  const bool v1 = version == 1;
  auto is = [](const char* key, std::size_t key_size, const char* name) {
    return std::strlen(name) == key_size && std::memcmp(key, name, key_size) == 0;
  };
  while (p < end) {
    const char* key = p;
    while (p < end && *p != ' ' && *p != '\n') ++p;
    const auto key_size = static_cast<std::size_t>(p - key);
    while (p < end && *p == ' ') ++p;
    std::int64_t value = 0;
    bool digits = false;
    for (; p < end && *p >= '0' && *p <= '9'; ++p) {
      value = std::min(value * 10 + (*p - '0'), kStatValueMax);
      digits = true;
    }
    while (p < end && *p != '\n') ++p;
    if (p < end) ++p;
    if (!digits) continue;
    if (is(key, key_size, v1 ? "total_active_file" : "active_file") ||
        is(key, key_size, v1 ? "total_inactive_file" : "inactive_file")) {
      figures.file_bytes += value;
    } else if (is(key, key_size, v1 ? "total_mapped_file" : "file_mapped")) {
      figures.mapped_file_bytes = value;
    }
  }
  return figures;
}

std::string CgroupMemoryLimit::limitFile() const {
  return dir + (version == 1 ? "/memory.limit_in_bytes" : high ? "/memory.high" : "/memory.max");
}

std::string CgroupMemoryLimit::usageFile() const {
  return dir + (version == 1 ? "/memory.usage_in_bytes" : "/memory.current");
}

std::string CgroupMemoryLimit::describe() const {
  return std::string(version == 1 ? "cgroup v1 memory.limit_in_bytes "
                     : high       ? "cgroup memory.high "
                                  : "cgroup memory.max ") +
         std::to_string(limit_bytes) + " (" + dir + ")";
}

std::optional<std::int64_t> readKbLine(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::int64_t kb = 0;
    if (fields >> kb) return kb * 1024;
  }
  return std::nullopt;
}

std::vector<CgroupMemoryLimit> readCgroupMemoryLimits(const std::string& proc_cgroup_text,
                                                      const std::string& proc_mountinfo_text,
                                                      const std::string& root) {
  std::vector<CgroupMemoryLimit> levels;
  std::istringstream lines(proc_cgroup_text);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-ID:controller-list:cgroup-path"; the path may itself hold colons.
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (path.empty() || path[0] != '/') continue;
    int version = 0;
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      version = 2;
    } else {
      std::istringstream names(controllers);
      for (std::string name; std::getline(names, name, ',');) {
        if (name == "memory") version = 1;
      }
    }
    if (version == 0) continue;
    for (const CgroupMount& mount : cgroupMounts(proc_mountinfo_text, version)) {
      collectLevels(version, path, mount, root, levels);
    }
  }
  // A hierarchy mounted twice (bind mounts) shows the same levels twice.
  std::vector<CgroupMemoryLimit> unique;
  for (const auto& level : levels) {
    const bool seen = std::any_of(unique.begin(), unique.end(), [&](const CgroupMemoryLimit& u) {
      return u.version == level.version && u.dir == level.dir && u.high == level.high;
    });
    if (!seen) unique.push_back(level);
  }
  return unique;
}

std::vector<CgroupMemoryLimit> cgroupMemoryLimitsOfThisProcess() {
  return readCgroupMemoryLimits(readWholeFile("/proc/self/cgroup"),
                                readWholeFile("/proc/self/mountinfo"));
}

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
    // its raw usage stays where it is (found by a user test: a model file read cold left ~100 MiB
    // of cache in a 650 MiB cgroup; following raw usage alone, the guard saw no growth and the
    // process was killed in 5 of 9 runs).
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
