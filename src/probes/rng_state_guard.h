// rng_state_guard.h (internal) — a trial's guard of the default random generators: dropout draws
// from them, and every trial must start from the same draws (the trial runner holds one per
// trial). Thread safety: one thread at a time (each generator is locked while read or written).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace autobatch::detail {

/// Saves the default generators' states and restores them when destroyed: the CPU's, and the
/// device's own when the trial runs on CUDA (through at::globalContext(), so this unit needs no
/// CUDA header; a CUDA generator's state is a small CPU tensor of seed and offset). The saved
/// states are made outside the CPU budget (UntrackedCpuScope).
class RngStateGuard {
 public:
  explicit RngStateGuard(const at::Device& device);
  ~RngStateGuard();
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  void save(at::Generator gen);
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace autobatch::detail
