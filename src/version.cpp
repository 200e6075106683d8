#include "autobatch/version.h"

#include <torch/version.h>

#include <sstream>

#include "cuda_device.h"

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

std::string versionText(const BuildInfo& info) {
  std::ostringstream out;
  out << "autobatch " << info.autobatch_version << "\n";
  out << "LibTorch " << info.libtorch_version;
  out << (info.cuda_build ? " (CUDA " + info.cuda_version + " build)" : " (CPU-only build)")
      << "\n";
  if (info.cuda_devices.empty()) {
    out << "GPU: none seen"
        << (info.cuda_build && info.cuda_driver_version == 0 ? " (no CUDA driver)" : "") << "\n";
  }
  for (const auto& d : info.cuda_devices) {
    out << "GPU " << d.index << ": " << d.name << ", "
        << static_cast<double>(d.total_bytes) / static_cast<double>(1LL << 30) << " GiB, sm_"
        << d.major << d.minor << "\n";
  }
  return out.str();
}

}  // namespace autobatch
