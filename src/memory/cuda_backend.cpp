// The CUDA memory backend's logic, LibTorch-free: every CUDA call goes through detail::CudaApi
// (cuda_api.h), so this file is compiled into the core and tested on the CPU against a fake that
// behaves as LibTorch 2.11 does (tests/memory/cuda_backend_test.cpp). What it decides:
// - the limit: --memory-limit (clipped to totalGlobalMem, with a warning), else totalGlobalMem;
//   the allocator configuration's per_process_memory_fraction caps it too, and so does a memory
//   fraction the process already set (the user's set_per_process_memory_fraction before
//   autobatch.find): the lowest bound wins, the source says which, and the destructor restores
//   the process's fraction;
// - the setup order: the runner's warm-up step first, then synchronize, clear the cuBLAS
//   workspaces, empty the cache, and only then read the outside part (device usage less the
//   allocator's reserved bytes) and apply the memory fraction;
// - the fraction: (limit - reserve - outside [- one 20 MiB page with expandable segments]) of
//   totalGlobalMem (the allocator's own base in 2.11, not cudaMemGetInfo's total), re-applied lower
//   whenever the outside part grows after a trial;
// - refusals: PYTORCH_NO_CUDA_MEMORY_CACHING (no fraction, no statistics) and
// backend:cudaMallocAsync;
// - a poisoned device (a sticky CUDA error): no device call after it, nothing thrown from the
//   destructor.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "memory/cuda_api.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {
namespace {

// kLargeBuffer in c10/cuda/CUDACachingAllocator.cpp: expandable segments map large blocks in
// pages of this size.
constexpr std::int64_t kExpandablePageBytes = kCudaCachingAllocatorUnits.page_bytes;

std::string deviceName(int index) { return "cuda:" + std::to_string(index); }

class CudaBackend final : public MemoryBackend {
 public:
  CudaBackend(std::unique_ptr<CudaApi> api, int index, std::int64_t memory_limit_bytes,
              std::int64_t reserve_bytes)
      : api_(std::move(api)), index_(index), reserve_(reserve_bytes) {
    const int count = api_->deviceCount();
    if (index < 0 || index >= count) {
      throw Error("device '" + deviceName(index) + "': expected a visible CUDA device, " +
                  "but the CUDA runtime sees " + std::to_string(count) +
                  "; check CUDA_VISIBLE_DEVICES and the driver, or use --device cpu");
    }
    const CudaAllocatorFacts facts = api_->allocatorFacts();
    recordConfig(facts);
    if (facts.caching_disabled) {
      throw Error(
          "PYTORCH_NO_CUDA_MEMORY_CACHING: expected the caching allocator, but it is turned off: "
          "then no memory fraction applies and every peak statistic reads 0, so no trial can be "
          "measured; unset PYTORCH_NO_CUDA_MEMORY_CACHING for the search (the training job may "
          "keep it)");
    }
    if (facts.backend != "native") {
      throw Error("allocator configuration (" + setup_.config +
                  "): expected the native caching allocator, but got backend:" + facts.backend +
                  "; its limit and statistics follow other rules, so a search under it would "
                  "measure the wrong thing; unset backend:" +
                  facts.backend +
                  " in PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF for the search");
    }
    expandable_ = facts.expandable_segments;
    setup_.expandable_segments = expandable_;
    api_->initAllocator(index_);
    total_global_ = api_->totalGlobalMemBytes(index_);
    saved_fraction_ = api_->memoryFraction(index_);
    if (memory_limit_bytes > total_global_) {
      // Clipped: the memory fraction cannot pass 1, and the search's jumps follow the limit (an
      // 8 EiB limit made it try batches the device could never hold; issue 27, row 11).
      warnings_.push_back("--memory-limit " + formatBytes(memory_limit_bytes) + " (" +
                          std::to_string(memory_limit_bytes) + " bytes) is more than " +
                          deviceName(index) + "'s total memory, " + formatBytes(total_global_) +
                          " (" + std::to_string(total_global_) +
                          " bytes): the limit was clipped to it, so the device's own memory is "
                          "the limit in effect; leave --memory-limit out to use all of it");
      limit_ = total_global_;
      source_ = "--memory-limit " + std::to_string(memory_limit_bytes) + ", clipped to " +
                deviceName(index) + "'s total memory (totalGlobalMem)";
    } else if (memory_limit_bytes > 0) {
      limit_ = memory_limit_bytes;
      source_ = "--memory-limit (memory fraction of " + deviceName(index) + ")";
    } else {
      limit_ = total_global_;
      source_ = deviceName(index) + " total memory (totalGlobalMem)";
    }
    if (facts.config_fraction < 1.0) {
      const auto config_cap =
          static_cast<std::int64_t>(facts.config_fraction * static_cast<double>(total_global_));
      if (config_cap < limit_) {
        source_ = "per_process_memory_fraction:" + std::to_string(facts.config_fraction) +
                  " in the allocator configuration (" + setup_.config + ") of " +
                  deviceName(index) + "'s total memory, lower than " + source_;
        limit_ = config_cap;
      } else {
        source_ += " (lower than the allocator configuration's per_process_memory_fraction:" +
                   std::to_string(facts.config_fraction) + ")";
      }
      // Ours replaces LibTorch's cap: from now on the fraction must always be applied.
      must_apply_ = true;
    }
    capByProcessFraction(facts.config_fraction);
    must_apply_ = must_apply_ || memory_limit_bytes > 0 || reserve_bytes > 0;
  }

