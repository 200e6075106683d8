// Compiled when LibTorch has no CUDA: no device, no runtime.
#include "memory/cuda_api.h"
#include "memory/cuda_device.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {

std::vector<CudaDeviceInfo> cudaDevices() { return {}; }
std::string cudaRuntimeVersion() { return ""; }
int cudaDriverVersion() { return 0; }
int cudaCurrentDevice() { return 0; }

std::unique_ptr<CudaApi> makeCudaRuntimeApi() { return nullptr; }

std::unique_ptr<MemoryBackend> makeCudaBackend(int index, std::int64_t memory_limit_bytes,
                                               std::int64_t reserve_bytes) {
  return makeCudaBackendWith(makeCudaRuntimeApi(), index, memory_limit_bytes, reserve_bytes);
}

}  // namespace autobatch::detail
