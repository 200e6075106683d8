// autobatch._core: the library's search, planner, report, failure classification, the CUDA
// caching allocator's backend over a Python CudaApi, and the per-thread trial scopes, for the
// Python package (src/python/autobatch, docs/python.md). It includes no torch header and links no
// torch library, so one build serves every torch; the CPU budget allocator, which needs torch's
// C++ ABI, is a module of its own compiled on first use (budget_module.cpp, autobatch/_budget.py).
//
// Only plain data crosses the boundary: integers, floats, strings, lists, dicts and JSON text. No
// tensor and no torch object does. The user's training step
// is a Python callable (the probe) that the C++ search calls once per trial with the GIL held; it
// returns a plain dict (see trialFromDict) and must never let an out-of-memory error cross into
// C++: the Python side turns it into a record and clears its frames first (a failed step's tensors
// stay alive as long as the exception does).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/reports/report.h"
#include "autobatch/run/ranks.h"
#include "autobatch/run/result_cache.h"
#include "autobatch/search/planner.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/units.h"
#include "autobatch/vocabulary/version.h"
#include "autobatch/workflows/cached_search.h"
#include "memory/budget_host.h"
#include "memory/cuda_api.h"
#include "memory/memory_backend.h"
#include "python/backend_binding.h"
#include "python/bindings.h"
#include "python/converters.h"
#include "reports/report_internal.h"

namespace py = pybind11;
using autobatch::TrialPhase;
using autobatch::python::cacheOf;
using autobatch::python::contextFromDict;
using autobatch::python::get;
using autobatch::python::memoryFromDict;
using autobatch::python::optionsFromDict;
using autobatch::python::trialFromDict;

namespace {

// The status, exit code and texts of a finished search, as the CLI writes them.
py::dict reportOf(autobatch::ReportData& data) {
  py::dict out;
  out["json"] = autobatch::toJson(data);
  out["text"] = autobatch::humanReport(data);
  out["env"] = autobatch::envLines(data);
  return out;
}

// BuildInfo as the torch this process imported sees it (the extension is built without torch's
// headers, so TORCH_VERSION and the CUDA runtime calls of version.cpp are not here): torch's
// version without its local part ("2.11.0", as TORCH_VERSION), torch.version.cuda, the driver,
// and the GPUs torch sees.
autobatch::BuildInfo pythonBuildInfo() {
  autobatch::BuildInfo info;
  info.autobatch_version = AUTOBATCH_VERSION;
  const py::module_ torch = py::module_::import("torch");
  const auto version = torch.attr("__version__").cast<std::string>();
  info.libtorch_version = version.substr(0, version.find('+'));
  const py::object cuda = torch.attr("version").attr("cuda");
  info.cuda_build = !cuda.is_none();
  if (!info.cuda_build) return info;
  info.cuda_version = cuda.cast<std::string>();
  // 0 where no driver is installed (autobatch/_cuda_api.py, driver_version)
  info.cuda_driver_version =
      py::module_::import("autobatch._cuda_api").attr("driver_version")().cast<int>();
  const py::object torch_cuda = torch.attr("cuda");
  if (!torch_cuda.attr("is_available")().cast<bool>()) return info;
  const int count = torch_cuda.attr("device_count")().cast<int>();
  for (int i = 0; i < count; ++i) {
    const py::object p = torch_cuda.attr("get_device_properties")(i);
    info.cuda_devices.push_back({i, p.attr("name").cast<std::string>(),
                                 p.attr("total_memory").cast<std::int64_t>(),
                                 p.attr("major").cast<int>(), p.attr("minor").cast<int>()});
  }
  return info;
}

// The report's fields that come from the Python side's facts (see search) and the options.
autobatch::ReportData reportData(const py::dict& facts, const autobatch::SearchOptions& options) {
  autobatch::ReportData data;
  data.build = pythonBuildInfo();
  // The devices as torch sees them (name, total memory): the report's device fields whatever
  // CUDA this extension was built with.
  if (facts.contains("cuda_devices")) {
    data.build.cuda_devices.clear();
    for (const auto& item : facts["cuda_devices"].cast<py::list>()) {
      const auto d = item.cast<py::dict>();
      data.build.cuda_devices.push_back({get<int>(d, "index", 0), get<std::string>(d, "name", ""),
                                         get<std::int64_t>(d, "total_bytes", 0),
                                         get<int>(d, "major", 0), get<int>(d, "minor", 0)});
    }
  }
  data.spec.model_path = get<std::string>(facts, "name", "python model");
  data.spec.device = get<std::string>(facts, "device", "cpu");
  data.spec.steps_per_trial = get<int>(facts, "steps_per_trial", 2);
  data.model_sha1 = get<std::string>(facts, "fingerprint", "");
  data.step_description = get<std::string>(facts, "step", "");
  data.options = options;
  return data;
}

// A Python callable fn(micro_batch_size, micro_batches_per_step) -> a trial dict as the search's
// probe; `measure` (None: fn) the same for the search's measuring trials (TrialRequest::measure),
// which may shorten them (the dict's "shortened"). Both must outlive it.
autobatch::Probe pythonProbe(const py::object& fn, const py::object& measure = py::none()) {
  return [&fn, &measure](const autobatch::TrialRequest& request) {
    // The search's deadline and the caller's cancellation, seen inside the trial: at each CPU
    // allocation (the budget allocator) and between steps (trial_should_stop); issue 40 row 15.
    // Asked at most every 2 ms: each ask takes the GIL and calls Python (about 3 us, which on
    // a step of a thousand small allocations was a tenth of its time).
    const std::function<bool()> hook = [&request,
                                        last = std::chrono::steady_clock::time_point{}]() mutable {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::milliseconds(2)) return false;
      last = now;
      return request.cancel && request.cancel();
    };
    const autobatch::detail::CpuInterruptScope interrupt(hook, false);
    const py::object& call = request.measure && !measure.is_none() ? measure : fn;
    const py::object answer = call(request.micro_batch_size, request.micro_batches_per_step);
    return trialFromDict(request, answer.cast<py::dict>());
  };
}

