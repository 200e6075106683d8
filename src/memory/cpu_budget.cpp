// The CPU budget allocator: counts every CPU tensor's bytes and throws c10::OutOfMemoryError
// when an allocation would pass the limit. Includes c10 headers only (no torch/torch.h).
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "memory/budget_host.h"
#include "memory/memory_backend.h"
#include "memory/process_memory.h"

namespace autobatch::detail {
namespace {

// setInjectedProcessLimit's function (tests only), read by CpuBudgetBackend::processLimitNear.
std::mutex injected_process_limit_mutex;
InjectedProcessLimit injected_process_limit;

InjectedProcessLimit injectedProcessLimit() {
  const std::lock_guard<std::mutex> lock(injected_process_limit_mutex);
  return injected_process_limit;
}

// Throws when the hook armed on this thread (CpuInterruptScope, trial_scopes.cpp) asks to stop.
// Not inside an at::parallel_for region: the trial's intra-op workers never throw for it.
void checkInterrupt(std::int64_t bytes) {
  if (at::in_parallel_region() || !budgetInterruptDue()) return;
  TORCH_CHECK(false,
              "autobatch: trial interrupted inside a step (cancelled, or the time budget ran "
              "out) at an allocation of ",
              bytes, " bytes");
}

// One process-wide instance, never destroyed: tensors it allocated may outlive any runner, and
// their deleter must still find it.
class BudgetAllocator final : public c10::Allocator {
 public:
  static BudgetAllocator& instance() {
    static auto* allocator = new BudgetAllocator();
    return *allocator;
  }

  c10::DataPtr allocate(size_t n) override {
    const auto bytes = static_cast<std::int64_t>(n);
    if (n == 0 || budgetUntracked()) {
      // Not counted (the model being loaded, the weights' snapshot), but real to the kernel: a
      // cgroup kills a process loading a model larger than its room as surely as a trial.
      if (bytes >= ProcessMemoryGuard::kCheckFromBytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (guard_ != nullptr && !guard_->admits(bytes)) {
          TORCH_CHECK_WITH(OutOfMemoryError, false,
                           "CPU budget allocator: out of memory while setting up (loading the "
                           "model or copying its weights): tried to allocate ",
                           bytes, " bytes, but ", guard_->refusalMessage());
        }
      }
      void* data = c10::alloc_cpu(n);
      return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
    }
    checkInterrupt(bytes);
    bool apart = false;  // another thread's, or inside a collective's call
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pollWatchedLocked();
      if (error_) {
        const std::string message = error_(point_, bytes);
        TORCH_CHECK(message.empty(), message);
      }
      if (fault_ && fault_(point_, bytes)) {
        refuse(c10::str("CPU budget allocator: out of memory: tried to allocate ", bytes,
                        " bytes with ", current_, " bytes in use (injected in ",
                        phaseKey(point_.phase), ")"));
      }
      // Not current_ + bytes: a request near 2^63 bytes would wrap around and pass.
      if (limit_ > 0 && bytes > limit_ - current_) {
        refuse(c10::str("CPU budget allocator: out of memory: tried to allocate ", bytes,
                        " bytes with ", current_, " bytes in use under a limit of ", limit_,
                        " bytes (", source_, ")"));
      }
      if (guard_ != nullptr && bytes >= ProcessMemoryGuard::kCheckFromBytes &&
          !guard_->admits(bytes)) {
        refuse(c10::str("CPU budget allocator: out of memory: tried to allocate ", bytes,
                        " bytes with ", current_, " bytes of tensors in use, but ",
                        guard_->refusalMessage()));
      }
      current_ += bytes;  // claimed before the real allocation, so threads cannot overshoot
      // Another thread of the process allocating while a trial runs (a data loader, another
      // model): counted as the trial's, and said in the warnings. The trial's own intra-op
      // workers (at::parallel_for) are the trial's; CPU autograd runs on the trial's thread.
      const bool other_thread =
          in_trial_ && std::this_thread::get_id() != trial_thread_ && !at::in_parallel_region();
      if (other_thread) {
        foreign_bytes_ += bytes;
        ++foreign_allocations_;
      }
      apart = other_thread || budgetBackendScope();
    }
    void* data = nullptr;
    try {
      data = c10::alloc_cpu(n);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      current_ -= bytes;
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[data] = n;
    if (apart) {
      apart_live_.insert(data);
      apart_current_ += bytes;
    }
    if (logging_) log_.push_back({data, bytes});
    peak_ = std::max(peak_, current_);
    phase_peak_ = std::max(phase_peak_, current_);
    own_peak_ = std::max(own_peak_, current_ - apart_current_);
    return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteTracked; }

