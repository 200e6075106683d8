#include "autobatch/vocabulary/version.h"

#include <torch/version.h>

#include "memory/cuda_device.h"

namespace autobatch {

BuildInfo buildInfo() {
  BuildInfo info;
  info.autobatch_version = AUTOBATCH_VERSION;
  info.libtorch_version = TORCH_VERSION;
  info.cuda_version = detail::cudaRuntimeVersion();
  info.cuda_build = !info.cuda_version.empty();
  info.cuda_driver_version = detail::cudaDriverVersion();
  info.cuda_devices = detail::cudaDevices();
  return info;
}

}  // namespace autobatch