// ---- evaluation (docs/evaluation.md, docs/python.md) -------------------------------------------
// The Python side of an evaluation search (autobatch/_eval.py, EvalProbe), plain data only:
//   hold(training, training_batch, micro_batches) -> the trial dict of the training step that
//     makes the training state (training False: parameters only, no step), with "holds" (the
//     state is held now) and "resident_bytes" (bytes held by tensors with it);
//   eval(batch, batches) -> an evaluation trial's dict (batches: 2); release() drops the state.

// The state held, or the training step that did not fit (then `state_fits` is false).
autobatch::EvalResult holdState(const py::object& eval, const autobatch::SearchOptions& options,
                                autobatch::EvalState state) {
  autobatch::EvalResult e;
  e.state = state;
  const bool training = state == autobatch::EvalState::kTrainingResident;
  if (training) e.training_batch = std::max<std::int64_t>(options.min_batch, 1);
  autobatch::TrialRequest request;
  request.micro_batch_size = e.training_batch;
  request.micro_batches_per_step = options.micro_batches_per_step;
  const py::dict held =
      eval.attr("hold")(training, e.training_batch, options.micro_batches_per_step);
  e.training_step = trialFromDict(request, held);
  e.state_fits = get<bool>(held, "holds", false);
  e.resident_bytes = get<std::int64_t>(held, "resident_bytes", 0);
  if (!e.state_fits) {  // as findMaxEvalBatch: never an evaluation result
    e.search.status = autobatch::SearchStatus::kNothingFits;
    e.search.capped_by = "memory";
    e.search.memory_limit_bytes = e.training_step.memory_limit_bytes;
  }
  return e;
}

// `run` with the state held, the state released afterwards whatever happens.
template <typename Run>
void withState(const py::object& eval, Run run) {
  try {
    run();
  } catch (...) {
    eval.attr("release")();
    throw;
  }
  eval.attr("release")();
}

