// The CPU budget allocator: counts every CPU tensor's bytes and throws c10::OutOfMemoryError
// when an allocation would pass the limit. Includes c10 headers only (no torch/torch.h).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "autobatch/error.h"
#include "memory_backend.h"

namespace autobatch::detail {
namespace {

thread_local int t_untracked_depth = 0;

const char* phaseName(TrialPhase phase) {
  switch (phase) {
    case TrialPhase::kIdle:
      return "no step";
    case TrialPhase::kInputs:
      return "inputs";
    case TrialPhase::kForward:
      return "forward";
    case TrialPhase::kLoss:
      return "loss";
    case TrialPhase::kBackward:
      return "backward";
    case TrialPhase::kOptimizerStep:
      return "optimizer step";
  }
  return "unknown";
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
    if (t_untracked_depth > 0 || n == 0) {
      void* data = c10::alloc_cpu(n);
      return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fault_ && fault_(point_, bytes)) {
        TORCH_CHECK_WITH(OutOfMemoryError, false,
                         "CPU budget allocator: out of memory: tried to allocate ", bytes,
                         " bytes with ", current_, " bytes in use (injected in ",
                         phaseName(point_.phase), ")");
      }
      if (limit_ > 0 && current_ + bytes > limit_) {
        TORCH_CHECK_WITH(OutOfMemoryError, false,
                         "CPU budget allocator: out of memory: tried to allocate ", bytes,
                         " bytes with ", current_, " bytes in use under a limit of ", limit_,
                         " bytes (", source_, ")");
      }
      current_ += bytes;  // claimed before the real allocation, so threads cannot overshoot
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
    peak_ = std::max(peak_, current_);
    return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteTracked; }

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
  }
  void clearExternal() {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ -= external_;
    external_ = 0;
  }
  void setPoint(const TrialPoint& point) {
    std::lock_guard<std::mutex> lock(mutex_);
    point_ = point;
  }
  void setFault(InjectedFault fault) {
    std::lock_guard<std::mutex> lock(mutex_);
    fault_ = std::move(fault);
  }
  void setLimit(std::int64_t limit, std::string source) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
    source_ = std::move(source);
  }
  std::int64_t current() {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  std::int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void resetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
  }

 private:
  BudgetAllocator() = default;

  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::int64_t current_ = 0;
  std::int64_t peak_ = 0;
  std::int64_t external_ = 0;
  std::int64_t limit_ = 0;  // 0: no limit (not installed)
  std::string source_;
  TrialPoint point_;
  InjectedFault fault_;
};