  // Refusals so far and the last one's message: code that swallows the OutOfMemoryError (an
  // AOTInductor package's call returns a plain error) is still known to have run out.
  std::pair<std::uint64_t, std::string> refusals() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {refusals_, last_refusal_};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void deleteTracked(void* data) {
    if (data == nullptr) return;
    BudgetAllocator& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      const auto it = self.sizes_.find(data);
      if (it != self.sizes_.end()) {
        self.current_ -= static_cast<std::int64_t>(it->second);
        if (!self.apart_live_.empty() && self.apart_live_.erase(data) > 0) {
          self.apart_current_ -= static_cast<std::int64_t>(it->second);
        }
        if (self.logging_) self.log_.push_back({data, -static_cast<std::int64_t>(it->second)});
        self.sizes_.erase(it);
      }
    }
    c10::free_cpu(data);
  }

  bool tracked(const void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    return sizes_.contains(const_cast<void*>(data));
  }
  void addExternal(std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    external_ += bytes;
    current_ += bytes;
    peak_ = std::max(peak_, current_);
    own_peak_ = std::max(own_peak_, current_ - apart_current_);
  }
  void clearExternal() {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ -= external_;
    external_ = 0;
    for (const Watched& w : watched_) c10::raw::weak_intrusive_ptr::decref(w.storage);
    watched_.clear();
  }
  // A storage counted in the external bytes (made before the allocator was installed: the
  // baseline's memory outside the model), watched through one weak reference that this
  // allocator now owns: when the storage is freed, its bytes leave the count at the next
  // allocation or read, as the caching allocator's count drops when such a tensor dies on CUDA
  // (a plan buffer a step replaces, a cache the user clears).
  void watchExternal(c10::intrusive_ptr_target* storage, std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_.push_back({storage, bytes});
  }
  // A new phase: the one ending keeps its peak (by phase and micro-batch), the new one starts
  // from the bytes held now.
  void setPoint(const TrialPoint& point) {
    std::lock_guard<std::mutex> lock(mutex_);
    recordPhasePeak(phase_peaks_, point_.phase, point_.micro_batch_index, phase_peak_);
    point_ = point;
    phase_peak_ = current_;
  }
  std::int64_t startLog() {
    std::lock_guard<std::mutex> lock(mutex_);
    log_.clear();
    logging_ = true;
    return current_;
  }
  std::vector<AllocationEvent> stopLog() {
    std::lock_guard<std::mutex> lock(mutex_);
    logging_ = false;
    return std::exchange(log_, {});
  }
  void addPhasePeak(TrialPhase phase, int micro, std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    recordPhasePeak(phase_peaks_, phase, micro, bytes);
  }
  std::vector<PhasePeakBytes> phasePeaks() {
    std::lock_guard<std::mutex> lock(mutex_);
    return phase_peaks_;
  }
  void setFault(InjectedFault fault) {
    std::lock_guard<std::mutex> lock(mutex_);
    fault_ = std::move(fault);
  }
  void setError(InjectedError error) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
  }
  // The guard is owned by the backend, which clears it before destroying it.
  void setGuard(ProcessMemoryGuard* guard) {
    std::lock_guard<std::mutex> lock(mutex_);
    guard_ = guard;
  }
  // Runs `f` on the guard's state under the lock admits() runs under (another thread of the
  // caller may allocate a tensor meanwhile).
  template <typename F>
  auto underLock(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::forward<F>(f)();
  }
  void setLimit(std::int64_t limit, std::string source) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
    source_ = std::move(source);
  }
  std::int64_t current() {
    std::lock_guard<std::mutex> lock(mutex_);
    pollWatchedLocked();
    return current_;
  }
  std::int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void resetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
    phase_peak_ = current_;
    own_peak_ = current_ - apart_current_;
    phase_peaks_.clear();
  }
  /// The peak since resetPeak() of the bytes held less those set apart (allocated by other
  /// threads, or inside a collective's call), and the bytes set apart held now (issue 43).
  std::pair<std::int64_t, std::int64_t> ownPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {own_peak_, apart_current_};
  }
  /// A trial runs on the calling thread from now until endTrial().
  void beginTrialOnThisThread() {
    std::lock_guard<std::mutex> lock(mutex_);
    trial_thread_ = std::this_thread::get_id();
    in_trial_ = true;
  }
  void endTrial() {
    std::lock_guard<std::mutex> lock(mutex_);
    in_trial_ = false;
  }
  void setRefusalSuffix(std::string suffix) {
    std::lock_guard<std::mutex> lock(mutex_);
    refusal_suffix_ = std::move(suffix);
  }
  /// Allocations (count, bytes) of other threads while trials ran, since the process started.
  std::pair<std::int64_t, std::int64_t> foreign() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {foreign_allocations_, foreign_bytes_};
  }

 private:
  BudgetAllocator() = default;

  // Called with mutex_ held: the watched external storages freed since the last poll leave the
  // count (a weak reference's use count is 0 once the storage's last owner let it go).
  void pollWatchedLocked() {
    if (watched_.empty()) return;
    std::erase_if(watched_, [this](const Watched& w) {
      if (c10::raw::weak_intrusive_ptr::use_count(w.storage) > 0) return false;
      external_ -= w.bytes;
      current_ -= w.bytes;
      c10::raw::weak_intrusive_ptr::decref(w.storage);
      return true;
    });
  }

  // Called with mutex_ held.
  [[noreturn]] void refuse(const std::string& message) {
    ++refusals_;
    last_refusal_ = message + refusal_suffix_;
    TORCH_CHECK_WITH(OutOfMemoryError, false, last_refusal_);
  }

  std::mutex mutex_;
  std::uint64_t refusals_ = 0;
  std::string last_refusal_;
  std::string refusal_suffix_;  // setRefusalSuffix: appended to every refusal's message
  std::unordered_map<void*, std::size_t> sizes_;
  std::int64_t current_ = 0;
  std::int64_t peak_ = 0;
  std::int64_t phase_peak_ = 0;              // peak of the phase in progress (point_.phase)
  std::vector<PhasePeakBytes> phase_peaks_;  // the trial's closed phases
  bool logging_ = false;                     // startLog() .. stopLog()
  std::vector<AllocationEvent> log_;
  std::int64_t external_ = 0;
  struct Watched {
    c10::intrusive_ptr_target* storage;  // a StorageImpl: one weak reference, owned
    std::int64_t bytes;
  };
  std::vector<Watched> watched_;  // watchExternal
  std::int64_t limit_ = 0;        // 0: no limit (not installed)
  std::string source_;
  TrialPoint point_;
  InjectedFault fault_;
  InjectedError error_;
  ProcessMemoryGuard* guard_ = nullptr;
  std::thread::id trial_thread_;  // the thread that runs the trial in progress
  bool in_trial_ = false;
  std::int64_t foreign_allocations_ = 0;  // other threads' allocations during trials
  std::int64_t foreign_bytes_ = 0;
  // Allocations set apart (other threads', a collective's) still held, and the peak without them.
  std::unordered_set<void*> apart_live_;
  std::int64_t apart_current_ = 0;
  std::int64_t own_peak_ = 0;
};

