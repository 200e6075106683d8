#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "autobatch/vocabulary/version.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace version_test {

// The versions come from the build's configuration (tests/CMakeLists.txt passes project()'s version
// and the LibTorch version find_package(Torch) found), so the test holds across upgrades. Catches
// a version string kept by hand in the sources that a release bump or a LibTorch upgrade leaves
// behind (the report's fingerprint and the result cache's key would then name the wrong build),
// and a LibTorch version read from anything but the headers the library was compiled with.
TEST(VersionTest, ReportsTheLibTorchItWasBuiltWith) {
  const BuildInfo info = buildInfo();
  EXPECT_EQ(info.autobatch_version, AUTOBATCH_CONFIGURED_VERSION);
  const std::string configured_torch = AUTOBATCH_CONFIGURED_TORCH_VERSION;
  ASSERT_FALSE(configured_torch.empty()) << "find_package(Torch) set no Torch_VERSION";
  // LibTorch's header may add a local suffix ("2.11.0+cu130") to the package's version.
  EXPECT_EQ(info.libtorch_version.rfind(configured_torch, 0), 0U)
      << info.libtorch_version << " vs " << configured_torch;
  // The GPUs the CUDA runtime sees are the ones LibTorch sees.
  EXPECT_EQ(static_cast<std::size_t>(torch::cuda::device_count()), info.cuda_devices.size());
  const std::string text = versionText(info);
  EXPECT_NE(text.find("autobatch " + info.autobatch_version + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("LibTorch " + info.libtorch_version), std::string::npos) << text;
  EXPECT_NE(text.find(info.cuda_devices.empty() ? "GPU: none seen" : "GPU 0: "), std::string::npos)
      << text;
}

}  // namespace version_test
}  // namespace
}  // namespace autobatch