// autobatch::findMaxEvalBatch with the Python side's state and trials: the same options
// (evalSearchOptions), the same search.
autobatch::EvalResult evalSearch(const py::object& eval, const autobatch::SearchOptions& options,
                                 autobatch::EvalState state, std::int64_t start_batch) {
  autobatch::EvalResult e = holdState(eval, options, state);
  if (!e.state_fits) return e;
  const autobatch::SearchOptions o = autobatch::evalSearchOptions(options, start_batch);
  withState(eval, [&] { e.search = autobatch::findMaxBatch(pythonProbe(eval), o); });
  return e;
}

autobatch::EvalState evalStateNamed(const std::string& name) {
  if (name == "training-resident") return autobatch::EvalState::kTrainingResident;
  if (name == "parameters-only") return autobatch::EvalState::kParametersOnly;
  throw autobatch::Error(
      R"(eval state: expected "training-resident" or "parameters-only", but got ")" + name + "\"");
}

// Runs the C++ search with a Python probe. `facts` holds "model" (MemoryBreakdown's fields),
// "context" (RunContext's), "name" (the model's description for the report), "fingerprint" (the
// structure hash), "step" (the header's description of the user's step), "steps_per_trial",
// "device". With `eval` (an EvalProbe) and `eval_state`, the evaluation search as the CLI's
// --eval ("training-resident": after the training search, unless it was cancelled) or
// --eval-only ("parameters-only": the evaluation search alone, which is then `search` too).
// With `cache` (see cacheOf, and "trust"), the training search goes through the result cache
// (findMaxBatchThroughCache; not with `eval`: autobatch.find refuses that).
py::dict search(const py::function& probe, const py::dict& options_dict, const py::dict& facts,
                const py::object& cancel, const py::object& eval, const std::string& eval_state,
                const py::object& cache, const py::object& measure) {
  autobatch::SearchOptions options = optionsFromDict(options_dict);
  if (!cancel.is_none()) {
    // Also asked from the CPU allocator inside a trial, where torch's ops run without the GIL.
    options.cancel = [cancel]() -> bool {
      const py::gil_scoped_acquire gil;
      return cancel().cast<bool>();
    };
  }
  const autobatch::Probe cpp_probe = pythonProbe(probe, measure);
  autobatch::ReportData data = reportData(facts, options);
  autobatch::MaxBatchResult result;
  const bool only =
      !eval.is_none() && evalStateNamed(eval_state) == autobatch::EvalState::kParametersOnly;
  if (only) {
    result.eval = evalSearch(eval, options, autobatch::EvalState::kParametersOnly, 0);
    result.search = result.eval->search;
  } else if (!cache.is_none()) {
    if (!eval.is_none()) throw autobatch::Error("result cache: not with an evaluation search");
    const auto d = cache.cast<py::dict>();
    data.cache = cacheOf(d);
    result.search = autobatch::findMaxBatchThroughCache(cpp_probe, options, *data.cache,
                                                        get<bool>(d, "trust", false));
  } else {
    result.search = autobatch::findMaxBatch(cpp_probe, options);
    if (!eval.is_none() && result.search.status != autobatch::SearchStatus::kCancelled) {
      result.eval = evalSearch(eval, options, autobatch::EvalState::kTrainingResident,
                               result.search.safe_micro_batch);
    }
  }
  // Read after the trials: the probe fills in what only a step shows (the optimizer's state).
  result.memory = memoryFromDict(facts["model"].cast<py::dict>());
  result.context = contextFromDict(facts["context"].cast<py::dict>());
  const auto& s = result.search;
  data.status = std::string(autobatch::toString(s.status));
  data.exit_code = s.safe_micro_batch > 0 ? 0 : 3;  // docs/errors.md: 3 when nothing is verified
  if (result.eval && result.eval->search.safe_micro_batch == 0) {
    data.status = "nothing-fits";  // as the CLI: the training state, or no evaluation batch, fits
    data.exit_code = 3;
  }
  data.result = std::move(result);
  return reportOf(data);
}

