// Compiled only when LibTorch has CUDA (see src/CMakeLists.txt): the ONLY file that includes CUDA
// headers. Device information (version.h) and the CUDA memory backend of the trial runner.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>

#include "autobatch/error.h"
#include "autobatch/units.h"
#include "cuda_device.h"
#include "memory_backend.h"

namespace autobatch::detail {

std::vector<CudaDeviceInfo> cudaDevices() {
  std::vector<CudaDeviceInfo> devices;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back(
        {i, prop.name, static_cast<std::int64_t>(prop.totalGlobalMem), prop.major, prop.minor});
  }
  return devices;
}

std::string cudaRuntimeVersion() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string((CUDART_VERSION % 1000) / 10);
}

int cudaDriverVersion() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) return 0;
  return version;
}

}  // namespace autobatch::detail

namespace autobatch::detail {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class CudaBackend final : public MemoryBackend {
 public:
  CudaBackend(int index, std::int64_t memory_limit_bytes, std::int64_t reserve_bytes)
      : index_(static_cast<c10::DeviceIndex>(index)) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || index < 0 || index >= count) {
      cudaGetLastError();
      throw Error("device 'cuda:" + std::to_string(index) + "': expected a visible CUDA device, " +
                  "but the CUDA runtime sees " + std::to_string(count) +
                  "; check CUDA_VISIBLE_DEVICES and the driver, or use --device cpu");
    }
    if (const char* conf = std::getenv("PYTORCH_ALLOC_CONF")) {
      alloc_conf_ = conf;
    } else if (const char* old = std::getenv("PYTORCH_CUDA_ALLOC_CONF")) {
      alloc_conf_ = std::string("PYTORCH_CUDA_ALLOC_CONF=") + old;
    }
    const c10::cuda::CUDAGuard guard(index_);
    // The caching allocator's entry points assume it was initialised: one tensor does it. A small
    // matmul loads cuBLAS (its handle and workspace) before the outside part is measured.
    {
      const at::Tensor a = at::ones({64, 64}, at::TensorOptions().device(at::kCUDA, index_));
      const at::Tensor b = at::mm(a, a);
      c10::cuda::device_synchronize();
    }
    saved_fraction_ = alloc::getMemoryFraction(index_);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      throw Error("cuda:" + std::to_string(index) + ": cudaMemGetInfo failed after warm-up");
    }
    total_ = static_cast<std::int64_t>(total_bytes);
    const auto stats = alloc::getDeviceStats(index_);
    const std::int64_t reserved = stats.reserved_bytes[0].current;
    // Device usage less what the caching allocator holds: this process's CUDA context and
    // kernels, plus any other process on the same device (conservative on a shared GPU).
    outside_ = std::max<std::int64_t>(total_ - static_cast<std::int64_t>(free_bytes) - reserved, 0);
    if (memory_limit_bytes > total_) {
      warnings_.push_back("--memory-limit " + formatBytes(memory_limit_bytes) +
                          " is more than cuda:" + std::to_string(index) + "'s total memory, " +
                          formatBytes(total_) +
                          ": the caching allocator's memory fraction is capped at 1, so the "
                          "device's own memory is the limit in effect");
    }
    if (memory_limit_bytes > 0) {
      limit_ = memory_limit_bytes;
      source_ = "--memory-limit (memory fraction of cuda:" + std::to_string(index) + ")";
    } else {
      limit_ = total_;
      source_ = "cuda:" + std::to_string(index) + " total memory (free " +
                std::to_string(free_bytes) + " at start plus what processes hold)";
    }
    if (memory_limit_bytes > 0 || reserve_bytes > 0) {
      const double fraction =
          static_cast<double>(limit_ - reserve_bytes - outside_) / static_cast<double>(total_);
      if (fraction <= 0.0) {
        throw Error("memory limit: expected more than the " + std::to_string(outside_) +
                    " bytes cuda:" + std::to_string(index) +
                    " holds outside the caching allocator plus the reserve, but got " +
                    std::to_string(limit_) + " bytes; raise --memory-limit or lower --reserve");
      }
      alloc::setMemoryFraction(std::min(fraction, 1.0), index_);
      fraction_set_ = true;
    }
  }

  ~CudaBackend() override {
    if (fraction_set_) alloc::setMemoryFraction(saved_fraction_, index_);
  }

  std::string name() const override { return "cuda-caching"; }
  std::int64_t limitBytes() const override { return limit_; }
  std::string limitSource() const override { return source_; }
  std::int64_t currentBytes() const override {
    return alloc::getDeviceStats(index_).allocated_bytes[0].current;
  }
  void finishSetup(std::int64_t /*untracked_model_bytes*/) override {}
  void beginTrial() override {
    alloc::resetPeakStats(index_);
    retries_at_start_ = alloc::getDeviceStats(index_).num_alloc_retries;
  }
  MemoryPeaks endTrial() override {
    c10::cuda::device_synchronize();
    const auto stats = alloc::getDeviceStats(index_);
    MemoryPeaks peaks;
    peaks.peak_allocated_bytes = stats.allocated_bytes[0].peak;
    peaks.peak_reserved_bytes = stats.reserved_bytes[0].peak;
    peaks.peak_bytes = peaks.peak_reserved_bytes + outside_;
    peaks.allocator_retries = stats.num_alloc_retries - retries_at_start_;
    return peaks;
  }
  void releaseCaches() override {
    c10::cuda::device_synchronize();
    at::cuda::clearCublasWorkspaces();
    alloc::emptyCache();
  }
  void synchronize() override { c10::cuda::device_synchronize(); }
  bool processLimitNear(std::int64_t /*peak_bytes*/,
                        std::int64_t /*failed_request_bytes*/) const override {
    return false;
  }
  std::string allocatorConfig() const override { return alloc_conf_; }
  std::int64_t outsideBytes() const override { return outside_; }
  std::vector<std::string> limitWarnings() const override { return warnings_; }

 private:
  c10::DeviceIndex index_;
  std::int64_t total_ = 0;
  std::int64_t outside_ = 0;
  std::int64_t limit_ = 0;
  std::int64_t retries_at_start_ = 0;
  double saved_fraction_ = 1.0;
  bool fraction_set_ = false;
  std::string source_;
  std::string alloc_conf_;
  std::vector<std::string> warnings_;
};

}  // namespace

std::unique_ptr<MemoryBackend> makeCudaBackend(int index, std::int64_t memory_limit_bytes,
                                               std::int64_t reserve_bytes) {
  return std::make_unique<CudaBackend>(index, memory_limit_bytes, reserve_bytes);
}

double cudaMemoryFraction(int index) {
  return alloc::getMemoryFraction(static_cast<c10::DeviceIndex>(index));
}

std::int64_t cudaFreeBytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(free_bytes);
}

}  // namespace autobatch::detail
