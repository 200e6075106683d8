#include "probes/optimizers.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {
namespace {

constexpr double kMomentum = 0.9;
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kEps = 1e-8;
constexpr double kAdamWWeightDecay = 0.01;  // torch.optim.AdamW's default

/// torch::optim's own step: the per-parameter loop (`foreach=False`).
class LoopOptimizer final : public TrialOptimizer {
 public:
  explicit LoopOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}
  void step() override { optimizer_->step(); }

 private:
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// Optimizer._group_tensors_by_device_and_dtype: indices of the parameters that have a gradient,
/// grouped by (device, dtype) in the order of first appearance.
std::vector<std::vector<std::size_t>> groupWithGrad(const std::vector<at::Tensor>& params) {
  std::vector<std::vector<std::size_t>> groups;
  std::vector<std::pair<at::Device, at::ScalarType>> keys;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    const std::pair<at::Device, at::ScalarType> key{params[i].device(), params[i].scalar_type()};
    std::size_t g = 0;
    while (g < keys.size() && keys[g] != key) ++g;
    if (g == keys.size()) {
      keys.push_back(key);
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all,
                             const std::vector<std::size_t>& indices) {
  std::vector<at::Tensor> out;
  out.reserve(indices.size());
  for (const std::size_t i : indices) out.push_back(all[i]);
  return out;
}

std::vector<at::Tensor> gradsOf(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return grads;
}

/// PyTorch's own refusal of sparse gradients (torch/optim/adam.py, _init_group: "Adam does not
/// support sparse gradients, please consider SparseAdam instead"; torch/optim/sgd.py, _fused_sgd:
/// "`_fused_sgd` does not support sparse gradients"), raised as the step's error (exit 1), not as
/// a dispatcher dump from the foreach or fused kernel.
void requireDense(const std::vector<at::Tensor>& params, const std::string& who) {
  for (const auto& p : params) {
    if (p.grad().defined() && p.grad().is_sparse()) {
      throw std::runtime_error(who + " does not support sparse gradients (a parameter of shape " +
                               c10::str(p.sizes()) +
                               " got one); use --optimizer sgd or sgd-momentum with "
                               "--optimizer-impl loop or foreach for a sparse embedding");
    }
  }
}

/// `_multi_tensor_sgd` (weight decay 0, dampening 0, no nesterov, no maximize).
class ForeachSgd final : public TrialOptimizer {
 public:
  ForeachSgd(std::vector<at::Tensor> params, double lr, double momentum)
      : params_(std::move(params)), lr_(lr), momentum_(momentum), buffers_(params_.size()) {}

  void step() override {
    const at::NoGradGuard no_grad;
    for (const auto& group : groupWithGrad(params_)) {
      std::vector<at::Tensor> params = pick(params_, group);
      std::vector<at::Tensor> grads = gradsOf(params);
      bool sparse = false;
      for (const auto& g : grads) sparse = sparse || g.is_sparse();
      if (sparse) {
        // `foreach APIs don't support sparse`: _multi_tensor_sgd updates one parameter at a time.
        for (std::size_t k = 0; k < group.size(); ++k) {
          at::Tensor update = grads[k];
          if (momentum_ != 0.0) {
            at::Tensor& buf = buffers_[group[k]];
            if (!buf.defined()) {
              buf = grads[k].detach().clone();
            } else {
              buf.mul_(momentum_).add_(grads[k], 1.0);
            }
            update = buf;
          }
          params[k].add_(update, -lr_);
        }
        continue;
      }
      if (momentum_ != 0.0) {
        bool all_buffers = true;
        for (const std::size_t i : group) all_buffers = all_buffers && buffers_[i].defined();
        std::vector<at::Tensor> bufs;
        if (all_buffers) {
          bufs = pick(buffers_, group);
          at::_foreach_mul_(bufs, momentum_);
          at::_foreach_add_(bufs, grads, 1.0);  // alpha = 1 - dampening
        } else {
          for (std::size_t k = 0; k < group.size(); ++k) {
            at::Tensor& buf = buffers_[group[k]];
            if (!buf.defined()) {
              buf = grads[k].detach().clone();
            } else {
              buf.mul_(momentum_).add_(grads[k], 1.0);
            }
            bufs.push_back(buf);
          }
        }
        grads = std::move(bufs);
      }
      at::_foreach_add_(params, grads, -lr_);
    }
  }

 private:
  std::vector<at::Tensor> params_;
  double lr_;
  double momentum_;
  std::vector<at::Tensor> buffers_;  // momentum_buffer per parameter, undefined until created
};

/// `_fused_sgd` (weight decay 0, dampening 0, no nesterov, no maximize).
class FusedSgd final : public TrialOptimizer {
 public:
  FusedSgd(std::vector<at::Tensor> params, double lr, double momentum)
      : params_(std::move(params)), lr_(lr), momentum_(momentum), buffers_(params_.size()) {}

  void step() override {
    const at::NoGradGuard no_grad;
    requireDense(params_, "`_fused_sgd`");
    const bool no_momentum_buffer = momentum_ == 0.0;
    bool is_first_step = !no_momentum_buffer;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].grad().defined() && buffers_[i].defined()) is_first_step = false;
    }
    if (is_first_step) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].grad().defined()) buffers_[i] = at::empty_like(params_[i].grad());
      }
    }
    for (const auto& group : groupWithGrad(params_)) {
      const std::vector<at::Tensor> params = pick(params_, group);
      const std::vector<at::Tensor> grads = gradsOf(params);
      const std::vector<at::Tensor> bufs =
          no_momentum_buffer ? std::vector<at::Tensor>{} : pick(buffers_, group);
      at::_fused_sgd_(params, grads, bufs, /*weight_decay=*/0.0, momentum_, lr_,
                      /*dampening=*/0.0, /*nesterov=*/false, /*maximize=*/false, is_first_step);
    }
  }

 private:
  std::vector<at::Tensor> params_;
  double lr_;
  double momentum_;
  std::vector<at::Tensor> buffers_;
};