struct Headroom {
  std::int64_t bytes = std::numeric_limits<std::int64_t>::max();
  std::string source;
  std::string brief;  // the limit alone, for warnings: "cgroup v1 memory.limit_in_bytes ..."
  void offer(std::int64_t candidate, const std::string& what, const std::string& limit) {
    if (candidate < bytes) {
      bytes = std::max<std::int64_t>(candidate, 0);
      source = what;
      brief = limit;
    }
  }
};

// Headroom left by the process limits (cgroup, RLIMIT_DATA, RLIMIT_AS); max when none is set.
Headroom processHeadroom() {
  Headroom h;
  for (const CgroupMemoryLimit& level : cgroupMemoryLimitsOfThisProcess()) {
    h.offer(level.headroomBytes(),
            level.describe() + " less what its usage " + std::to_string(level.usage_bytes) +
                " holds beyond unmapped page cache, " + std::to_string(level.needBytes()),
            level.describe());
  }
  struct rlimit limit {};
  if (getrlimit(RLIMIT_DATA, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const auto used = readKbLine("/proc/self/status", "VmData").value_or(0);
    const auto cap = static_cast<std::int64_t>(limit.rlim_cur);
    h.offer(
        cap - used,
        "RLIMIT_DATA " + std::to_string(cap) + " less the process's VmData " + std::to_string(used),
        "RLIMIT_DATA " + std::to_string(cap));
  }
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const auto used = readKbLine("/proc/self/status", "VmSize").value_or(0);
    const auto cap = static_cast<std::int64_t>(limit.rlim_cur);
    h.offer(
        cap - used,
        "RLIMIT_AS " + std::to_string(cap) + " less the process's VmSize " + std::to_string(used),
        "RLIMIT_AS " + std::to_string(cap));
  }
  return h;
}

