// autobatch/vocabulary/training_spec.h — what one training step of the user's job is made of.
//
// A TrainingSpec describes the model, its inputs, the loss, the optimizer, the precision and the
// device of the job whose batch size autobatch looks for. It is a plain value type; this header
// includes no LibTorch header. Names accepted by the parse* functions are the CLI's flag values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autobatch/vocabulary/input_spec.h"

namespace autobatch {

/// How a scalar loss is made from the model's output.
enum class LossKind {
  kMean,          ///< "mean": mean of the (first) output tensor
  kCrossEntropy,  ///< "cross-entropy": random class targets below the output's last dimension
  kMse,           ///< "mse": mean squared error against a random target of the output's shape
  kModel,  ///< "model": forward returns the loss (a scalar, a tuple's first, a dict's "loss")
};

/// Optimizers from torch::optim. Adam-style state is created lazily at the first step().
enum class OptimizerKind {
  kNone,         ///< "none": no optimizer step (forward and backward only)
  kSgd,          ///< "sgd": no state
  kSgdMomentum,  ///< "sgd-momentum": one momentum buffer per parameter
  kAdam,         ///< "adam": exp_avg and exp_avg_sq per parameter
  kAdamW,        ///< "adamw": as adam, decoupled weight decay
};

/// How the optimizer step is computed, as PyTorch 2.11's Python optimizers offer it
/// (torch/optim/optimizer.py, `_default_to_fused_or_foreach`): the implementations hold different
/// temporaries at the step, so the peak of a parameter-heavy model depends on it.
enum class OptimizerImpl {
  kAuto,     ///< "auto": PyTorch's default for the device: foreach on CUDA, loop on the CPU
  kLoop,     ///< "loop": one parameter at a time (`foreach=False`; torch::optim's own step)
  kForeach,  ///< "foreach": multi-tensor ops over all parameters of a device and dtype at once
             ///< (`_multi_tensor_sgd` / `_multi_tensor_adam`): one parameter-sized set of
             ///< temporaries alive at once (Adam's sqrt of exp_avg_sq)
  kFused,    ///< "fused": one fused kernel per group (at::_fused_sgd_ / _fused_adam_ /
             ///< _fused_adamw_; `fused=True`)
};

/// What zero_grad() does between optimizer steps.
enum class ZeroGrad {
  kNone,   ///< "none": gradients set to None (PyTorch's `set_to_none=True`, its default)
  kZeros,  ///< "zeros": gradients zero-filled and kept (`set_to_none=False`): alive through the
           ///< next forward
};

/// Numeric precision of the step.
enum class Precision {
  kFp32,     ///< "fp32": float32 everywhere
  kAmpFp16,  ///< "amp-fp16": autocast to float16 around forward and loss (CUDA)
  kAmpBf16,  ///< "amp-bf16": autocast to bfloat16 around forward and loss (CUDA and CPU)
  kFp16,     ///< "fp16": the whole model cast to float16
  kBf16,     ///< "bf16": the whole model cast to bfloat16
};

std::string_view toString(LossKind kind);
std::string_view toString(OptimizerKind kind);
std::string_view toString(Precision precision);
std::string_view toString(OptimizerImpl impl);
std::string_view toString(ZeroGrad mode);

/// Parse the CLI names above. Throws: autobatch::Error naming the value given and the valid names.
LossKind parseLossKind(std::string_view name);
OptimizerKind parseOptimizerKind(std::string_view name);
Precision parsePrecision(std::string_view name);
OptimizerImpl parseOptimizerImpl(std::string_view name);
ZeroGrad parseZeroGrad(std::string_view name);

/// The training job whose micro-batch is searched. Defaults follow the CLI's defaults.
struct TrainingSpec {
  /// TorchScript archive (torch.jit.save). Ignored by the overloads that take a loaded module.
  std::string model_path;
  /// One spec per forward argument. Empty: read from the archive's "autobatch/inputs.json".
  std::vector<InputSpec> inputs;
  /// Loss. nullopt: the archive's, else LossKind::kMean.
  std::optional<LossKind> loss;
  /// Default: adamw.
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  /// The optimizer's implementation. Default: auto (foreach on CUDA, loop on the CPU).
  OptimizerImpl optimizer_impl = OptimizerImpl::kAuto;
  /// Default: none (set_to_none=True).
  ZeroGrad zero_grad = ZeroGrad::kNone;
  /// Each micro-batch's output (every tensor of the IValue forward returned) stays referenced
  /// until the next forward returns, through backward and the optimizer step, as in a loop that
  /// keeps `logits = model(x)` in a variable (nanoGPT's shape). false: dropped before backward, as
  /// Lightning's training_step and HF Trainer's compute_loss do. Default: true (an under-count is
  /// an OOM in the job; an over-count one output's bytes of headroom).
  bool keep_output = true;
  /// Learning rate of the optimizer (memory does not depend on it). Default: 1e-3.
  double learning_rate = 1e-3;
  /// Default: fp32.
  Precision precision = Precision::kFp32;
  /// "cpu", "cuda" or "cuda:N". Default: "cpu".
  std::string device = "cpu";
  /// Optimizer steps per trial; the peak is taken over all of them. Range >= 1. Default: 2, since
  /// Adam-style state appears at the first step() and the steady-state peak from step 2 on.
  int steps_per_trial = 2;
  /// Micro-batches per optimizer step in the user's job (gradient accumulation). Range >= 1.
  /// A trial runs min(accumulation_steps, 2) of them: N >= 2 peaks like 2. Default: 1.
  int accumulation_steps = 1;
  /// cuDNN benchmark mode (its first-iteration workspace is part of the trial). Default: false.
  bool cudnn_benchmark = false;
  /// TorchScript graph-executor optimisation. Default: false (deterministic memory, close to
  /// eager PyTorch; the profiling executor rewrites graphs after the first runs otherwise).
  bool optimize_graph = false;
  /// The job wraps the model in DistributedDataParallel: every trial also holds one more
  /// gradient-sized buffer (DDP's gradient buckets; issue 9) on the device for its whole length,
  /// so the peak and out-of-memory include it. Default: false.
  bool ddp = false;
  /// Seed of the synthetic inputs and targets. Default: 0.
  std::uint64_t seed = 0;
};

}  // namespace autobatch
