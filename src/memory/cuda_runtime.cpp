// Compiled only when LibTorch has CUDA (see src/CMakeLists.txt): the ONLY file that includes CUDA
// headers. Device information (version.h) and the real detail::CudaApi (cuda_api.h) behind the
// CUDA memory backend, whose logic is the LibTorch-free cuda_backend.cpp.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/env.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>

#include "memory/cuda_api.h"
#include "memory/cuda_device.h"
#include "memory/memory_backend.h"

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

// The real CUDA calls behind detail::CudaApi: thin, no decisions (those are cuda_backend.cpp's).
class CudaRuntimeApi final : public CudaApi {
 public:
  int deviceCount() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the "no device" error so later calls start clean
      return 0;
    }
    return count;
  }
  std::int64_t totalGlobalMemBytes(int index) override {
    cudaDeviceProp prop{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    return static_cast<std::int64_t>(prop.totalGlobalMem);
  }
  CudaMemInfo memInfo(int index) override {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return {static_cast<std::int64_t>(free_bytes), static_cast<std::int64_t>(total_bytes)};
  }
  void initAllocator(int index) override {
    const at::Tensor t = at::ones({1}, at::TensorOptions().device(at::kCUDA, index));
    c10::cuda::device_synchronize();
  }
  CudaAllocatorFacts allocatorFacts() override {
    CudaAllocatorFacts facts;
    facts.caching_disabled = c10::utils::check_env("PYTORCH_NO_CUDA_MEMORY_CACHING") == true;
    facts.backend = alloc::name();
    facts.expandable_segments = alloc::CUDAAllocatorConfig::expandable_segments();
    facts.config_fraction = alloc::CUDAAllocatorConfig::per_process_memory_fraction();
    facts.pytorch_alloc_conf = c10::utils::get_env("PYTORCH_ALLOC_CONF");
    facts.pytorch_cuda_alloc_conf = c10::utils::get_env("PYTORCH_CUDA_ALLOC_CONF");
    return facts;
  }
  CudaAllocatorStats stats(int index) override {
    const auto s = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    CudaAllocatorStats out;
    out.allocated_current_bytes = s.allocated_bytes[0].current;
    out.allocated_peak_bytes = s.allocated_bytes[0].peak;
    out.reserved_current_bytes = s.reserved_bytes[0].current;
    out.reserved_peak_bytes = s.reserved_bytes[0].peak;
    out.num_alloc_retries = s.num_alloc_retries;
    out.inactive_split_current_bytes = s.inactive_split_bytes[0].current;
    out.inactive_split_peak_bytes = s.inactive_split_bytes[0].peak;
    return out;
  }
  void resetPeakStats(int index) override {
    alloc::resetPeakStats(static_cast<c10::DeviceIndex>(index));
  }
  double memoryFraction(int index) override {
    return alloc::getMemoryFraction(static_cast<c10::DeviceIndex>(index));
  }
  void setMemoryFraction(double fraction, int index) override {
    alloc::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index));
  }
  void emptyCache() override { alloc::emptyCache(); }
  void clearCublasWorkspaces() override { at::cuda::clearCublasWorkspaces(); }
  void synchronize(int index) override {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    c10::cuda::device_synchronize();
  }
};

}  // namespace

std::unique_ptr<CudaApi> makeCudaRuntimeApi() { return std::make_unique<CudaRuntimeApi>(); }

std::unique_ptr<MemoryBackend> makeCudaBackend(int index, std::int64_t memory_limit_bytes,
                                               std::int64_t reserve_bytes) {
  return makeCudaBackendWith(makeCudaRuntimeApi(), index, memory_limit_bytes, reserve_bytes);
}

int cudaCurrentDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return 0;
  }
  return c10::cuda::current_device();
}

}  // namespace autobatch::detail
