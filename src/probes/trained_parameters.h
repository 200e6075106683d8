// trained_parameters.h (internal) — the model's parameters as the trial runner trains them: each
// tensor once (tied weights share one), the ones that require grad, their bytes, DDP's gradient
// buckets, the optimizer's state by kind, and zero_grad. Thread safety: one thread at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autobatch/vocabulary/training_spec.h"

namespace autobatch::detail {

class TrainedParameters {
 public:
  TrainedParameters() = default;
  /// Counts `parameters` (after any precision cast), each TensorImpl once. `ddp`: DDP's gradient
  /// buckets hold one more copy of the trained parameters' bytes. Throws autobatch::Error when
  /// none requires grad (`model_path` names the model: autobatch sizes training steps).
  TrainedParameters(const std::vector<at::Tensor>& parameters, bool ddp,
                    const std::string& model_path);

  /// The distinct parameters that require grad, in the model's order: what the optimizer trains.
  const std::vector<at::Tensor>& tensors() const { return trained_; }
  /// Elements of the trained parameters.
  std::int64_t count() const;
  /// Bytes of every distinct parameter, trained or frozen.
  std::int64_t parameterBytes() const { return parameter_bytes_; }
  /// Bytes of one gradient per trained parameter.
  std::int64_t gradientBytes() const;
  /// Bytes of DDP's gradient buckets (0 without DDP).
  std::int64_t ddpBucketBytes() const { return ddp_bucket_bytes_; }
  /// Bytes of the optimizer's state once created: Adam / AdamW two gradient-sized sets
  /// (exp_avg, exp_avg_sq), SGD with momentum one, plain SGD and none nothing.
  std::int64_t optimizerStateBytes(OptimizerKind optimizer) const;
  /// optimizer.zero_grad(set_to_none=...): kNone drops every gradient; kZeros keeps them
  /// allocated, zero-filled and detached (torch/optim/optimizer.py, zero_grad).
  void zeroGrad(ZeroGrad mode);

 private:
  std::vector<at::Tensor> trained_;
  std::int64_t parameter_bytes_ = 0;
  std::int64_t ddp_bucket_bytes_ = 0;
};

}  // namespace autobatch::detail
