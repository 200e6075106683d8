// The CPU budget allocator as a Python extension of its own, compiled on first use against the
// environment's torch (autobatch/_budget.py, through torch.utils.cpp_extension) so that
// autobatch._core stays free of torch and one wheel serves every torch. It holds the allocator
// (cpu_budget.cpp, the one file that needs c10 and ATen), its backend (`Backend.cpu_budget`) and
// what the allocator knows of the process's allocations; the per-thread trial scopes it consults
// at each allocation stay in _core, reached through the C table of memory/budget_host.h, which
// _core hands over as a capsule when this module is imported.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "memory/budget_host.h"
#include "memory/memory_backend.h"
#include "python/backend_binding.h"

namespace py = pybind11;

namespace autobatch::detail {
namespace {
const AutobatchBudgetHost* g_host = nullptr;  // set once at import, before any allocator exists
}  // namespace

// The budget allocator's questions, answered by _core's scopes (budget_host.h).
bool budgetUntracked() { return g_host->untracked() != 0; }
bool budgetInterruptDue() { return g_host->interrupt_due() != 0; }
bool budgetBackendScope() { return g_host->backend_scope() != 0; }

}  // namespace autobatch::detail

namespace {

// What the CPU budget allocator knows of the process's allocations, for the package and the
// benchmarks (scripts/bench/fsdp_fidelity.py).
void defineBudgetQueries(py::module_& m) {
  // A storage's data_ptr() from Python is an address as an integer: the one cast of the module.
  m.def("is_tracked", [](std::uintptr_t data) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the address is only compared, never read
    return autobatch::detail::isBudgetTracked(reinterpret_cast<const void*>(data));
  });
  m.def("watch_external", &autobatch::detail::watchBudgetExternal, py::arg("weak_storage"),
        py::arg("bytes"),
        "Watches a storage counted in the CPU budget's baseline (finish_setup): its bytes leave "
        "the count once it is freed. weak_storage: torch.UntypedStorage._weak_ref(), owned by "
        "the allocator from then on (released when the storage dies or the backend is removed).");
  m.def("refusals", [] { return autobatch::detail::budgetRefusals().first; });
  m.def(
      "foreign_allocations", [] { return autobatch::detail::budgetForeignAllocations(); },
      "(count, bytes) other threads allocated during trials since the process started.");
  m.def(
      "own_peak", [] { return autobatch::detail::budgetOwnPeak(); },
      "(the trial's peak without the bytes set apart, the bytes set apart held now) since the "
      "trial began; set apart: other threads' allocations and those inside backend_scope(True).");
  m.def("start_allocation_log", &autobatch::detail::startAllocationLog,
        "Starts recording the budget allocator's allocations and releases (process-wide, one "
        "recording at a time); returns the bytes it counts as held now.");
  m.def(
      "stop_allocation_log",
      [] {
        const std::vector<autobatch::detail::AllocationEvent> events =
            autobatch::detail::stopAllocationLog();
        std::int64_t held = 0;
        std::int64_t rise = 0;
        std::int64_t allocated = 0;
        std::int64_t allocations = 0;
        for (const auto& e : events) {
          held += e.bytes;
          rise = std::max(rise, held);
          if (e.bytes > 0) {
            allocated += e.bytes;
            ++allocations;
          }
        }
        return py::make_tuple(rise, allocated, allocations);
      },
      "Stops the recording: (rise, allocated, allocations), the most bytes held above the start "
      "at any point, the bytes allocated and the count of allocations since start_allocation_log.");
  m.def(
      "stop_allocation_log_events",
      [] {
        const std::vector<autobatch::detail::AllocationEvent> events =
            autobatch::detail::stopAllocationLog();
        std::vector<std::int64_t> bytes;
        std::vector<std::int64_t> freed;
        bytes.reserve(events.size());
        freed.reserve(events.size());
        std::unordered_map<const void*, std::int64_t> live;  // pointer -> its allocation's index
        for (const auto& e : events) {
          const auto index = static_cast<std::int64_t>(bytes.size());
          bytes.push_back(e.bytes);
          if (e.bytes > 0) {
            live[e.data] = index;
            freed.push_back(-1);
          } else {
            const auto it = live.find(e.data);
            freed.push_back(it == live.end() ? -1 : it->second);
            if (it != live.end()) live.erase(it);
          }
        }
        return py::make_tuple(bytes, freed);
      },
      "Stops the recording: (bytes, freed), one entry a tracked event in order: bytes > 0 an "
      "allocation, < 0 a release; freed[i], for a release, the index of the allocation it "
      "releases (-1: one made before start_allocation_log, and for every allocation).");
  m.def("set_refusal_suffix", &autobatch::detail::setBudgetRefusalSuffix, py::arg("suffix"),
        "Text appended to every refusal's message from now on ('' for none): the fair race's "
        "harness words the budget's refusal as the peers' matchers expect (issue 44).");
}

// _core's table, checked against the layout this module was compiled with.
const AutobatchBudgetHost* hostFromCore(const py::module_& core) {
  const auto capsule = core.attr("budget_host")().cast<py::capsule>();
  const auto* host = capsule.get_pointer<const AutobatchBudgetHost>();
  if (host == nullptr || host->version != kBudgetHostVersion) {
    throw py::import_error(
        "autobatch's CPU budget module does not match autobatch._core (budget host table version " +
        std::to_string(host == nullptr ? 0U : host->version) + ", expected " +
        std::to_string(kBudgetHostVersion) +
        "): reinstall autobatch, then remove the budget module's cache folder (autobatch._budget)");
  }
  return host;
}

}  // namespace

// TORCH_EXTENSION_NAME: the module name autobatch/_budget.py gives torch.utils.cpp_extension.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "autobatch's CPU budget allocator, compiled for this torch (autobatch._budget)";
  const py::module_ core = py::module_::import("autobatch._core");
  autobatch::detail::g_host = hostFromCore(core);
  // autobatch::Error raised here is the package's one error type, autobatch._core.Error.
  // A reference kept for the process's life (released, never decremented at exit).
  static PyObject* const error_type = core.attr("Error").cast<py::object>().release().ptr();
  py::register_local_exception_translator(
      [](std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param): pybind11's type
        try {
          if (p) std::rethrow_exception(p);
        } catch (const autobatch::Error& e) {
          PyErr_SetString(error_type, e.what());
        }
      });
  defineBudgetQueries(m);
  py::class_<autobatch::python::Backend> backend(m, "Backend", py::module_local());
  backend.def_static(
      "cpu_budget",
      [](std::int64_t limit_bytes, std::int64_t reserve_bytes) {
        return autobatch::python::Backend(
            autobatch::detail::makeCpuBudgetBackend(limit_bytes, reserve_bytes),
            &autobatch::detail::setTrialPoint);
      },
      py::arg("limit_bytes"), py::arg("reserve_bytes") = 0,
      "The CPU budget allocator, installed in this process until remove().");
  autobatch::python::defineBackend(backend);
}
