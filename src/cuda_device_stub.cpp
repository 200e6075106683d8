// Compiled when LibTorch has no CUDA: no device, no runtime.
#include "cuda_device.h"

namespace autobatch::detail {

std::vector<CudaDeviceInfo> cudaDevices() { return {}; }
std::string cudaRuntimeVersion() { return ""; }
int cudaDriverVersion() { return 0; }

}  // namespace autobatch::detail
