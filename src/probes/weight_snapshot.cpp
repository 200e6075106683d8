#include "probes/weight_snapshot.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/TensorImpl.h>

#include <unordered_set>

#include "autobatch/vocabulary/error.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {

WeightSnapshot::WeightSnapshot(const std::vector<at::Tensor>& parameters,
                               const std::vector<at::Tensor>& buffers) {
  std::unordered_set<const c10::TensorImpl*> seen;
  auto remember = [&](const at::Tensor& t) {
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) return;
    const UntrackedCpuScope untracked;
    saved_.push_back({t, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true)});
  };
  for (const auto& p : parameters) remember(p);
  for (const auto& b : buffers) remember(b);
}

void WeightSnapshot::checkDevice(const at::Device& device) const {
  for (const auto& s : saved_) {
    if (s.live.device() != device) {
      throw Error("model: expected its tensors on " + device.str() + ", but got one on " +
                  s.live.device().str() + "; load it onto the device of --device");
    }
  }
}

void WeightSnapshot::restore() {
  const at::NoGradGuard no_grad;
  for (auto& s : saved_) s.live.copy_(s.host);
}

void WeightSnapshot::restoreDtypes(const at::Device& device) {
  const UntrackedCpuScope untracked;
  const at::NoGradGuard no_grad;
  for (auto& s : saved_) {
    if (s.live.scalar_type() != s.host.scalar_type()) s.live.set_data(s.host.to(device));
  }
}

}  // namespace autobatch::detail
