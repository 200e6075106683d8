// Internal: the optimizer step of a trial, in the implementation the user's job runs. PyTorch's
// Python optimizers have three (torch/optim/optimizer.py, 2.11): the per-parameter loop
// (`foreach=False`; what torch::optim in C++ is), the multi-tensor "foreach" code (the default on
// CUDA) and the fused kernels. They hold different temporaries at the step, so a parameter-heavy
// model's peak depends on which one runs (measured on the CPU, MLP 8 x Linear(2048, 2048), AdamW,
// B=16: foreach +17.6% over the loop, fused -5.9%). foreach and fused here follow PyTorch 2.11's
// torch/optim/sgd.py (`_multi_tensor_sgd`, `_fused_sgd`) and torch/optim/adam.py
// (`_multi_tensor_adam`, `_fused_adam`; AdamW is Adam with decoupled_weight_decay=True) op for op,
// with the same state created at the same moment and the same grouping by device and dtype.
// Hyper-parameters are PyTorch's defaults: SGD momentum 0.9 (sgd-momentum), dampening 0, no
// nesterov; Adam betas (0.9, 0.999), eps 1e-8, weight decay 0 (adam) or 0.01 (adamw); no amsgrad,
// no maximize, capturable off.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string_view>
#include <vector>

#include "autobatch/vocabulary/training_spec.h"

namespace autobatch::detail {

/// One optimizer, fresh for each trial (its state is created at the first step(), as PyTorch's).
class TrialOptimizer {
 public:
  TrialOptimizer() = default;
  TrialOptimizer(const TrialOptimizer&) = delete;
  TrialOptimizer& operator=(const TrialOptimizer&) = delete;
  virtual ~TrialOptimizer() = default;
  /// One optimizer step over the parameters whose gradient is defined (as PyTorch skips those
  /// whose .grad is None). Side effects: updates the parameters, creates state at the first call.
  virtual void step() = 0;
};

/// `auto` resolved as PyTorch 2.11 resolves it: foreach when every parameter is on CUDA, the loop
/// otherwise; fused is never a default.
OptimizerImpl resolveOptimizerImpl(OptimizerImpl requested, bool on_cuda);

/// The optimizer `kind` over `params` (trained parameters, deduplicated) in implementation `impl`
/// (not kAuto). nullptr for OptimizerKind::kNone. `lr`: learning rate.
/// Throws: autobatch::Error for an unknown combination.
std::unique_ptr<TrialOptimizer> makeTrialOptimizer(OptimizerKind kind, OptimizerImpl impl,
                                                   const std::vector<at::Tensor>& params,
                                                   double lr);

}  // namespace autobatch::detail