class CpuBudgetBackend final : public MemoryBackend {
 public:
  CpuBudgetBackend(std::int64_t memory_limit_bytes, std::int64_t reserve_bytes)
      : reserve_(reserve_bytes) {
    BudgetAllocator& budget = BudgetAllocator::instance();
    previous_ = c10::GetCPUAllocator();
    if (previous_ == &budget) {
      throw Error(
          "CPU budget allocator: expected no other TrialRunner on the CPU in this process, but "
          "one is alive; destroy it before creating another");
    }
    if (memory_limit_bytes > 0) {
      explicit_limit_ = memory_limit_bytes;
      source_ = "--memory-limit";
    }
    measureHeadroom();
    guard_ = ProcessMemoryGuard::forThisProcess();
    c10::SetCPUAllocator(&budget, kPriority);
    if (c10::GetCPUAllocator() != &budget) {
      throw Error(
          "CPU budget allocator: expected c10::SetCPUAllocator to install it, but another CPU "
          "allocator of higher priority is registered; the CPU budget cannot be enforced");
    }
    held_bytes_ = budget.current();
    applyLimit();
    budget.setGuard(guard_.get());
    foreign_at_start_ = budget.foreign();
  }

  ~CpuBudgetBackend() override {
    BudgetAllocator& budget = BudgetAllocator::instance();
    budget.setGuard(nullptr);
    budget.setLimit(0, "");
    budget.clearExternal();
    c10::SetCPUAllocator(previous_, kPriority);
  }

