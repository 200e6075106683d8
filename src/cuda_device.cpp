// Compiled only when LibTorch has CUDA (see src/CMakeLists.txt): this file includes CUDA headers.
#include "cuda_device.h"

#include <cuda_runtime_api.h>

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
