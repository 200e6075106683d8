// The toolchain works end to end: a TorchScript module is saved, loaded with torch::jit::load and
// trained for a few AdamW steps on the CPU.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>

namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace torch_smoke_test {

TEST(TorchSmokeTest, SavedModuleTrainsWithAdamW) {
  torch::manual_seed(0);
  torch::jit::Module net("Net");
  net.register_parameter("w", torch::randn({8, 4}).requires_grad_(), false);
  net.register_parameter("b", torch::zeros({4}).requires_grad_(), false);
  net.define(R"(
    def forward(self, x):
        return torch.relu(torch.matmul(x, self.w) + self.b)
  )");
  std::filesystem::create_directories(AUTOBATCH_TEST_TMP);
  const std::string path = std::string(AUTOBATCH_TEST_TMP) + "/smoke_net.pt";
  net.save(path);

  torch::jit::Module loaded = torch::jit::load(path, torch::kCPU);
  loaded.train();
  std::vector<torch::Tensor> params;
  for (const auto& p : loaded.parameters()) params.push_back(p);
  ASSERT_EQ(params.size(), 2U);
  const torch::Tensor w_before = params[0].detach().clone();

  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(0.05));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor target = torch::ones({16, 4});
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    const torch::Tensor out = loaded.forward({x}).toTensor();
    const torch::Tensor loss = torch::mse_loss(out, target);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  EXPECT_FALSE(torch::equal(params[0], w_before));
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace torch_smoke_test
}  // namespace