  std::string name() const override { return "cpu-budget"; }
  std::int64_t limitBytes() const override { return limit_; }
  std::string limitSource() const override {
    std::string text = source_;
    if (explicit_limit_ == 0) {
      text += ", plus the " + std::to_string(limit_ - default_headroom_) +
              " bytes of tensors held at setup";
    } else if (clipped()) {
      text += " " + std::to_string(explicit_limit_) +
              ", clipped to what this process can use: " + std::to_string(usableBytes()) +
              " bytes, the room left at setup under " + room_.brief + ", plus the " +
              std::to_string(held_bytes_) + " bytes of tensors held then";
    }
    if (guard_) {
      text += "; the whole process is kept " + std::to_string(guard_->marginBytes()) +
              " bytes under " + guard_->describe();
    }
    return text;
  }
  std::int64_t currentBytes() const override { return BudgetAllocator::instance().current(); }
  // Measured again now that the model (and the runner's host snapshot of its weights, which the
  // budget does not count) is in memory: the default limit is the room left now plus the tensors
  // held now, and the guard's baseline usage is taken at the same moment.
  void finishSetup(std::int64_t untracked_model_bytes) override {
    BudgetAllocator& budget = BudgetAllocator::instance();
    budget.addExternal(untracked_model_bytes);
    trimHeap();  // the headroom and the guard's baseline are both read from a trimmed heap
    if (guard_) budget.underLock([this] { guard_->setBaseline(); });
    measureHeadroom();
    held_bytes_ = budget.current();
    applyLimit();
  }
  void beginTrial() override {
    BudgetAllocator::instance().resetPeak();
    BudgetAllocator::instance().beginTrialOnThisThread();
    if (guard_) BudgetAllocator::instance().underLock([this] { guard_->resetPeak(); });
  }
  // Peak compared with the limit: the tensors' peak, or, when the limit is the system's (no
  // --memory-limit) and larger, the process's own peak need as the guard sampled it (what its
  // usage grew by since setup, plus the tensors held then: the limit is the room left at setup
  // plus those tensors). That need counts what the kernel counts and the budget cannot see:
  // glibc's retained free chunks, oneDNN's scratch and primitive cache, thread stacks.
  MemoryPeaks endTrial() override {
    BudgetAllocator::instance().endTrial();
    MemoryPeaks peaks;
    peaks.peak_allocated_bytes = BudgetAllocator::instance().peak();
    peaks.phase_peaks = BudgetAllocator::instance().phasePeaks();
    peaks.peak_reserved_bytes = peaks.peak_allocated_bytes;
    peaks.peak_bytes = peaks.peak_allocated_bytes;
    if (guard_ && explicit_limit_ == 0) {
      const std::int64_t grown_bytes = BudgetAllocator::instance().underLock(
          [this] { return guard_->peakNeedBytes() - guard_->baselineNeedBytes(); });
      peaks.peak_bytes = std::max(peaks.peak_bytes, grown_bytes + held_bytes_);
    }
    return peaks;
  }
  // glibc keeps freed chunks; a cgroup counts them. Where the process's own room binds (no
  // --memory-limit, or one above half of what the process can use), each trial starts from the
  // same resident set: the guard compares that set with the kernel's limit. Under a smaller
  // explicit limit the resident set cannot come near the room (the tensors' peak is the limit),
  // and trimming only cost time: 20-60 ms a trial, 5-8% of a step at the answer (issue 44,
  // scripts/bench/race.py on GPT-2 and the MLP), plus the next trial's page faults.
  // tests/memory/cpu_budget_test.cpp.
  void releaseCaches() override {
    if (explicit_limit_ > 0 && explicit_limit_ <= usableBytes() / 2) return;
    trimHeap();
  }
  void synchronize() override {}
  std::vector<std::string> limitWarnings() const override {
    std::vector<std::string> warnings;
    // An explicit limit is a tensor budget; the process itself cannot pass what the kernel
    // enforces, so a budget above that is clipped to it.
    if (clipped()) {
      auto both = [](std::int64_t bytes) {
        return formatBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
      };
      const std::int64_t usable = usableBytes();
      warnings.push_back(
          std::string("--memory-limit ") + (reserve_ > 0 ? "less --reserve, " : "") +
          both(explicit_limit_ - reserve_) + ", is more than this process can use, " +
          both(usable) + ": the room left at setup under " + room_.brief +
          ", plus the tensors held then. The trials ran under that, as without --memory-limit, "
          "so the answer is this machine's, not that of the emulated device; to emulate a "
          "smaller device give --memory-limit " +
          std::to_string(saturatedAdd(usable, reserve_)) +
          "B or less, or leave it out to use all the process can");
    }
    if (guard_) {
      const auto changes =
          BudgetAllocator::instance().underLock([this] { return guard_->limitChanges(); });
      warnings.insert(warnings.end(), changes.begin(), changes.end());
    }
    const auto [count, bytes] = BudgetAllocator::instance().foreign();
    if (count > foreign_at_start_.first) {
      warnings.push_back(
          "other threads of this process allocated " +
          formatBytes(bytes - foreign_at_start_.second) + " in " +
          std::to_string(count - foreign_at_start_.first) +
          " tensors while the trials ran (a data loader, another model): the budget allocator is "
          "process-wide, so they counted in the trials' peaks and the answer may be smaller than "
          "what the job holds alone; search with nothing else running in the process");
    }
    return warnings;
  }
  bool processLimitNear(std::int64_t peak_bytes, std::int64_t failed_request_bytes) const override {
    if (const InjectedProcessLimit near = injectedProcessLimit()) {
      return near(peak_bytes, failed_request_bytes);
    }
    if (process_.bytes == std::numeric_limits<std::int64_t>::max()) return false;  // no limit
    return failed_request_bytes > 0 || peak_bytes + failed_request_bytes >= process_.bytes / 2;
  }

 private:
  static constexpr std::uint8_t kPriority = 0;

  // The room the process limits and MemAvailable leave now (the default limit's part).
  void measureHeadroom() {
    process_ = processHeadroom();
    Headroom headroom = process_;
    if (const auto available = readKbLine("/proc/meminfo", "MemAvailable")) {
      headroom.offer(*available, "MemAvailable " + std::to_string(*available),
                     "the system's MemAvailable");
    }
    room_ = headroom;
    if (explicit_limit_ == 0) {
      default_headroom_ = headroom.bytes;
      source_ = headroom.source.empty() ? "no system limit found" : headroom.source;
    }
  }

