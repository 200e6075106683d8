// Internal: the narrow seam between the CUDA memory backend's logic (cuda_backend.cpp,
// LibTorch-free, tested on the CPU against a fake) and the CUDA runtime / caching allocator
// (cuda_runtime.cpp, the only file that includes CUDA headers, compiled only when LibTorch has
// CUDA). Every call names its device explicitly; the adapter sets the current device around calls
// that need it. Errors: the adapter lets LibTorch's c10::Error (e.g. a sticky "device-side assert
// triggered" from synchronize) propagate as std::exception; the logic treats a throwing call
// after a fatal error as a poisoned device (see CudaBackend).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace autobatch::detail {

/// The caching allocator's statistics of one device (c10::cuda::CUDACachingAllocator::DeviceStats,
/// aggregate pool), in bytes.
struct CudaAllocatorStats {
  std::int64_t allocated_current_bytes = 0;
  std::int64_t allocated_peak_bytes = 0;
  std::int64_t reserved_current_bytes = 0;
  std::int64_t reserved_peak_bytes = 0;
  std::int64_t num_alloc_retries = 0;
  /// Bytes of the cached blocks that are split and not in use (DeviceStats::inactive_split_bytes,
  /// c10/core/CachingDeviceAllocator.h): memory reserved that only a request small enough to fit
  /// a fragment can use; its peak since the last resetPeakStats.
  std::int64_t inactive_split_current_bytes = 0;
  std::int64_t inactive_split_peak_bytes = 0;
};

/// cudaMemGetInfo of one device, in bytes. `total` may differ from totalGlobalMem (it does under
/// MIG and on some drivers); the caching allocator's fraction is of totalGlobalMem.
struct CudaMemInfo {
  std::int64_t free_bytes = 0;
  std::int64_t total_bytes = 0;
};

/// How LibTorch's caching allocator is configured in this process, as LibTorch itself reports it
/// (c10/cuda/CUDAAllocatorConfig.h, 2.11).
struct CudaAllocatorFacts {
  /// PYTORCH_NO_CUDA_MEMORY_CACHING is on (c10::utils::check_env == true): every allocation is a
  /// cudaMalloc, no fraction applies and every statistic reads 0.
  bool caching_disabled = false;
  /// The allocator's name(): "native" (the caching allocator) or "cudaMallocAsync".
  std::string backend = "native";
  /// expandable_segments:True: large blocks are mapped in 20 MiB pages (kLargeBuffer).
  bool expandable_segments = false;
  /// per_process_memory_fraction from the configuration (1.0 when not given).
  double config_fraction = 1.0;
  /// The environment as read at setup (nullopt: unset).
  std::optional<std::string> pytorch_alloc_conf;       ///< PYTORCH_ALLOC_CONF
  std::optional<std::string> pytorch_cuda_alloc_conf;  ///< PYTORCH_CUDA_ALLOC_CONF
};

/// The CUDA calls the memory backend makes. One instance per backend; called from one thread.
class CudaApi {
 public:
  CudaApi() = default;
  CudaApi(const CudaApi&) = delete;
  CudaApi& operator=(const CudaApi&) = delete;
  virtual ~CudaApi() = default;

  /// cudaGetDeviceCount; 0 when the runtime sees none (never throws).
  virtual int deviceCount() = 0;
  /// cudaDeviceProp::totalGlobalMem of `index`, in bytes.
  virtual std::int64_t totalGlobalMemBytes(int index) = 0;
  /// cudaMemGetInfo with `index` current.
  virtual CudaMemInfo memInfo(int index) = 0;
  /// Creates the caching allocator's state for `index` (one small tensor) so that its entry
  /// points may be called ("did you call init?").
  virtual void initAllocator(int index) = 0;
  virtual CudaAllocatorFacts allocatorFacts() = 0;
  virtual CudaAllocatorStats stats(int index) = 0;
  virtual void resetPeakStats(int index) = 0;
  /// The caching allocator's fraction of totalGlobalMem (1.0: no cap).
  virtual double memoryFraction(int index) = 0;
  /// Caps the caching allocator's reserved bytes at fraction x totalGlobalMem; range [0, 1]
  /// (LibTorch 2.11 throws outside it; 1.0 removes the cap).
  virtual void setMemoryFraction(double fraction, int index) = 0;
  /// Returns every cached, unused block to CUDA (emptyCache).
  virtual void emptyCache() = 0;
  /// Frees the cuBLAS / cuBLASLt workspaces (at::cuda::clearCublasWorkspaces): held per handle and
  /// stream inside the caching allocator until cleared; emptyCache alone cannot free them.
  virtual void clearCublasWorkspaces() = 0;
  /// cudaDeviceSynchronize on `index`; throws a sticky device error (c10::Error).
  virtual void synchronize(int index) = 0;
};

/// The real adapter (cuda_runtime.cpp); nullptr when built without CUDA.
std::unique_ptr<CudaApi> makeCudaRuntimeApi();

/// "cuda" -> "cuda:<current>", "cuda:N" and "cpu" unchanged. The one place where an index-less
/// CUDA device gets its index (torch.device('cuda') != torch.device('cuda:0') in 2.11, so a
/// comparison before resolving is wrong). `current_device` is the CUDA runtime's current device.
std::string resolveDeviceName(const std::string& device, int current_device);

}  // namespace autobatch::detail
