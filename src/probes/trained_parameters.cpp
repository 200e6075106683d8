#include "probes/trained_parameters.h"

#include <c10/core/TensorImpl.h>

#include <unordered_set>

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {
namespace {

std::int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

}  // namespace

TrainedParameters::TrainedParameters(const std::vector<at::Tensor>& parameters, bool ddp,
                                     const std::string& model_path) {
  std::unordered_set<const c10::TensorImpl*> counted;
  for (const auto& p : parameters) {
    if (!counted.insert(p.unsafeGetTensorImpl()).second) continue;
    parameter_bytes_ += bytesOf(p);
    if (p.requires_grad()) trained_.push_back(p);
  }
  if (ddp) {
    for (const auto& p : trained_) ddp_bucket_bytes_ += bytesOf(p);
  }
  if (trained_.empty()) {
    throw Error("model '" + model_path +
                "': expected parameters that require grad, but got none; autobatch sizes "
                "training steps");
  }
}

std::int64_t TrainedParameters::count() const {
  std::int64_t n = 0;
  for (const auto& p : trained_) n += p.numel();
  return n;
}

std::int64_t TrainedParameters::gradientBytes() const {
  std::int64_t n = 0;
  for (const auto& p : trained_) n += bytesOf(p);
  return n;
}

std::int64_t TrainedParameters::optimizerStateBytes(OptimizerKind optimizer) const {
  switch (optimizer) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2 * gradientBytes();
    case OptimizerKind::kSgdMomentum:
      return gradientBytes();
    case OptimizerKind::kSgd:
    case OptimizerKind::kNone:
      return 0;
  }
  return 0;
}

void TrainedParameters::zeroGrad(ZeroGrad mode) {
  for (auto& p : trained_) {
    if (mode == ZeroGrad::kNone || !p.grad().defined()) {
      p.mutable_grad() = at::Tensor();
    } else {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

}  // namespace autobatch::detail
