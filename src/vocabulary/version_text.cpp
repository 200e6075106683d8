// versionText: BuildInfo as `autobatch --version` prints it. LibTorch-free (the core): the
// Python extension prints the BuildInfo of the torch it runs with; buildInfo() is version.cpp.
#include <sstream>
#include <string>

#include "autobatch/vocabulary/version.h"

namespace autobatch {

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