// --check-eval-batch with the Python side's state and trial (autobatch::checkEvalBatch): the
// training state held, one evaluation trial of 2 batches of `eval_batch`, the verdict raw and
// under the margin; the training step's trial when the state does not fit.
py::dict checkEval(const py::object& eval, const py::dict& options_dict, const py::dict& facts,
                   std::int64_t eval_batch) {
  const autobatch::SearchOptions options = optionsFromDict(options_dict);
  if (eval_batch < 1) {
    throw autobatch::Error("check eval batch: expected an evaluation batch >= 1, but got " +
                           std::to_string(eval_batch));
  }
  autobatch::CheckResult check;
  autobatch::EvalResult e = holdState(eval, options, autobatch::EvalState::kTrainingResident);
  e.search = {};
  if (e.state_fits) {
    autobatch::TrialRequest request;
    request.micro_batch_size = eval_batch;
    request.micro_batches_per_step = 2;
    withState(eval, [&] { check.trial = trialFromDict(request, eval(eval_batch, 2)); });
  } else {
    check.trial = e.training_step;
  }
  autobatch::setCheckVerdict(check, options, e.state_fits);
  check.memory = memoryFromDict(facts["model"].cast<py::dict>());
  check.context = contextFromDict(facts["context"].cast<py::dict>());
  check.eval = std::move(e);
  autobatch::ReportData data = reportData(facts, options);
  data.status = check.fits_with_margin ? "fits" : "does-not-fit";
  data.exit_code = check.fits_with_margin ? 0 : 3;
  data.check = std::move(check);
  return reportOf(data);
}

// Both accumulation plans for `target_batch` on `max_micro_batch`, as the JSON report's "plans".
std::string plan(std::int64_t max_micro_batch, std::int64_t target_batch, int world_size,
                 const std::string& kind) {
  autobatch::SearchOptions options;
  options.target_batch = target_batch;
  options.world_size = world_size;
  options.plan = autobatch::parsePlanKind(kind);
  autobatch::SearchResult search;
  search.max_micro_batch = search.safe_micro_batch = max_micro_batch;
  search.plan_max_micro_batch = max_micro_batch;
  search.plan =
      autobatch::planAccumulation(max_micro_batch, target_batch, world_size, options.plan);
  return autobatch::detail::plansJsonText(search, options);
}

// The library's classification of a failed step (autobatch/vocabulary/failure.h): kind, reason,
// bytes.
py::dict classify(const std::string& type, const std::string& message, bool process_limit_near,
                  bool after_larger_oom) {
  autobatch::ExceptionType t = autobatch::ExceptionType::kOther;
  if (type == "out-of-memory") t = autobatch::ExceptionType::kOutOfMemoryError;
  if (type == "bad-alloc") t = autobatch::ExceptionType::kBadAlloc;
  const auto c = autobatch::classifyFailure(t, message, {process_limit_near, after_larger_oom});
  py::dict out;
  out["kind"] = std::string(autobatch::toString(c.kind));
  out["reason"] = c.reason;
  out["failed_request_bytes"] = c.failed_request_bytes;
  out["failed_in_use_bytes"] = c.failed_in_use_bytes;
  return out;
}

// A `with` scope in which this thread's CPU allocations are not counted (host snapshots).
class Untracked {
 public:
  Untracked() = default;
  Untracked(const Untracked&) = delete;
  Untracked& operator=(const Untracked&) = delete;
  void enter() { scopes_.push_back(std::make_unique<autobatch::detail::UntrackedCpuScope>()); }
  void exit() {
    if (!scopes_.empty()) scopes_.pop_back();
  }

 private:
  std::vector<std::unique_ptr<autobatch::detail::UntrackedCpuScope>> scopes_;
};

}  // namespace

