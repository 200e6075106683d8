// Compiled when LibTorch has no CUDA: no device, no runtime.
#include "autobatch/error.h"
#include "cuda_device.h"
#include "memory_backend.h"

namespace autobatch::detail {

std::vector<CudaDeviceInfo> cudaDevices() { return {}; }
std::string cudaRuntimeVersion() { return ""; }
int cudaDriverVersion() { return 0; }

}  // namespace autobatch::detail

namespace autobatch::detail {

std::unique_ptr<MemoryBackend> makeCudaBackend(int /*index*/, std::int64_t /*memory_limit_bytes*/,
                                               std::int64_t /*reserve_bytes*/) {
  throw Error(
      "device: expected cpu, but got a CUDA device; this autobatch was built with a "
      "LibTorch without CUDA (use --device cpu or rebuild against a CUDA LibTorch)");
}
double cudaMemoryFraction(int /*index*/) { return 1.0; }
std::int64_t cudaFreeBytes() { return 0; }

}  // namespace autobatch::detail
