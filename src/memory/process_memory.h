// Internal: a guard that refuses an allocation before the process would pass one of the memory
// limits that apply to it as a whole (cgroup v1 and v2, read by cgroup_memory.h; the system's
// available memory). LibTorch-free (built into autobatch_core, tested in
// tests/memory/process_memory_test.cpp).
//
// Why: the CPU budget allocator counts tensor bytes only. A cgroup counts everything the process
// touches (glibc's retained free chunks, oneDNN scratch and JIT code, thread stacks) and, when the
// cgroup passes its limit, the kernel kills the process with SIGKILL: nothing to catch. Measured
// on this machine kind before the guard: ResNet-18 3x64x64 under a cgroup v1 limit of 1.5 GiB,
// `autobatch` without --memory-limit was killed at its third trial (exit 137, memory.oom_control
// oom_kill 1). The guard reads what the kernel reads (the cgroup's usage) before every large
// allocation and turns "would pass the limit" into c10::OutOfMemoryError, a trial outcome.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memory/cgroup_memory.h"

namespace autobatch::detail {

/// Refuses an allocation that would take the process past one of its memory limits.
///
/// What it watches, chosen when it is created (forThisProcess: all of them; the tightest one sets
/// the peak figure):
/// - every cgroup level with a memory limit (cgroupMemoryLimitsOfThisProcess()): its need
///   (CgroupMemoryLimit::needBytes(), from memory.usage_in_bytes / memory.current and memory.stat)
///   against its limit. Raw usage is not the figure: near the limit the kernel fills the cgroup
///   with page cache and evicts it on demand, so usage sits at the limit while nothing is wrong;
/// - the system (a cgroup limit above what the machine has free leaves the global OOM killer in
///   charge): this process's anonymous resident bytes
///   (/proc/self/statm resident - shared) against what it held at the baseline plus MemAvailable
///   then (the global OOM killer picks the largest process, which a search near the machine's
///   memory would be).
/// admits(n) is true when need + n stays at or under limit - margin, margin = max(64 MiB, 2% of the
/// limit): room for what grows between two checks without passing through the budget allocator
/// (small allocations are not checked, nor thread stacks, oneDNN's JIT code). Between two reads of
/// memory.stat the need is followed by one pread: the cgroup's raw usage (which sees the other
/// processes of the cgroup too), or for the system this process's anonymous resident bytes
/// (/proc/self/statm); memory.stat is read again every 64 checks and whenever that estimate comes
/// within the margin. The limit itself is read at every check (it can be lowered while the search
/// runs: lowered from 1.5 GiB to 900 MiB mid-search, a limit read once let the process be killed).
/// It does not give glibc's free chunks back (malloc_trim) to make room: a user's training process
/// keeps them too and the kernel counts them, so a trial that would only fit with trimming does not
/// fit. No heap allocation on the path that admits (the budget allocator calls it from inside
/// allocations). Thread safety: none; calls must not overlap (the budget allocator makes them under
/// its lock).
class ProcessMemoryGuard {
 public:
  /// The guard for this process now (its cgroup levels and the system); nullptr when nothing could
  /// be read (no /proc).
  static std::unique_ptr<ProcessMemoryGuard> forThisProcess();
  /// A guard over the given cgroup levels only; nullptr when none of them can be read.
  static std::unique_ptr<ProcessMemoryGuard> forCgroups(
      const std::vector<CgroupMemoryLimit>& limits);
  ~ProcessMemoryGuard();
  ProcessMemoryGuard(const ProcessMemoryGuard&) = delete;
  ProcessMemoryGuard& operator=(const ProcessMemoryGuard&) = delete;

  /// True when `request_bytes` (>= 0) more can be taken without passing limit - margin anywhere.
  /// When false, refusalMessage() says which limit and with what need.
  bool admits(std::int64_t request_bytes);
  /// For the last refusal: "the process would pass a memory limit the kernel enforces by killing
  /// it (or, for memory.high, by throttling it): 1.40 GiB in use + 72.14 MiB requested > 1.50 GiB
  /// less a margin of 64.00 MiB for memory the budget does not count (cgroup v1
  /// memory.limit_in_bytes 1610612736 (/sys/...))"; "" before.
  std::string refusalMessage() const;
  /// What is watched, "; "-separated ("cgroup v1 memory.limit_in_bytes 1610612736 (/sys/...)",
  /// "system memory: ...").
  std::string describe() const;
  /// One line per cgroup limit that was changed since the guard was created (as seen by its
  /// checks): "cgroup v1 memory.limit_in_bytes 1610612736 (/sys/...) was changed while the trials
  /// ran, to 2147483648, then 943718400: ...", the values in order (the first 7 and the last).
  /// Trials before a change were measured against the limit then (a batch that fit then may not
  /// fit now). Empty when none changed.
  std::vector<std::string> limitChanges() const;
  /// The margin kept under the tightest watched limit, in bytes.
  std::int64_t marginBytes() const;

  /// Chooses the tightest watched limit (least room: limit - margin - need) and takes its need now
  /// as the baseline and the peak. Called at creation and by the runner once set up (after it
  /// trimmed the heap, as it does after every trial).
  void setBaseline();
  /// The tightest limit's need at the last setBaseline(), in bytes.
  std::int64_t baselineNeedBytes() const;
  /// Starts a new peak at the tightest limit's need now (reads memory.stat).
  void resetPeak();
  /// The highest need of the tightest limit seen since resetPeak(): its need then, and need +
  /// request at every check admits() passed, in bytes. Sampled at checked allocations, so it
  /// includes what glibc keeps of freed chunks (as the kernel counts it) but not pages first
  /// touched after the last check.
  std::int64_t peakNeedBytes() const;

  /// Below this size an allocation is not checked (it comes from glibc's heap, whose growth the
  /// margin covers): 64 KiB.
  static constexpr std::int64_t kCheckFromBytes = std::int64_t{64} << 10;
  /// memory.stat is read again after this many checks even far from the limit (other processes
  /// in the same cgroup grow too).
  static constexpr int kChecksPerStatRead = 64;

 private:
  struct Watch;
  ProcessMemoryGuard();
  void addCgroupWatches(const std::vector<CgroupMemoryLimit>& limits);
  void addSystemWatch();
  void startLimitHistory();  // limitChanges() counts from here: the limits as read at creation
  std::int64_t anonBytes() const;
  static std::optional<std::int64_t> followed(const Watch& w, std::int64_t anon_bytes);
  static void refreshLimit(Watch& w);
  static std::optional<std::int64_t> exactNeed(Watch& w);
  static void resync(Watch& w, std::int64_t anon_bytes);

  int statm_fd_ = -1;
  std::vector<Watch> watches_;
  std::size_t tightest_ = 0;  // index into watches_
  std::int64_t baseline_need_bytes_ = 0;
  std::int64_t peak_need_bytes_ = 0;
  std::string refusal_;
};

/// margin = max(64 MiB, 2% of `limit_bytes`), in bytes (ProcessMemoryGuard).
std::int64_t processMemoryMarginBytes(std::int64_t limit_bytes);

}  // namespace autobatch::detail