std::optional<std::int64_t> readInt(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A "Key:   123 kB" line of /proc/self/status or /proc/meminfo, in bytes.
std::optional<std::int64_t> readKb(const std::string& path, const std::string& key) {
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

struct Headroom {
  std::int64_t bytes = std::numeric_limits<std::int64_t>::max();
  std::string source;
  void offer(std::int64_t candidate, const std::string& what) {
    if (candidate < bytes) {
      bytes = std::max<std::int64_t>(candidate, 0);
      source = what;
    }
  }
};

// Headroom left by the process limits (cgroup, RLIMIT_DATA, RLIMIT_AS); max when none is set.
Headroom processHeadroom() {
  Headroom h;
  // cgroup v2: this process's cgroup and its parents.
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string dir = line.substr(3);
    while (true) {
      const std::string base = "/sys/fs/cgroup" + dir;
      const auto max = readInt(base + "/memory.max");
      const auto current = readInt(base + "/memory.current");
      if (max && current) {
        h.offer(*max - *current, "cgroup memory.max " + std::to_string(*max) + " less its usage " +
                                     std::to_string(*current) + " (" + base + ")");
      }
      if (dir.empty() || dir == "/") break;
      dir = dir.substr(0, dir.rfind('/'));
    }
  }
  // cgroup v1.
  if (const auto max = readInt("/sys/fs/cgroup/memory/memory.limit_in_bytes");
      max && *max < (std::int64_t{1} << 60)) {
    const auto usage = readInt("/sys/fs/cgroup/memory/memory.usage_in_bytes").value_or(0);
    h.offer(*max - usage, "cgroup v1 memory.limit_in_bytes " + std::to_string(*max) +
                              " less its usage " + std::to_string(usage));
  }
  struct rlimit limit {};
  if (getrlimit(RLIMIT_DATA, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const auto used = readKb("/proc/self/status", "VmData").value_or(0);
    const auto cap = static_cast<std::int64_t>(limit.rlim_cur);
    h.offer(cap - used, "RLIMIT_DATA " + std::to_string(cap) + " less the process's VmData " +
                            std::to_string(used));
  }
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const auto used = readKb("/proc/self/status", "VmSize").value_or(0);
    const auto cap = static_cast<std::int64_t>(limit.rlim_cur);
    h.offer(cap - used, "RLIMIT_AS " + std::to_string(cap) + " less the process's VmSize " +
                            std::to_string(used));
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
    process_ = processHeadroom();
    Headroom headroom = process_;
    if (const auto available = readKb("/proc/meminfo", "MemAvailable")) {
      headroom.offer(*available, "MemAvailable at start " + std::to_string(*available));
    }
    if (memory_limit_bytes > 0) {
      explicit_limit_ = memory_limit_bytes;
      source_ = "--memory-limit";
    } else {
      default_headroom_ = headroom.bytes;
      source_ = headroom.source.empty() ? "no system limit found" : headroom.source;
    }
    c10::SetCPUAllocator(&budget, kPriority);
    if (c10::GetCPUAllocator() != &budget) {
      throw Error(
          "CPU budget allocator: expected c10::SetCPUAllocator to install it, but another CPU "
          "allocator of higher priority is registered; the CPU budget cannot be enforced");
    }
    start_bytes_ = budget.current();
    applyLimit();
  }

  ~CpuBudgetBackend() override {
    BudgetAllocator& budget = BudgetAllocator::instance();
    budget.setLimit(0, "");
    budget.clearExternal();
    c10::SetCPUAllocator(previous_, kPriority);
  }

  std::string name() const override { return "cpu-budget"; }
  std::int64_t limitBytes() const override { return limit_; }
  std::string limitSource() const override {
    if (explicit_limit_ > 0) return source_;
    return source_ + ", plus the " + std::to_string(limit_ - default_headroom_) +
           " bytes of tensors held at start";
  }
  std::int64_t currentBytes() const override { return BudgetAllocator::instance().current(); }
  void finishSetup(std::int64_t untracked_model_bytes) override {
    BudgetAllocator::instance().addExternal(untracked_model_bytes);
    external_ = untracked_model_bytes;
    applyLimit();
  }
  void beginTrial() override { BudgetAllocator::instance().resetPeak(); }
  MemoryPeaks endTrial() override {
    MemoryPeaks peaks;
    peaks.peak_allocated_bytes = BudgetAllocator::instance().peak();
    peaks.peak_reserved_bytes = peaks.peak_allocated_bytes;
    peaks.peak_bytes = peaks.peak_allocated_bytes;
    return peaks;
  }
  void releaseCaches() override {}
  void synchronize() override {}
  bool processLimitNear(std::int64_t peak_bytes, std::int64_t failed_request_bytes) const override {
    if (process_.bytes == std::numeric_limits<std::int64_t>::max()) return false;  // no limit
    return failed_request_bytes > 0 || peak_bytes + failed_request_bytes >= process_.bytes / 2;
  }

 private:
  static constexpr std::uint8_t kPriority = 0;

  void applyLimit() {
    if (explicit_limit_ > 0) {
      limit_ = explicit_limit_;
    } else {
      // The headroom was measured before the model (and its untracked tensors) counted.
      const std::int64_t held = start_bytes_ + external_;
      limit_ = default_headroom_ > std::numeric_limits<std::int64_t>::max() - held
                   ? std::numeric_limits<std::int64_t>::max()
                   : default_headroom_ + held;
    }
    BudgetAllocator::instance().setLimit(std::max<std::int64_t>(limit_ - reserve_, 1),
                                         limitSource());
  }

  c10::Allocator* previous_ = nullptr;
  Headroom process_;
  std::int64_t reserve_ = 0;
  std::int64_t explicit_limit_ = 0;
  std::int64_t default_headroom_ = 0;
  std::int64_t start_bytes_ = 0;
  std::int64_t external_ = 0;
  std::int64_t limit_ = 0;
  std::string source_;
};

}  // namespace

std::unique_ptr<MemoryBackend> makeCpuBudgetBackend(std::int64_t memory_limit_bytes,
                                                    std::int64_t reserve_bytes) {
  return std::make_unique<CpuBudgetBackend>(memory_limit_bytes, reserve_bytes);
}

UntrackedCpuScope::UntrackedCpuScope() { ++t_untracked_depth; }
UntrackedCpuScope::~UntrackedCpuScope() { --t_untracked_depth; }

bool isBudgetTracked(const void* data) { return BudgetAllocator::instance().tracked(data); }

void setTrialPoint(const TrialPoint& point) { BudgetAllocator::instance().setPoint(point); }

void setInjectedFault(InjectedFault fault) {
  BudgetAllocator::instance().setFault(std::move(fault));
}

}  // namespace autobatch::detail
