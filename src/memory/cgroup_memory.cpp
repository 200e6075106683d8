// The cgroup memory limits and /proc readers of the process memory guard (cgroup_memory.h).
#include "memory/cgroup_memory.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

namespace autobatch::detail {
namespace {

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

}  // namespace autobatch::detail
