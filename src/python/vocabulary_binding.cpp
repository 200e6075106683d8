// autobatch._core's vocabulary constants (bindings.h): the names, units and statuses the Python
// package would otherwise spell a second time (strategy and plan names in _find.py, the caching
// allocator's units, the command's exit statuses in _errors.py), read from the tables the command
// parses its flags with and exits by.
#include <pybind11/stl.h>

#include <string>
#include <string_view>
#include <vector>

#include "autobatch/vocabulary/exit_codes.h"
#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace autobatch::python {
namespace {

py::tuple names(const std::vector<std::string_view>& values) {
  py::tuple out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = std::string(values[i]);
  return out;
}

}  // namespace

void defineVocabulary(py::module_& m) {
  m.attr("STRATEGIES") = names(strategyNames());
  m.attr("PLAN_KINDS") = names(planKindNames());
  m.attr("FAILURE_KINDS") =
      names({toString(FailureKind::kOutOfMemory), toString(FailureKind::kSizeLimit),
             toString(FailureKind::kRethrow), toString(FailureKind::kPossibleOutOfMemory)});
  m.attr("TRIAL_OUTCOMES") =
      names({toString(TrialOutcome::kFits), toString(TrialOutcome::kOutOfMemory),
             toString(TrialOutcome::kSizeLimit)});
  py::dict units;
  units["block_bytes"] = kCudaCachingAllocatorUnits.block_bytes;
  units["page_bytes"] = kCudaCachingAllocatorUnits.page_bytes;
  m.attr("CUDA_ALLOCATION_UNITS") = units;
  py::dict exits;
  exits["ok"] = kExitCodes.ok;
  exits["runtime_error"] = kExitCodes.runtime_error;
  exits["usage"] = kExitCodes.usage;
  exits["does_not_fit"] = kExitCodes.does_not_fit;
  exits["ranks"] = kExitCodes.ranks;
  exits["interrupted"] = kExitCodes.interrupted;
  exits["terminated"] = kExitCodes.terminated;
  m.attr("EXIT_CODES") = exits;
}

}  // namespace autobatch::python
