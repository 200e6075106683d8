// Internal: the only entry points into the CUDA runtime outside the memory backend.
// Implemented in cuda_device.cpp when LibTorch has CUDA (AUTOBATCH_HAVE_CUDA), else stubbed.
#pragma once

#include <string>
#include <vector>

#include "autobatch/version.h"

namespace autobatch::detail {

/// Devices the CUDA runtime sees; empty without a driver or a GPU (never throws).
std::vector<CudaDeviceInfo> cudaDevices();
/// CUDA runtime version built against, "13.0"; "" when built without CUDA.
std::string cudaRuntimeVersion();
/// cudaDriverGetVersion(), 0 when no driver is installed.
int cudaDriverVersion();

}  // namespace autobatch::detail