/// Adam / AdamW state of one parameter, created at its first step (Adam._init_group).
struct AdamState {
  at::Tensor step;  // scalar float32: on the CPU for foreach, on the parameter's device for fused
  at::Tensor exp_avg;
  at::Tensor exp_avg_sq;
};

/// `_multi_tensor_adam` (no amsgrad, no maximize, capturable off) and `_fused_adam` /
/// `_fused_adamw_`.
class MultiTensorAdam final : public TrialOptimizer {
 public:
  MultiTensorAdam(std::vector<at::Tensor> params, double lr, double weight_decay, bool decoupled,
                  bool fused)
      : params_(std::move(params)),
        lr_(lr),
        weight_decay_(weight_decay),
        decoupled_(decoupled),
        fused_(fused),
        state_(params_.size()) {}

  void step() override {
    const at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& p = params_[i];
      if (!p.grad().defined() || state_[i].exp_avg.defined()) continue;
      // torch/optim/adam.py, _init_group: the step counter is a CPU scalar unless fused or
      // capturable; the moments are zeros_like(p, memory_format=torch.preserve_format).
      state_[i].step = fused_ ? at::zeros({}, p.options().dtype(at::kFloat))
                              : at::zeros({}, at::TensorOptions().dtype(at::kFloat));
      state_[i].exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
      state_[i].exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    requireDense(params_, "Adam");
    // Python's loop variable `exp_avg_sq_sqrt` keeps one group's temporaries alive until the next
    // group's are made: with parameters of two dtypes both sets are alive at once.
    std::vector<at::Tensor> previous_sqrt;
    for (const auto& group : groupWithGrad(params_)) {
      std::vector<at::Tensor> params = pick(params_, group);
      std::vector<at::Tensor> grads = gradsOf(params);
      std::vector<at::Tensor> exp_avgs;
      std::vector<at::Tensor> exp_avg_sqs;
      std::vector<at::Tensor> steps;
      for (const std::size_t i : group) {
        exp_avgs.push_back(state_[i].exp_avg);
        exp_avg_sqs.push_back(state_[i].exp_avg_sq);
        steps.push_back(state_[i].step);
      }
      at::_foreach_add_(steps, 1.0);
      if (fused_) {
        if (decoupled_) {
          at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr_, kBeta1, kBeta2,
                            weight_decay_, kEps, /*amsgrad=*/false, /*maximize=*/false);
        } else {
          at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr_, kBeta1, kBeta2,
                           weight_decay_, kEps, /*amsgrad=*/false, /*maximize=*/false);
        }
        continue;
      }
      previous_sqrt = foreachStep(params, std::move(grads), exp_avgs, exp_avg_sqs, steps);
    }
  }

 private:
  // Returns the group's sqrt(exp_avg_sq) temporaries, which the caller keeps as Python does.
  std::vector<at::Tensor> foreachStep(const std::vector<at::Tensor>& params,
                                      std::vector<at::Tensor> grads,
                                      const std::vector<at::Tensor>& exp_avgs,
                                      const std::vector<at::Tensor>& exp_avg_sqs,
                                      const std::vector<at::Tensor>& steps) const {
    if (weight_decay_ != 0.0) {
      if (decoupled_) {
        at::_foreach_mul_(params, 1.0 - lr_ * weight_decay_);
      } else {
        grads = at::_foreach_add(grads, params, weight_decay_);  // a new gradient-sized set
      }
    }
    at::_foreach_lerp_(exp_avgs, grads, 1.0 - kBeta1);
    at::_foreach_mul_(exp_avg_sqs, kBeta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - kBeta2);
    grads.clear();  // `del device_grads`: the weight-decay copy, if any, goes here
    std::vector<at::Scalar> step_size;
    std::vector<at::Scalar> bias_correction2_sqrt;
    for (const auto& s : steps) {
      const auto step = s.item<double>();
      const double bias_correction1 = 1.0 - std::pow(kBeta1, step);
      const double bias_correction2 = 1.0 - std::pow(kBeta2, step);
      step_size.emplace_back(-(lr_ / bias_correction1));
      bias_correction2_sqrt.emplace_back(std::sqrt(bias_correction2));
    }
    // One parameter-sized temporary per parameter, all alive at once: what foreach costs.
    std::vector<at::Tensor> exp_avg_sq_sqrt = at::_foreach_sqrt(exp_avg_sqs);
    at::_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt);
    at::_foreach_add_(exp_avg_sq_sqrt, kEps);
    at::_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size);
    return exp_avg_sq_sqrt;
  }

  std::vector<at::Tensor> params_;
  double lr_;
  double weight_decay_;
  bool decoupled_;
  bool fused_;
  std::vector<AdamState> state_;
};

