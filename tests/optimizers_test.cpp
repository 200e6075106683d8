// The optimizer implementations of a trial (src/optimizers.h, internal): foreach and fused compute
// the same update as the loop (torch::optim), so the memory they are measured for is that of a
// real optimizer step; auto resolves as PyTorch's default does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "optimizers.h"

namespace autobatch::detail {
namespace {

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

// torch/optim/optimizer.py, _default_to_fused_or_foreach (2.11): foreach when every parameter is
// on CUDA, the loop otherwise, fused never by default.
TEST(OptimizersTest, AutoIsPyTorchsDefaultForTheDevice) {
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kAuto, true), OptimizerImpl::kForeach);
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kAuto, false), OptimizerImpl::kLoop);
  EXPECT_EQ(resolveOptimizerImpl(OptimizerImpl::kFused, false), OptimizerImpl::kFused);
  EXPECT_EQ(makeTrialOptimizer(OptimizerKind::kNone, OptimizerImpl::kForeach, {}, 0.1), nullptr);
}

}  // namespace
}  // namespace autobatch::detail