namespace {

// The probe's view of the search's deadline and cancellation inside a trial (issue 40 row 15).
void defineTrialHooks(py::module_& m) {
  m.def("trial_should_stop", &autobatch::detail::interruptRequested,
        "Inside a probe's trial: True when the search's deadline passed or the search was "
        "cancelled (checked between the trial's steps).");
  m.def("interrupt_active", &autobatch::detail::setInterruptActive, py::arg("active"),
        "Inside a probe's trial: whether CPU allocations ask the deadline and cancellation (on "
        "around the trial's steps only, never around putting the weights back).");
  m.def("trial_interrupted", &autobatch::detail::interruptFired,
        "Inside a probe's trial: True when a CPU allocation was refused because the deadline "
        "passed or the search was cancelled; the error the step raised is that, not the model's.");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "autobatch's C++ search, planner, report and memory accounting (plain data only)";
  py::register_exception<autobatch::Error>(m, "Error", PyExc_ValueError);
  m.def("search", &search, py::arg("probe"), py::arg("options"), py::arg("facts"),
        py::arg("cancel") = py::none(), py::arg("eval") = py::none(), py::arg("eval_state") = "",
        py::arg("cache") = py::none(), py::arg("measure") = py::none(),
        "Runs the search with a Python probe (and the evaluation search with `eval`, or through "
        "the result cache with `cache`; `measure`, the probe of the search's measuring trials, "
        "which may shorten them); returns {'json', 'text', 'env'}.");
  defineTrialHooks(m);
  autobatch::python::defineTrialEvidence(m);
  autobatch::python::defineVocabulary(m);
  autobatch::python::defineKeys(m);
  m.def(
      "default_cache_dir",
      [] { return autobatch::defaultCacheDir(autobatch::processEnvironment()); },
      "The results folder: $AUTOBATCH_CACHE_DIR, else $XDG_CACHE_HOME/autobatch/results, else "
      "~/.cache/autobatch/results.");
  m.def("check_eval", &checkEval, py::arg("eval"), py::arg("options"), py::arg("facts"),
        py::arg("eval_batch"),
        "One evaluation trial with the training state held; returns {'json', 'text', 'env'}.");
  m.def("plan", &plan, py::arg("max_micro_batch"), py::arg("target_batch"),
        py::arg("world_size") = 1, py::arg("kind") = "auto",
        "Both accumulation plans as the JSON report's \"plans\" (JSON text).");
  m.def("classify", &classify, py::arg("type"), py::arg("message"),
        py::arg("process_limit_near") = false, py::arg("after_larger_oom") = false);
  m.def(
      "parse_bytes",
      [](const std::string& text, const std::string& what) {
        return autobatch::parseBytes(text, what);
      },
      py::arg("text"), py::arg("what") = "size");
  m.def("format_bytes", &autobatch::formatBytes);
  m.def("version", [] { return autobatch::versionText(pythonBuildInfo()); });
  m.def("backend_scope", &autobatch::detail::setBudgetBackendScope, py::arg("inside"),
        "Marks this thread as inside (True) or outside (False) a collective's call: what it "
        "allocates meanwhile is set apart from the budget's own_peak (issue 43).");
  m.def(
      "budget_host",
      [] {
        // The table is static and immutable: the capsule has no destructor.
        return py::capsule(static_cast<const void*>(autobatch::detail::budgetHost()),
                           "autobatch._core.budget_host");
      },
      "The per-thread trial scopes as a C table (memory/budget_host.h), for the CPU budget "
      "module built on first use (autobatch._budget).");
  py::class_<autobatch::python::Backend> backend(m, "Backend", py::module_local());
  backend.def_static(
      "cuda",
      [](const py::object& api, int index, std::int64_t limit_bytes, std::int64_t reserve_bytes) {
        return autobatch::python::Backend(
            autobatch::detail::makeCudaBackendWith(autobatch::python::makePyCudaApi(api), index,
                                                   limit_bytes, reserve_bytes),
            nullptr);
      },
      py::arg("api"), py::arg("index"), py::arg("limit_bytes") = 0, py::arg("reserve_bytes") = 0,
      "The CUDA caching allocator's backend (the command's) over a CudaApi written in Python "
      "(autobatch._cuda_api.TorchCudaApi). The CPU budget allocator's backend is the budget "
      "module's (autobatch._budget).");
  autobatch::python::defineBackend(backend);
  m.def(
      "is_fatal", [](const std::string& message) { return autobatch::isFatalDeviceError(message); },
      py::arg("message"),
      "True for a sticky device error (illegal address, device-side assert): no device call "
      "may follow it (autobatch/vocabulary/failure.h).");
  py::class_<Untracked>(m, "Untracked")
      .def(py::init<>())
      .def("__enter__", [](Untracked& u) { u.enter(); })
      .def("__exit__", [](Untracked& u, const py::args&) {
        u.exit();
        return false;
      });
}
