// The optimizer implementations of a trial (src/probes/optimizers.h, internal): foreach and fused
// compute the same update as the loop (torch::optim), so the memory they are measured for is that
// of a real optimizer step; auto resolves as PyTorch's default does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "autobatch/vocabulary/error.h"
#include "probes/optimizers.h"

namespace autobatch::detail {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace optimizers_test {

// Two parameter groups of different dtypes (grouping by device and dtype), one parameter
// without a gradient (skipped, as PyTorch skips .grad None), three steps.
std::vector<at::Tensor> runSteps(OptimizerKind kind, OptimizerImpl impl) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params{
      torch::randn({8, 4}).requires_grad_(), torch::randn({4}).requires_grad_(),
      torch::randn({3, 3}, torch::kDouble).requires_grad_(), torch::randn({5}).requires_grad_()};
  auto optimizer = makeTrialOptimizer(kind, impl, params, 0.01);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < 3; ++i) {  // params[3] never gets a gradient
      params[i].mutable_grad() = torch::randn_like(params[i]) * (step + 1);
    }
    optimizer->step();
  }
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

class OptimizersTest : public ::testing::TestWithParam<OptimizerKind> {};

// Catches a foreach or fused step with another update rule (a wrong bias correction, weight decay
// applied the Adam way to AdamW, momentum buffers started at zero instead of the first gradient),
// and one that touches a parameter without a gradient.
TEST_P(OptimizersTest, ForeachAndFusedMatchTheLoop) {
  const auto loop = runSteps(GetParam(), OptimizerImpl::kLoop);
  for (const auto impl : {OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
    const auto other = runSteps(GetParam(), impl);
    ASSERT_EQ(other.size(), loop.size());
    for (std::size_t i = 0; i < loop.size(); ++i) {
      EXPECT_TRUE(torch::allclose(other[i], loop[i], 1e-5, 1e-6))
          << toString(GetParam()) << " " << toString(impl) << " parameter " << i << "\n"
          << other[i] - loop[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizersTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kSgdMomentum,
                                           OptimizerKind::kAdam, OptimizerKind::kAdamW));

// Sparse gradients (an Embedding with sparse=True): PyTorch's foreach SGD updates such parameters
// one at a time, and Adam and fused SGD refuse them with their own message. Catches the foreach
// and fused kernels' 90-line dispatcher dump ("Could not run 'aten::lerp_.Scalar' with arguments
// from the 'SparseCPU' backend") reaching the user.
TEST(OptimizersTest, SparseGradientsAreHandledOrRefusedAsPyTorchDoes) {
  auto sparse_step = [](OptimizerKind kind, OptimizerImpl impl) {
    torch::manual_seed(0);
    std::vector<at::Tensor> params{torch::randn({10, 4}).requires_grad_()};
    auto optimizer = makeTrialOptimizer(kind, impl, params, 0.1);
    for (int step = 0; step < 2; ++step) {
      params[0].mutable_grad() =
          torch::sparse_coo_tensor(torch::tensor({{1, 3}}), torch::ones({2, 4}), {10, 4});
      optimizer->step();
    }
    return params[0].detach().clone();
  };
  for (const auto kind : {OptimizerKind::kSgd, OptimizerKind::kSgdMomentum}) {
    EXPECT_TRUE(torch::allclose(sparse_step(kind, OptimizerImpl::kForeach),
                                sparse_step(kind, OptimizerImpl::kLoop)))
        << toString(kind);
  }
  for (const auto kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (const auto impl : {OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
      try {
        sparse_step(kind, impl);
        FAIL() << "expected PyTorch's refusal";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("Adam does not support sparse gradients"),
                  std::string::npos)
            << e.what();
        EXPECT_EQ(std::string(e.what()).find("registered at"), std::string::npos) << e.what();
      }
    }
  }
  try {
    sparse_step(OptimizerKind::kSgdMomentum, OptimizerImpl::kFused);
    FAIL() << "expected PyTorch's refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("`_fused_sgd` does not support sparse gradients"),
              std::string::npos)
        << e.what();
  }
}

// fused=True needs floating-point parameters (PyTorch refuses it when the optimizer is built): a
// usage error naming the dtype, not a kernel's "not implemented for 'ComplexFloat'" at the step.
TEST(OptimizersTest, FusedOnNonFloatingParametersIsAUsageError) {
  const std::vector<at::Tensor> params{torch::randn({3}, torch::kComplexFloat).requires_grad_()};
  try {
    makeTrialOptimizer(OptimizerKind::kAdamW, OptimizerImpl::kFused, params, 0.1);
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer-impl fused: expected floating-point "
                                         "parameters"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("ComplexFloat"), std::string::npos) << e.what();
  }
}

// torch/optim/optimizer.py, _default_to_fused_or_foreach (2.11): foreach when every parameter is
// on CUDA, the loop otherwise, fused never by default.
TEST(OptimizersTest, AutoIsPyTorchsDefaultForTheDevice) {
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kAuto, true), OptimizerImpl::kForeach);
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kAuto, false), OptimizerImpl::kLoop);
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kFused, false), OptimizerImpl::kFused);
  EXPECT_EQ(makeTrialOptimizer(OptimizerKind::kNone, OptimizerImpl::kForeach, {}, 0.1), nullptr);
}

}  // namespace optimizers_test
}  // namespace
}  // namespace autobatch::detail
