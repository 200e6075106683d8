// Internal: the Python face of one memory backend (memory_backend.h), shared by the two modules
// that make one: autobatch._core (the CUDA caching allocator's backend over a Python CudaApi) and
// the CPU budget module compiled on first use against the environment's torch
// (budget_module.cpp, autobatch/_budget.py). Each module defines its own `Backend` class from this
// header (defineBackend), so both answer the trial runner's calls under the same Python names.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/trial.h"
#include "memory/memory_backend.h"

namespace autobatch::python {

namespace py = pybind11;
using autobatch::TrialPhase;

inline TrialPhase phaseNamed(const std::string& name) {
  for (const auto phase : {TrialPhase::kIdle, TrialPhase::kInputs, TrialPhase::kForward,
                           TrialPhase::kLoss, TrialPhase::kBackward, TrialPhase::kOptimizerStep}) {
    if (name == autobatch::phaseKey(phase)) return phase;
  }
  throw autobatch::Error(
      "phase: expected idle, inputs, forward, loss, backward or optimizer-step, "
      "but got \"" +
      name + "\"");
}

inline py::dict peaksDict(const autobatch::detail::MemoryPeaks& peaks) {
  py::dict out;
  out["peak_allocated_bytes"] = peaks.peak_allocated_bytes;
  out["peak_reserved_bytes"] = peaks.peak_reserved_bytes;
  out["peak_bytes"] = peaks.peak_bytes;
  out["allocator_retries"] = peaks.allocator_retries;
  out["inactive_split_peak_bytes"] = peaks.inactive_split_peak_bytes;
  out["outside_growth_bytes"] = peaks.outside_growth_bytes;
  py::list phases;
  for (const auto& p : peaks.phase_peaks) {
    py::dict d;
    d["phase"] = autobatch::phaseKey(p.phase);
    d["micro_batch_index"] = p.micro_batch_index;
    d["peak_allocated_bytes"] = p.peak_bytes;
    phases.append(d);
  }
  out["phase_peaks"] = phases;
  return out;
}

inline py::dict allocatorDict(const autobatch::AllocatorInfo& a) {
  py::dict out;
  out["config"] = a.config;
  out["config_env"] = a.config_env;
  out["pytorch_alloc_conf"] = a.pytorch_alloc_conf;
  out["pytorch_cuda_alloc_conf"] = a.pytorch_cuda_alloc_conf;
  out["expandable_segments"] = a.expandable_segments;
  out["fraction"] = a.fraction;
  return out;
}

// One memory backend (memory_backend.h) for one search: the CPU budget allocator installed in
// this process, or the CUDA caching allocator's backend over a Python CudaApi. The trial runner's
// calls, under their Python names; remove() restores what the backend changed (the CPU allocator,
// the memory fraction), as its destructor does in the command.
class Backend {
 public:
  /// `set_point`: where the trial point goes besides the backend's phase (the CPU budget
  /// allocator's phase peaks; null on CUDA, which reads its phases from the allocator).
  Backend(std::unique_ptr<autobatch::detail::MemoryBackend> backend,
          void (*set_point)(const autobatch::detail::TrialPoint&))
      : backend_(std::move(backend)), set_point_(set_point) {}
  std::string name() const { return alive().name(); }
  std::int64_t limitBytes() const { return alive().limitBytes(); }
  std::string limitSource() const { return alive().limitSource(); }
  std::int64_t currentBytes() const { return alive().currentBytes(); }
  bool needsWarmUp() const { return alive().needsWarmUp(); }
  void finishSetup(std::int64_t untracked_bytes) { alive().finishSetup(untracked_bytes); }
  void beginTrial() { alive().beginTrial(); }
  // Where the trial is, as the runner's enter(): the process-wide point (the budget allocator's
  // phase peaks and fault injection) and the backend's phase (CUDA: the allocator's peak read and
  // reset at the boundary, host-side statistics, no synchronize).
  void setPoint(const std::string& phase, std::int64_t micro_batch_size, int micro_batch_index,
                int step) {
    auto& backend = alive();
    autobatch::detail::TrialPoint point;
    point.phase = phaseNamed(phase);
    point.micro_batch_size = micro_batch_size;
    point.micro_batch_index = micro_batch_index;
    point.step = step;
    if (set_point_ != nullptr) set_point_(point);
    if (!backend.poisoned()) backend.enterPhase(point.phase, micro_batch_index);
  }
  py::dict endTrial() { return peaksDict(alive().endTrial()); }
  void releaseCaches() { alive().releaseCaches(); }
  void synchronize() { alive().synchronize(); }
  bool processLimitNear(std::int64_t peak_bytes, std::int64_t failed_request_bytes) const {
    return alive().processLimitNear(peak_bytes, failed_request_bytes);
  }
  std::vector<std::string> limitWarnings() const { return alive().limitWarnings(); }
  py::dict allocatorInfo() const { return allocatorDict(alive().allocatorInfo()); }
  std::int64_t outsideBytes() const { return alive().outsideBytes(); }
  void markPoisoned() { alive().markPoisoned(); }
  bool poisoned() const { return alive().poisoned(); }
  void remove() { backend_.reset(); }
  bool installed() const { return backend_ != nullptr; }

 private:
  autobatch::detail::MemoryBackend& alive() const {
    if (!backend_) throw autobatch::Error("memory backend: already removed");
    return *backend_;
  }
  std::unique_ptr<autobatch::detail::MemoryBackend> backend_;
  void (*set_point_)(const autobatch::detail::TrialPoint&) = nullptr;
};

/// Binds Backend's calls on `cls` (the module adds its own factory: cpu_budget or cuda).
inline void defineBackend(py::class_<Backend>& cls) {
  cls.def("name", &Backend::name)
      .def("limit_bytes", &Backend::limitBytes)
      .def("limit_source", &Backend::limitSource)
      .def("current_bytes", &Backend::currentBytes)
      .def("needs_warm_up", &Backend::needsWarmUp)
      .def("finish_setup", &Backend::finishSetup)
      .def("begin_trial", &Backend::beginTrial)
      .def("set_point", &Backend::setPoint, py::arg("phase"), py::arg("micro_batch_size") = 0,
           py::arg("micro_batch_index") = 0, py::arg("step") = 0)
      .def("end_trial", &Backend::endTrial)
      .def("release_caches", &Backend::releaseCaches)
      .def("synchronize", &Backend::synchronize)
      .def("process_limit_near", &Backend::processLimitNear)
      .def("limit_warnings", &Backend::limitWarnings)
      .def("allocator_info", &Backend::allocatorInfo)
      .def("outside_bytes", &Backend::outsideBytes)
      .def("mark_poisoned", &Backend::markPoisoned)
      .def("poisoned", &Backend::poisoned)
      .def("remove", &Backend::remove)
      .def("installed", &Backend::installed);
}

}  // namespace autobatch::python
