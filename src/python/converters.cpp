// The conversions of autobatch._core's plain data (converters.h).
#include "python/converters.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"

namespace py = pybind11;

namespace autobatch::python {
namespace {

// The keys that cross the binding, declared once: each converter below reads only these, refuses
// any other (a misspelled key would otherwise be read as its default), and the Python package
// reads the same lists from _core (TRIAL_RECORD_KEYS, SEARCH_OPTION_KEYS).
// A trial's record (TrialResult's field names), and what the evaluation's hold and a re-run to
// classify add to theirs.
constexpr std::array<const char*, 27> kTrialRecordKeys{"outcome",
                                                       "reason",
                                                       "peak_allocated_bytes",
                                                       "peak_reserved_bytes",
                                                       "peak_bytes",
                                                       "memory_limit_bytes",
                                                       "failed_request_bytes",
                                                       "failed_phase",
                                                       "failed_micro_batch_index",
                                                       "failed_step_index",
                                                       "failed_in_use_bytes",
                                                       "allocator_retries",
                                                       "inactive_split_peak_bytes",
                                                       "output_bytes",
                                                       "step_ms",
                                                       "steps_completed",
                                                       "cancelled",
                                                       "shortened",
                                                       "stands_for_full",
                                                       "classification_rerun",
                                                       "replayed_peak",
                                                       "phase_peaks",
                                                       "outside_growth_bytes",
                                                       "holds",
                                                       "resident_bytes",
                                                       "micro_batch_size",
                                                       "micro_batches_per_step"};
// SearchOptions' fields as autobatch.find names them (strategy and plan by their CLI names).
constexpr std::array<const char*, 18> kSearchOptionKeys{
    "memory_limit_bytes", "reserve_bytes",
    "margin_fraction",    "margin_bytes",
    "min_batch",          "max_batch",
    "dataset_size",       "initial_batch",
    "strategy",           "micro_batches_per_step",
    "relative_tolerance", "max_trials",
    "time_limit_s",       "target_batch",
    "world_size",         "plan",
    "block_bytes",        "page_bytes"};

// Throws Error naming the first key of `d` that `keys` does not list.
template <std::size_t N>
void requireKnownKeys(const py::dict& d, const std::array<const char*, N>& keys, const char* what) {
  for (const auto& item : d) {
    const auto key = item.first.cast<std::string>();
    const auto known = [&key](const char* k) { return key == k; };
    if (std::any_of(keys.begin(), keys.end(), known)) continue;
    std::string listed;
    for (const char* k : keys) listed += std::string(listed.empty() ? "" : ", ") + k;
    throw Error(std::string(what) + ": unknown key \"" + key + "\" (misspelled?); " +
                "expected some of " + listed);
  }
}

py::tuple keyNames(const char* const* first, std::size_t count) {
  py::tuple out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = std::string(first[i]);
  return out;
}

}  // namespace

void defineKeys(py::module_& m) {
  m.attr("TRIAL_RECORD_KEYS") = keyNames(kTrialRecordKeys.data(), kTrialRecordKeys.size());
  m.attr("SEARCH_OPTION_KEYS") = keyNames(kSearchOptionKeys.data(), kSearchOptionKeys.size());
}

// The probe's answer (a dict with TrialResult's field names; docs/python.md) as a TrialResult.
TrialResult trialFromDict(const TrialRequest& request, const py::dict& d) {
  requireKnownKeys(d, kTrialRecordKeys, "probe: the trial's record");
  autobatch::TrialResult r;
  r.request = request;
  const auto outcome = get<std::string>(d, "outcome", "fits");
  if (outcome == "fits") {
    r.outcome = autobatch::TrialOutcome::kFits;
  } else if (outcome == "out-of-memory") {
    r.outcome = autobatch::TrialOutcome::kOutOfMemory;
  } else if (outcome == "size-limit") {
    r.outcome = autobatch::TrialOutcome::kSizeLimit;
  } else {
    throw autobatch::Error(
        "probe: outcome must be \"fits\", \"out-of-memory\" or \"size-limit\", "
        "but got \"" +
        outcome + "\"");
  }
  r.reason = get<std::string>(d, "reason", "");
  r.peak_allocated_bytes = get<std::int64_t>(d, "peak_allocated_bytes", 0);
  r.peak_reserved_bytes = get<std::int64_t>(d, "peak_reserved_bytes", r.peak_allocated_bytes);
  r.peak_bytes = get<std::int64_t>(d, "peak_bytes", r.peak_reserved_bytes);
  r.memory_limit_bytes = get<std::int64_t>(d, "memory_limit_bytes", 0);
  r.failed_request_bytes = get<std::int64_t>(d, "failed_request_bytes", 0);
  r.failed_phase = get<std::string>(d, "failed_phase", "");
  r.failed_micro_batch_index = get<int>(d, "failed_micro_batch_index", 0);
  r.failed_step_index = get<int>(d, "failed_step_index", 0);
  r.failed_in_use_bytes = get<std::int64_t>(d, "failed_in_use_bytes", 0);
  r.allocator_retries = get<std::int64_t>(d, "allocator_retries", 0);
  r.inactive_split_peak_bytes = get<std::int64_t>(d, "inactive_split_peak_bytes", 0);
  r.output_bytes = get<std::int64_t>(d, "output_bytes", 0);
  r.step_ms = get<double>(d, "step_ms", 0.0);
  r.steps_completed = get<int>(d, "steps_completed", 0);
  r.cancelled = get<bool>(d, "cancelled", false);
  r.shortened = get<bool>(d, "shortened", false);
  r.stands_for_full = r.shortened && get<bool>(d, "stands_for_full", false);
  // The re-run that decided an ambiguous failure (TrialEvidence::judge): listed before this
  // trial, as the runner's (src/search/search.cpp).
  if (d.contains("classification_rerun") && !d["classification_rerun"].is_none()) {
    const auto rerun = d["classification_rerun"].cast<py::dict>();
    autobatch::TrialRequest again;
    again.micro_batch_size = get<std::int64_t>(rerun, "micro_batch_size", 0);
    again.micro_batches_per_step = get<int>(rerun, "micro_batches_per_step", 1);
    r.classification_rerun =
        std::make_shared<const autobatch::TrialResult>(trialFromDict(again, rerun));
  }
  if (d.contains("replayed_peak") && !d["replayed_peak"].is_none()) {
    for (const auto& item : d["replayed_peak"].cast<py::list>()) {
      const auto line = item.cast<py::sequence>();
      r.replayed_peak.push_back({line[0].cast<double>(), line[1].cast<double>()});
    }
  }
  if (d.contains("phase_peaks")) {
    for (const auto& item : d["phase_peaks"].cast<py::list>()) {
      const auto p = item.cast<py::dict>();
      r.phase_peaks.push_back({get<std::string>(p, "phase", ""),
                               get<int>(p, "micro_batch_index", 0),
                               get<std::int64_t>(p, "peak_allocated_bytes", 0)});
    }
  }
  return r;
}

// SearchOptions from the dict autobatch.find builds (keys as SearchOptions' fields; strategy and
// plan by their CLI names). Validation is the search's own (autobatch::Error, a ValueError).
SearchOptions optionsFromDict(const py::dict& d) {
  requireKnownKeys(d, kSearchOptionKeys, "search options");
  autobatch::SearchOptions o;
  o.memory_limit_bytes = get<std::int64_t>(d, "memory_limit_bytes", 0);
  o.reserve_bytes = get<std::int64_t>(d, "reserve_bytes", 0);
  o.margin_fraction = get<double>(d, "margin_fraction", o.margin_fraction);
  o.margin_bytes = get<std::int64_t>(d, "margin_bytes", -1);
  o.min_batch = get<std::int64_t>(d, "min_batch", 1);
  o.max_batch = get<std::int64_t>(d, "max_batch", 0);
  o.dataset_size = get<std::int64_t>(d, "dataset_size", 0);
  o.initial_batch = get<std::int64_t>(d, "initial_batch", o.initial_batch);
  o.strategy = autobatch::parseStrategy(get<std::string>(d, "strategy", "guided"));
  o.micro_batches_per_step = get<int>(d, "micro_batches_per_step", 1);
  o.relative_tolerance = get<double>(d, "relative_tolerance", 0.0);
  o.max_trials = get<int>(d, "max_trials", 0);
  o.time_limit_s = get<double>(d, "time_limit_s", 0.0);
  o.target_batch = get<std::int64_t>(d, "target_batch", 0);
  o.world_size = get<int>(d, "world_size", 1);
  o.plan = autobatch::parsePlanKind(get<std::string>(d, "plan", "auto"));
  o.allocation_units.block_bytes = get<std::int64_t>(d, "block_bytes", 1);
  o.allocation_units.page_bytes = get<std::int64_t>(d, "page_bytes", 1);
  return o;
}

MemoryBreakdown memoryFromDict(const py::dict& d) {
  autobatch::MemoryBreakdown m;
  m.parameter_count = get<std::int64_t>(d, "parameter_count", 0);
  m.parameter_bytes = get<std::int64_t>(d, "parameter_bytes", 0);
  m.gradient_bytes = get<std::int64_t>(d, "gradient_bytes", 0);
  m.optimizer_state_bytes = get<std::int64_t>(d, "optimizer_state_bytes", 0);
  m.baseline_bytes = get<std::int64_t>(d, "baseline_bytes", 0);
  m.ddp_bucket_bytes = get<std::int64_t>(d, "ddp_bucket_bytes", 0);
  m.optimizer_impl = get<std::string>(d, "optimizer_impl", "");
  m.model_format = get<std::string>(d, "model_format", "python");
  return m;
}

RunContext contextFromDict(const py::dict& d) {
  autobatch::RunContext c;
  c.device = get<std::string>(d, "device", "cpu");
  c.backend = get<std::string>(d, "backend", "cpu-budget");
  c.memory_limit_bytes = get<std::int64_t>(d, "memory_limit_bytes", 0);
  c.memory_limit_source = get<std::string>(d, "memory_limit_source", "");
  c.micro_batches_per_trial = get<int>(d, "micro_batches_per_trial", 1);
  if (d.contains("warnings")) c.warnings = d["warnings"].cast<std::vector<std::string>>();
  if (d.contains("allocator")) {  // the backend's allocator_info(): the CUDA device fields
    const auto a = d["allocator"].cast<py::dict>();
    c.allocator.config = get<std::string>(a, "config", "");
    c.allocator.config_env = get<std::string>(a, "config_env", "");
    c.allocator.pytorch_alloc_conf =
        get<std::optional<std::string>>(a, "pytorch_alloc_conf", std::nullopt);
    c.allocator.pytorch_cuda_alloc_conf =
        get<std::optional<std::string>>(a, "pytorch_cuda_alloc_conf", std::nullopt);
    c.allocator.expandable_segments = get<bool>(a, "expandable_segments", false);
    c.allocator.fraction = get<double>(a, "fraction", 1.0);
  }
  return c;
}

// The result cache's folder and this run's key from autobatch.find's dict {"dir", "fields":
// [(name, value), ...]}: the key is the SHA-1 of the fields' canonical text, as the CLI's.
CacheReport cacheOf(const py::dict& d) {
  autobatch::CacheReport cache;
  cache.dir = get<std::string>(d, "dir", "");
  cache.key.fields = d["fields"].cast<std::vector<std::pair<std::string, std::string>>>();
  // hashlib's SHA-1 (the CLI's is c10::sha1's): the extension is built without torch's headers.
  cache.key.hash = py::module_::import("hashlib")
                       .attr("sha1")(py::bytes(cache.key.canonicalText()))
                       .attr("hexdigest")()
                       .cast<std::string>();
  return cache;
}

namespace {

// detail::CudaApi (src/memory/cuda_api.h) over a Python object with the same calls in snake_case
// (autobatch/_cuda_api.py: TorchCudaApi over torch.cuda, or a fake in tests): the C++ CUDA backend
// then measures the package's trials as it measures the command's, with no CUDA header or toolkit
// in this extension. Called with the GIL held (every caller is a bound method); a Python exception
// arrives as py::error_already_set, a std::exception, as LibTorch's c10::Error would.
class PyCudaApi final : public detail::CudaApi {
 public:
  explicit PyCudaApi(py::object api) : api_(std::move(api)) {}
  int deviceCount() override { return api_.attr("device_count")().cast<int>(); }
  std::int64_t totalGlobalMemBytes(int index) override {
    return api_.attr("total_global_mem_bytes")(index).cast<std::int64_t>();
  }
  autobatch::detail::CudaMemInfo memInfo(int index) override {
    const auto info = api_.attr("mem_info")(index).cast<std::pair<std::int64_t, std::int64_t>>();
    return {info.first, info.second};
  }
  void initAllocator(int index) override { api_.attr("init_allocator")(index); }
  autobatch::detail::CudaAllocatorFacts allocatorFacts() override {
    const auto d = api_.attr("allocator_facts")().cast<py::dict>();
    autobatch::detail::CudaAllocatorFacts f;
    f.caching_disabled = get<bool>(d, "caching_disabled", false);
    f.backend = get<std::string>(d, "backend", "native");
    f.expandable_segments = get<bool>(d, "expandable_segments", false);
    f.config_fraction = get<double>(d, "config_fraction", 1.0);
    f.pytorch_alloc_conf = get<std::optional<std::string>>(d, "pytorch_alloc_conf", std::nullopt);
    f.pytorch_cuda_alloc_conf =
        get<std::optional<std::string>>(d, "pytorch_cuda_alloc_conf", std::nullopt);
    return f;
  }
  autobatch::detail::CudaAllocatorStats stats(int index) override {
    const auto d = api_.attr("stats")(index).cast<py::dict>();
    autobatch::detail::CudaAllocatorStats s;
    s.allocated_current_bytes = get<std::int64_t>(d, "allocated_current_bytes", 0);
    s.allocated_peak_bytes = get<std::int64_t>(d, "allocated_peak_bytes", 0);
    s.reserved_current_bytes = get<std::int64_t>(d, "reserved_current_bytes", 0);
    s.reserved_peak_bytes = get<std::int64_t>(d, "reserved_peak_bytes", 0);
    s.num_alloc_retries = get<std::int64_t>(d, "num_alloc_retries", 0);
    s.inactive_split_current_bytes = get<std::int64_t>(d, "inactive_split_current_bytes", 0);
    s.inactive_split_peak_bytes = get<std::int64_t>(d, "inactive_split_peak_bytes", 0);
    return s;
  }
  void resetPeakStats(int index) override { api_.attr("reset_peak_stats")(index); }
  double memoryFraction(int index) override {
    return api_.attr("memory_fraction")(index).cast<double>();
  }
  void setMemoryFraction(double fraction, int index) override {
    api_.attr("set_memory_fraction")(fraction, index);
  }
  void emptyCache() override { api_.attr("empty_cache")(); }
  void clearCublasWorkspaces() override { api_.attr("clear_cublas_workspaces")(); }
  void synchronize(int index) override { api_.attr("synchronize")(index); }

 private:
  py::object api_;
};

}  // namespace

std::unique_ptr<detail::CudaApi> makePyCudaApi(py::object api) {
  return std::make_unique<PyCudaApi>(std::move(api));
}

}  // namespace autobatch::python
