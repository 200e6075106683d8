#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autobatch/version.h"

namespace autobatch {
namespace {

TEST(VersionTest, ReportsTheLibTorchItWasBuiltWith) {
  const BuildInfo info = buildInfo();
  EXPECT_EQ(info.autobatch_version, "0.1.0");
  EXPECT_EQ(info.libtorch_version.substr(0, 4), "2.11");
  // The GPUs the CUDA runtime sees are the ones LibTorch sees.
  EXPECT_EQ(static_cast<std::size_t>(torch::cuda::device_count()), info.cuda_devices.size());
  const std::string text = versionText(info);
  EXPECT_NE(text.find("LibTorch " + info.libtorch_version), std::string::npos) << text;
  EXPECT_NE(text.find(info.cuda_devices.empty() ? "GPU: none seen" : "GPU 0: "), std::string::npos)
      << text;
}

}  // namespace
}  // namespace autobatch
