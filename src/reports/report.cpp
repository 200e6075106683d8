// The report's shared parts (src/reports/report_internal.h), the trial's peak phase and the result
// cache's key fields. The human report is in report_text.cpp, the JSON in report_json.cpp, the
// env lines in report_env.cpp, the report files in report_file.cpp.
#include "autobatch/reports/report.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "autobatch/vocabulary/trial.h"
#include "reports/report_internal.h"
#include "reports/text_format.h"

namespace autobatch {

std::string peakPhase(const TrialResult& t) {
  const PhasePeak* top = nullptr;
  for (const auto& p : t.phase_peaks) {
    // A measure of a package's forward-backward call, never the phase that set the peak.
    if (p.phase == phaseKey(TrialPhase::kCallActivations)) continue;
    if (top == nullptr || p.peak_allocated_bytes > top->peak_allocated_bytes) top = &p;
  }
  if (top == nullptr) return "";
  return top->phase + (top->micro_batch_index > 0
                           ? " #" + std::to_string(top->micro_batch_index + 1)
                           : std::string());
}

namespace detail {

const RunContext* contextOf(const ReportData& d) {
  if (d.result) return &d.result->context;
  if (d.check) return &d.check->context;
  return nullptr;
}

const MemoryBreakdown* memoryOf(const ReportData& d) {
  if (d.result) return &d.result->memory;
  if (d.check) return &d.check->memory;
  return nullptr;
}

std::string gpuName(const BuildInfo& build, const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return "cpu";
  int index = 0;
  if (const auto colon = device.find(':'); colon != std::string::npos) {
    index = std::atoi(device.c_str() + colon + 1);
  }
  for (const auto& d : build.cuda_devices) {
    if (d.index == index) return d.name;
  }
  return device;
}

std::int64_t gpuBytes(const BuildInfo& build, const std::string& device) {
  for (const auto& d : build.cuda_devices) {
    if (device == "cuda:" + std::to_string(d.index) || (device == "cuda" && d.index == 0)) {
      return d.total_bytes;
    }
  }
  return 0;
}

std::string failedPhase(const TrialResult& t) {
  if (t.failed_phase.empty()) return "";
  return t.failed_phase + (t.failed_micro_batch_index > 0
                               ? " #" + std::to_string(t.failed_micro_batch_index + 1)
                               : std::string());
}

std::int64_t modelNeedsBytes(const MemoryBreakdown& m) {
  return m.parameter_bytes + m.gradient_bytes + m.optimizer_state_bytes;
}

}  // namespace detail

CacheKey cacheKeyFields(const ReportData& d) {
  CacheKey key;
  if (!d.result) return key;
  const RunContext& c = d.result->context;
  const MemoryBreakdown& m = d.result->memory;
  const TrainingSpec& s = d.spec;
  const SearchOptions& o = d.options;
  auto add = [&key](std::string name, std::string value) {
    key.fields.emplace_back(std::move(name), std::move(value));
  };
  add("model_sha1", d.model_sha1);
  add("model_file_bytes", std::to_string(d.model_file_bytes));
  std::string inputs;
  for (const auto& spec : c.inputs) inputs += (inputs.empty() ? "" : ",") + toString(spec);
  add("inputs", inputs);
  add("loss", std::string(toString(c.loss)));
  add("optimizer", std::string(toString(s.optimizer)));
  add("optimizer_impl", m.optimizer_impl);
  add("zero_grad", std::string(toString(s.zero_grad)));
  add("keep_output", s.keep_output ? "yes" : "no");
  add("precision", std::string(toString(s.precision)));
  add("steps_per_trial", std::to_string(s.steps_per_trial));
  add("micro_batches_per_step", std::to_string(c.micro_batches_per_trial));
  add("cudnn_benchmark", s.cudnn_benchmark ? "yes" : "no");
  add("optimize_graph", s.optimize_graph ? "yes" : "no");
  add("memory_limit_bytes", std::to_string(c.memory_limit_bytes));
  add("reserve_bytes", std::to_string(o.reserve_bytes));
  add("margin", o.margin_bytes >= 0 ? std::to_string(o.margin_bytes) + " bytes"
                                    : detail::cat(o.margin_fraction, " of the limit"));
  add("strategy", std::string(toString(o.strategy)));
  add("relative_tolerance", detail::shortest(o.relative_tolerance));
  add("min_batch", std::to_string(o.min_batch));
  add("max_batch", std::to_string(o.max_batch));
  add("dataset_size", std::to_string(o.dataset_size));
  add("ddp_bucket_bytes", std::to_string(m.ddp_bucket_bytes));
  add("device_name", detail::gpuName(d.build, c.device));
  add("device_total_bytes", std::to_string(detail::gpuBytes(d.build, c.device)));
  add("cuda_driver_version", std::to_string(d.build.cuda_driver_version));
  add("libtorch_version", d.build.libtorch_version);
  add("autobatch_version", d.build.autobatch_version);
  add("allocator_config", c.allocator.config);
  return key;
}

}  // namespace autobatch
