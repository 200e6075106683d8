// cgroup_memory.h (internal) — the platform readers of the process memory guard
// (process_memory.h): the cgroup v1 and v2 memory limits that apply to a process, their usage and
// page cache (memory.stat), and "Key: N kB" lines of /proc files. LibTorch-free (built into
// autobatch_core, tested in tests/memory/process_memory_test.cpp). Thread safety: none needed (no
// state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace autobatch::detail {

/// v1 reports "no limit" as PAGE_COUNTER_MAX pages (2^63 - 4096 with 4 KiB pages); a limit this
/// large or larger is no limit on any machine.
inline constexpr std::int64_t kNoLimitFrom = std::int64_t{1} << 60;
/// memory.stat values are capped here (no machine has 2^58 bytes), so sums cannot overflow.
inline constexpr std::int64_t kStatValueMax = std::int64_t{1} << 58;

/// One cgroup level whose memory limit applies to this process (its own cgroup or an ancestor).
struct CgroupMemoryLimit {
  int version = 0;  ///< 1 (memory controller of cgroup v1) or 2 (unified hierarchy)
  /// The cgroup's folder, e.g. "/sys/fs/cgroup/memory/process_api/f075" (v1) or
  /// "/sys/fs/cgroup/user.slice/job-3" (v2).
  std::string dir;
  /// memory.limit_in_bytes (v1), memory.max or memory.high (v2), > 0
  std::int64_t limit_bytes = 0;
  /// True when the limit is cgroup v2's memory.high: above it the kernel does not kill but
  /// throttles the cgroup and reclaims under heavy pressure (systemd's MemoryHigh=, Kubernetes'
  /// MemoryQoS), so a training step there runs far slower than measured; autobatch keeps under it
  /// as under memory.max. A level with both has two entries, memory.high only when it is lower.
  bool high = false;
  std::int64_t usage_bytes = 0;  ///< memory.usage_in_bytes (v1) or memory.current (v2)
  /// Page cache charged to the cgroup, from memory.stat ((total_)active_file + inactive_file, v1
  /// keys with "total_"), and the part of it mapped into processes ((total_)mapped_file, v2
  /// file_mapped), in bytes; 0 when memory.stat gives none.
  std::int64_t file_bytes = 0;
  std::int64_t mapped_file_bytes = 0;

  /// What the kernel cannot take back without killing: usage less the page cache nobody maps
  /// (it is reclaimed before any process is killed; mapped pages, such as LibTorch's own code, are
  /// kept because evicting them makes every step fault them back in), in bytes, in [0, usage].
  std::int64_t needBytes() const;
  /// limit - needBytes(), in bytes; may be negative.
  std::int64_t headroomBytes() const { return limit_bytes - needBytes(); }
  /// The file of the limit (memory.limit_in_bytes, memory.max or memory.high).
  std::string limitFile() const;
  /// The file the kernel's usage figure is read from (memory.usage_in_bytes or memory.current).
  std::string usageFile() const;
  /// "cgroup v1 memory.limit_in_bytes 1610612736 (/sys/fs/cgroup/memory/x)", "cgroup memory.high
  /// 2147483648 (/sys/fs/cgroup/job)" and the like.
  std::string describe() const;
};

/// The cgroup levels with a memory limit that apply to a process, innermost first, from the text
/// of its /proc/<pid>/cgroup and /proc/<pid>/mountinfo. Where the hierarchy is mounted comes from
/// mountinfo (cgroup v1 "memory" controller: fstype "cgroup" with super option "memory"; v2: fstype
/// "cgroup2", e.g. /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems); the process's
/// cgroup path is taken relative to the mount's root (a container sees "/docker/<id>" mounted as
/// its own root). Each level from the process's cgroup up to the mount point is read (v2:
/// memory.max and, when lower, memory.high, as two entries); levels without a limit ("max", or v1's
/// "unlimited" 2^63 rounded down to a page) are left out, and so are levels whose files cannot be
/// read. `root` is prepended to every path read (tests build a fake tree under a temporary folder;
/// "" for the real one). Never throws on malformed text: what cannot be parsed is skipped.
std::vector<CgroupMemoryLimit> readCgroupMemoryLimits(const std::string& proc_cgroup_text,
                                                      const std::string& proc_mountinfo_text,
                                                      const std::string& root = "");

/// readCgroupMemoryLimits() for this process (/proc/self/cgroup, /proc/self/mountinfo).
std::vector<CgroupMemoryLimit> cgroupMemoryLimitsOfThisProcess();

/// The value of a "Key:   123 kB" line of a /proc file (/proc/meminfo, /proc/self/status), in
/// bytes; nullopt when the file or the key is missing.
std::optional<std::int64_t> readKbLine(const std::string& path, const std::string& key);

/// The figures of a memory.stat text ("key value" lines) that needBytes() uses, cgroup `version`
/// 1 (total_active_file, total_inactive_file, total_mapped_file: hierarchical) or 2 (active_file,
/// inactive_file, file_mapped), in bytes; missing keys are 0. Reads `text` only, no allocation.
struct MemoryStatFigures {
  std::int64_t file_bytes = 0;
  std::int64_t mapped_file_bytes = 0;
};
MemoryStatFigures parseMemoryStat(const char* text, std::size_t size, int version);

}  // namespace autobatch::detail
