// Internal: the only entry points into the CUDA runtime outside the memory backend.
// Implemented in cuda_runtime.cpp when LibTorch has CUDA (AUTOBATCH_HAVE_CUDA), else stubbed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autobatch/vocabulary/version.h"

namespace autobatch::detail {

/// Devices the CUDA runtime sees; empty without a driver or a GPU (never throws).
std::vector<CudaDeviceInfo> cudaDevices();
/// CUDA runtime version built against, "13.0"; "" when built without CUDA.
std::string cudaRuntimeVersion();
/// cudaDriverGetVersion(), 0 when no driver is installed.
int cudaDriverVersion();
/// The CUDA runtime's current device (c10::cuda::current_device()); 0 without CUDA. What an
/// index-less "cuda" resolves to (resolveDeviceName, cuda_api.h).
int cudaCurrentDevice();

}  // namespace autobatch::detail