  ~CudaBackend() override {
    if (!fraction_set_ || poisoned_) return;
    try {
      api_->setMemoryFraction(saved_fraction_, index_);
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): never throw from here
    }
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda-caching"; }
  std::int64_t limitBytes() const override { return limit_; }
  std::string limitSource() const override { return source_; }
  std::int64_t currentBytes() const override { return api_->stats(index_).allocated_current_bytes; }
  bool needsWarmUp() const override { return true; }

  void finishSetup(std::int64_t /*untracked_model_bytes*/) override {
    // The warm-up step left cached blocks and a cuBLAS workspace (32 MiB per handle and stream on
    // sm_90) in the allocator: counted now, they would sit in the baseline, and every trial
    // after the first would end below it.
    api_->synchronize(index_);
    api_->clearCublasWorkspaces();
    api_->emptyCache();
    outside_ = outsideNow();
    setup_done_ = true;
    applyFraction();
  }

  void beginTrial() override {
    if (poisoned_) return;
    api_->resetPeakStats(index_);
    const CudaAllocatorStats stats = api_->stats(index_);
    retries_at_start_ = stats.num_alloc_retries;
    trial_allocated_peak_ = stats.allocated_peak_bytes;
    trial_reserved_peak_ = stats.reserved_peak_bytes;
    trial_inactive_split_peak_ = stats.inactive_split_peak_bytes;
    phase_ = TrialPhase::kIdle;
    phase_peaks_.clear();
  }

  // The allocator keeps one peak: read it for the phase that ends, fold it into the trial's, and
  // reset it for the phase that starts (resetPeakStats sets every peak to its current value).
  void enterPhase(TrialPhase phase, int micro) override {
    if (poisoned_) return;
    closePhase();
    api_->resetPeakStats(index_);
    phase_ = phase;
    micro_ = micro;
  }

  MemoryPeaks endTrial() override {
    MemoryPeaks peaks;
    if (poisoned_) return peaks;
    api_->synchronize(index_);
    closePhase();
    phase_ = TrialPhase::kIdle;
    const CudaAllocatorStats stats = api_->stats(index_);
    if (setup_done_) {
      // Kernel modules load lazily (the default since CUDA 12.2), cuDNN and cuBLASLt create
      // handles at first use: the outside part can grow with every new kind of kernel.
      const std::int64_t now = outsideNow(stats);
      if (now > outside_) {
        peaks.outside_growth_bytes = now - outside_;
        growth_ += now - outside_;
        outside_ = now;
        applyFraction();
      }
    }
    peaks.peak_allocated_bytes = trial_allocated_peak_;
    peaks.peak_reserved_bytes = trial_reserved_peak_;
    peaks.phase_peaks = phase_peaks_;
    peaks.peak_bytes = peaks.peak_reserved_bytes + outside_;
    peaks.allocator_retries = stats.num_alloc_retries - retries_at_start_;
    peaks.inactive_split_peak_bytes = trial_inactive_split_peak_;
    return peaks;
  }

