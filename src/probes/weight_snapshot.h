// weight_snapshot.h (internal) — the model's weights and buffers as they were at setup, on the
// host, so that every trial starts from them (the trial runner restores them after each trial).
//
// The copies are made under UntrackedCpuScope: the CPU budget allocator does not count them (the
// process guard does, as the kernel would). Thread safety: one thread at a time.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace autobatch::detail {

class WeightSnapshot {
 public:
  WeightSnapshot() = default;
  /// Host copies of every distinct tensor (by TensorImpl) of `parameters`, then of `buffers`.
  /// Side effects: allocates their bytes on the host, outside the budget.
  WeightSnapshot(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& buffers);

  /// Throws autobatch::Error ("model: expected its tensors on <device>, but got one on <other>;
  /// load it onto the device of --device") when a tensor is on another device.
  void checkDevice(const at::Device& device) const;
  /// Copies the values back into the live tensors, in place (a dtype cast stays), without grad.
  void restore();
  /// Gives every live tensor whose dtype differs from its copy's the copy's dtype and values
  /// again, on `device` (undoes an fp16/bf16 cast of a caller's module), outside the budget.
  void restoreDtypes(const at::Device& device);

 private:
  struct Saved {
    at::Tensor live;  // the model's tensor (same TensorImpl)
    at::Tensor host;  // its value at setup, on the CPU, not counted by the budget
  };
  std::vector<Saved> saved_;
};

}  // namespace autobatch::detail