std::unique_ptr<TrialOptimizer> makeLoop(OptimizerKind kind, const std::vector<at::Tensor>& params,
                                         double lr) {
  switch (kind) {
    case OptimizerKind::kNone:
      return nullptr;
    case OptimizerKind::kSgd:
      return std::make_unique<LoopOptimizer>(
          std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr)));
    case OptimizerKind::kSgdMomentum:
      return std::make_unique<LoopOptimizer>(std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(lr).momentum(kMomentum)));
    case OptimizerKind::kAdam:
      return std::make_unique<LoopOptimizer>(
          std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr)));
    case OptimizerKind::kAdamW:
      return std::make_unique<LoopOptimizer>(
          std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr)));
  }
  return nullptr;
}

}  // namespace

OptimizerImpl resolveOptimizerImpl(OptimizerImpl requested, bool on_cuda) {
  if (requested != OptimizerImpl::kAuto) return requested;
  return on_cuda ? OptimizerImpl::kForeach : OptimizerImpl::kLoop;
}

std::unique_ptr<TrialOptimizer> makeTrialOptimizer(OptimizerKind kind, OptimizerImpl impl,
                                                   const std::vector<at::Tensor>& params,
                                                   double lr) {
  if (kind == OptimizerKind::kNone) return nullptr;
  const bool fused = impl == OptimizerImpl::kFused;
  if (fused) {
    // torch/optim/optimizer.py refuses it when the optimizer is built, as here.
    for (const auto& p : params) {
      if (!p.is_floating_point()) {
        throw Error(
            "--optimizer-impl fused: expected floating-point parameters (what PyTorch's "
            "fused=True requires), but got one of " +
            std::string(c10::toString(p.scalar_type())) + " with shape " + c10::str(p.sizes()) +
            "; use --optimizer-impl loop or foreach");
      }
    }
  }
  switch (impl) {
    case OptimizerImpl::kLoop:
      return makeLoop(kind, params, lr);
    case OptimizerImpl::kForeach:
    case OptimizerImpl::kFused:
      switch (kind) {
        case OptimizerKind::kSgd:
        case OptimizerKind::kSgdMomentum: {
          const double momentum = kind == OptimizerKind::kSgdMomentum ? kMomentum : 0.0;
          if (fused) return std::make_unique<FusedSgd>(params, lr, momentum);
          return std::make_unique<ForeachSgd>(params, lr, momentum);
        }
        case OptimizerKind::kAdam:
          return std::make_unique<MultiTensorAdam>(params, lr, 0.0, false, fused);
        case OptimizerKind::kAdamW:
          return std::make_unique<MultiTensorAdam>(params, lr, kAdamWWeightDecay, true, fused);
        case OptimizerKind::kNone:
          return nullptr;
      }
      break;
    case OptimizerImpl::kAuto:
      break;
  }
  throw Error(
      "optimizer implementation: expected loop, foreach or fused once auto is resolved, "
      "but got " +
      std::string(toString(impl)));
}

}  // namespace autobatch::detail