  void releaseCaches() override {
    if (poisoned_) return;
    api_->synchronize(index_);
    api_->clearCublasWorkspaces();
    api_->emptyCache();
  }
  void synchronize() override {
    if (!poisoned_) api_->synchronize(index_);
  }
  bool processLimitNear(std::int64_t /*peak_bytes*/,
                        std::int64_t /*failed_request_bytes*/) const override {
    return false;
  }
  AllocatorInfo allocatorInfo() const override { return setup_; }
  std::int64_t outsideBytes() const override { return outside_; }
  std::int64_t outsideGrowthBytes() const override { return growth_; }
  std::vector<std::string> limitWarnings() const override {
    std::vector<std::string> warnings = warnings_;
    if (growth_ > 0) {
      warnings.push_back("memory outside the caching allocator grew by " + formatBytes(growth_) +
                         " after setup (lazily loaded kernels, library handles); the memory "
                         "fraction was lowered to keep the device under the limit, and trials "
                         "before the growth were measured with the smaller outside part");
    }
    return warnings;
  }
  void markPoisoned() override { poisoned_ = true; }
  bool poisoned() const override { return poisoned_; }

 private:
  void recordConfig(const CudaAllocatorFacts& facts) {
    // What the search reads the peaks in (SearchOptions::allocation_units).
    setup_.allocation_units = kCudaCachingAllocatorUnits;
    setup_.pytorch_alloc_conf = facts.pytorch_alloc_conf;
    setup_.pytorch_cuda_alloc_conf = facts.pytorch_cuda_alloc_conf;
    if (facts.pytorch_alloc_conf) {
      setup_.config = *facts.pytorch_alloc_conf;
    } else if (facts.pytorch_cuda_alloc_conf) {
      setup_.config = "PYTORCH_CUDA_ALLOC_CONF=" + *facts.pytorch_cuda_alloc_conf;
    }
    // c10/core/AllocatorConfig.h: PYTORCH_ALLOC_CONF first for the generic keys;
    // c10/cuda/CUDAAllocatorConfig.h: PYTORCH_CUDA_ALLOC_CONF first for backend and
    // per_process_memory_fraction.
    if (facts.pytorch_alloc_conf && facts.pytorch_cuda_alloc_conf) {
      setup_.config_env = "both";
      warnings_.emplace_back(
          "both PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF are set: LibTorch 2.11 reads the "
          "generic keys (expandable_segments, max_split_size_mb, ...) from PYTORCH_ALLOC_CONF and "
          "backend and per_process_memory_fraction from PYTORCH_CUDA_ALLOC_CONF; keep one");
    } else if (facts.pytorch_alloc_conf) {
      setup_.config_env = "PYTORCH_ALLOC_CONF";
    } else if (facts.pytorch_cuda_alloc_conf) {
      setup_.config_env = "PYTORCH_CUDA_ALLOC_CONF";
    }
  }

  // A memory fraction this process already set (torch.cuda.set_per_process_memory_fraction in
  // the user's code before autobatch.find) caps the user's job as it caps the trials: the limit is
  // its share of totalGlobalMem when lower, the source says so, and the destructor puts it back.
  // The configuration's fraction (handled above) is also what memoryFraction() reads at start.
  void capByProcessFraction(double config_fraction) {
    if (saved_fraction_ >= 1.0 || saved_fraction_ == config_fraction) return;
    const auto cap =
        static_cast<std::int64_t>(saved_fraction_ * static_cast<double>(total_global_));
    const std::string set = "the memory fraction " + std::to_string(saved_fraction_) +
                            " already set in this process (set_per_process_memory_fraction) of " +
                            deviceName(index_) + "'s total memory";
    if (cap < limit_) {
      source_ = set + ", lower than " + source_;
      limit_ = cap;
    } else {
      source_ += " (lower than " + set + ")";
    }
    must_apply_ = true;  // ours replaces it during the search; the destructor restores it
  }