  static void trimHeap() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }

  // What the process can use: the room left at the last measurement plus the tensors held then.
  std::int64_t usableBytes() const { return saturatedAdd(room_.bytes, held_bytes_); }
  // An explicit limit whose budget (less the reserve) is above what the process can use: the
  // trials run under the machine's room instead, as without the flag. A budget of 8 EiB
  // (--memory-limit 9223372036854775807) ran a Linear(5, 5) at batch 767,815,383 that grew to
  // 15 GB (issue 27, row 11): the search's jumps follow the limit.
  bool clipped() const { return explicit_limit_ > 0 && explicit_limit_ - reserve_ > usableBytes(); }
  static std::int64_t saturatedAdd(std::int64_t a, std::int64_t b) {
    return a > std::numeric_limits<std::int64_t>::max() - b
               ? std::numeric_limits<std::int64_t>::max()
               : a + b;
  }

  void applyLimit() {
    if (explicit_limit_ > 0) {
      limit_ = clipped() ? saturatedAdd(usableBytes(), reserve_) : explicit_limit_;
    } else {
      // The headroom was measured while these tensors were already held.
      limit_ = default_headroom_ > std::numeric_limits<std::int64_t>::max() - held_bytes_
                   ? std::numeric_limits<std::int64_t>::max()
                   : default_headroom_ + held_bytes_;
    }
    BudgetAllocator::instance().setLimit(std::max<std::int64_t>(limit_ - reserve_, 1),
                                         limitSource());
  }

  c10::Allocator* previous_ = nullptr;
  std::unique_ptr<ProcessMemoryGuard> guard_;
  Headroom process_;
  Headroom room_;  // the room the process limits and MemAvailable left at the last measurement
  std::int64_t reserve_ = 0;
  std::int64_t explicit_limit_ = 0;
  std::int64_t default_headroom_ = 0;
  std::int64_t held_bytes_ = 0;  // tensors counted when the headroom was last measured
  std::pair<std::int64_t, std::int64_t> foreign_at_start_;  // BudgetAllocator::foreign() then
  std::int64_t limit_ = 0;
  std::string source_;
};

}  // namespace

std::unique_ptr<MemoryBackend> makeCpuBudgetBackend(std::int64_t memory_limit_bytes,
                                                    std::int64_t reserve_bytes) {
  return std::make_unique<CpuBudgetBackend>(memory_limit_bytes, reserve_bytes);
}

bool isBudgetTracked(const void* data) { return BudgetAllocator::instance().tracked(data); }

void watchBudgetExternal(std::uintptr_t weak_storage, std::int64_t bytes) {
  // torch.UntypedStorage._weak_ref() returns the StorageImpl* (make_weak<StorageImpl>).
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a pointer Python handed over as an int
  c10::intrusive_ptr_target* storage = reinterpret_cast<c10::StorageImpl*>(weak_storage);
  BudgetAllocator::instance().watchExternal(storage, bytes);
}

std::pair<std::uint64_t, std::string> budgetRefusals() {
  return BudgetAllocator::instance().refusals();
}

std::pair<std::int64_t, std::int64_t> budgetForeignAllocations() {
  return BudgetAllocator::instance().foreign();
}

std::pair<std::int64_t, std::int64_t> budgetOwnPeak() {
  return BudgetAllocator::instance().ownPeak();
}

void setBudgetRefusalSuffix(std::string suffix) {
  BudgetAllocator::instance().setRefusalSuffix(std::move(suffix));
}

std::int64_t startAllocationLog() { return BudgetAllocator::instance().startLog(); }

std::vector<AllocationEvent> stopAllocationLog() { return BudgetAllocator::instance().stopLog(); }

void recordBudgetPhasePeak(TrialPhase phase, int micro, std::int64_t bytes) {
  BudgetAllocator::instance().addPhasePeak(phase, micro, bytes);
}

void setTrialPoint(const TrialPoint& point) { BudgetAllocator::instance().setPoint(point); }

void setInjectedFault(InjectedFault fault) {
  BudgetAllocator::instance().setFault(std::move(fault));
}

void setInjectedError(InjectedError error) {
  BudgetAllocator::instance().setError(std::move(error));
}

void setInjectedProcessLimit(InjectedProcessLimit near) {
  const std::lock_guard<std::mutex> lock(injected_process_limit_mutex);
  injected_process_limit = std::move(near);
}

}  // namespace autobatch::detail
