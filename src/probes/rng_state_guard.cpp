#include "probes/rng_state_guard.h"

#include <ATen/Context.h>

#include <mutex>

#include "memory/memory_backend.h"

namespace autobatch::detail {

RngStateGuard::RngStateGuard(const at::Device& device) {
  const UntrackedCpuScope untracked;
  save(at::globalContext().defaultGenerator(at::Device(at::kCPU)));
  if (device.is_cuda()) save(at::globalContext().defaultGenerator(device));
}

RngStateGuard::~RngStateGuard() {
  for (auto& [gen, state] : saved_) {
    const std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

void RngStateGuard::save(at::Generator gen) {
  const std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor state = gen.get_state();
  saved_.emplace_back(std::move(gen), std::move(state));
}

}  // namespace autobatch::detail