  void closePhase() {
    const CudaAllocatorStats stats = api_->stats(index_);
    trial_allocated_peak_ = std::max(trial_allocated_peak_, stats.allocated_peak_bytes);
    trial_reserved_peak_ = std::max(trial_reserved_peak_, stats.reserved_peak_bytes);
    trial_inactive_split_peak_ =
        std::max(trial_inactive_split_peak_, stats.inactive_split_peak_bytes);
    recordPhasePeak(phase_peaks_, phase_, micro_, stats.allocated_peak_bytes);
  }

  // Device usage less what the caching allocator holds: this process's CUDA context, kernels and
  // library handles, plus any other process on the device (conservative on a shared GPU).
  std::int64_t outsideNow() { return outsideNow(api_->stats(index_)); }
  std::int64_t outsideNow(const CudaAllocatorStats& stats) {
    const CudaMemInfo info = api_->memInfo(index_);
    return std::max<std::int64_t>(info.total_bytes - info.free_bytes - stats.reserved_current_bytes,
                                  0);
  }

  void applyFraction() {
    if (!must_apply_) return;
    const std::int64_t page = expandable_ ? kExpandablePageBytes : 0;
    const std::int64_t allowance = limit_ - reserve_ - outside_ - page;
    if (allowance <= 0) {
      throw Error("memory limit: expected more than the " + formatBytes(outside_) + " " +
                  deviceName(index_) + " holds outside the caching allocator plus the reserve (" +
                  formatBytes(reserve_) + ")" +
                  (page > 0 ? " and one 20 MiB expandable-segment page" : "") + ", but got " +
                  formatBytes(limit_) + " (" + source_ +
                  "); raise --memory-limit or lower --reserve");
    }
    const double fraction =
        std::min(static_cast<double>(allowance) / static_cast<double>(total_global_), 1.0);
    api_->setMemoryFraction(fraction, index_);
    setup_.fraction = fraction;
    fraction_set_ = true;
  }

  std::unique_ptr<CudaApi> api_;
  int index_;
  std::int64_t reserve_;
  std::int64_t total_global_ = 0;
  std::int64_t outside_ = 0;
  std::int64_t growth_ = 0;
  std::int64_t limit_ = 0;
  std::int64_t retries_at_start_ = 0;
  std::int64_t trial_allocated_peak_ = 0;  // the peaks over the trial's phases so far
  std::int64_t trial_reserved_peak_ = 0;
  std::int64_t trial_inactive_split_peak_ = 0;
  TrialPhase phase_ = TrialPhase::kIdle;
  int micro_ = 0;
  std::vector<PhasePeakBytes> phase_peaks_;
  double saved_fraction_ = 1.0;
  bool must_apply_ = false;
  bool fraction_set_ = false;
  bool setup_done_ = false;
  bool expandable_ = false;
  bool poisoned_ = false;
  std::string source_;
  AllocatorInfo setup_;
  std::vector<std::string> warnings_;
};

}  // namespace

std::unique_ptr<MemoryBackend> makeCudaBackendWith(std::unique_ptr<CudaApi> api, int index,
                                                   std::int64_t memory_limit_bytes,
                                                   std::int64_t reserve_bytes) {
  if (!api) {
    throw Error(
        "device: expected cpu, but got a CUDA device; this autobatch was built with a "
        "LibTorch without CUDA (use --device cpu or rebuild against a CUDA LibTorch)");
  }
  return std::make_unique<CudaBackend>(std::move(api), index, memory_limit_bytes, reserve_bytes);
}

std::string resolveDeviceName(const std::string& device, int current_device) {
  if (device == "cuda") return deviceName(current_device);
  return device;
}

}  // namespace autobatch::detail
