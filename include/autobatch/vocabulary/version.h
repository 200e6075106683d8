// autobatch/vocabulary/version.h — what autobatch was built with and which devices it sees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autobatch {

/// One CUDA device as the CUDA runtime reports it.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  /// Total device memory in bytes (cudaGetDeviceProperties().totalGlobalMem).
  std::int64_t total_bytes = 0;
  /// Compute capability, e.g. 9.0 for an H100/H200.
  int major = 0;
  int minor = 0;
};

/// Build and runtime facts printed by `autobatch --version` and recorded in the JSON report.
struct BuildInfo {
  std::string autobatch_version;  ///< e.g. "0.1.0" (CMake project version)
  std::string libtorch_version;   ///< TORCH_VERSION of the LibTorch built against, e.g. "2.11.0"
  bool cuda_build = false;        ///< LibTorch (and autobatch) were built with CUDA
  std::string cuda_version;       ///< CUDA runtime version built against, e.g. "13.0"; "" if none
  int cuda_driver_version = 0;    ///< cudaDriverGetVersion(), e.g. 13000; 0 without a driver
  std::vector<CudaDeviceInfo> cuda_devices;  ///< empty when no GPU is visible
};

/// Gathers BuildInfo. Side effects: initialises the CUDA runtime when LibTorch has CUDA (no
/// memory is allocated on the device). Thread safety: safe to call from any thread.
BuildInfo buildInfo();

/// A multi-line human summary of buildInfo(), as `autobatch --version` prints it.
std::string versionText(const BuildInfo& info);

}  // namespace autobatch
