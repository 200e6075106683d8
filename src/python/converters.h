// converters.h (internal) — the plain data that crosses autobatch._core's boundary, converted:
// the Python side's dicts into the library's types (a trial's record, search options, the
// report's facts, the result cache's key), each converter reading only the keys declared for it
// (converters.cpp: an unknown key is an error, never a default), and the CudaApi seam over a
// Python object.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "autobatch/reports/report.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"
#include "autobatch/workflows/cached_search.h"
#include "memory/cuda_api.h"

namespace autobatch::python {

/// d[key] as T, or `fallback` when the key is absent or None.
template <typename T>
T get(const pybind11::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<T>();
}

/// The probe's answer (a dict with TrialResult's field names; docs/python.md) as a TrialResult.
/// Throws autobatch::Error on an unknown key or outcome.
TrialResult trialFromDict(const TrialRequest& request, const pybind11::dict& d);

/// SearchOptions from the dict autobatch.find builds (keys as SearchOptions' fields; strategy and
/// plan by their CLI names). Validation is the search's own (autobatch::Error, a ValueError).
SearchOptions optionsFromDict(const pybind11::dict& d);

/// The report's memory breakdown and run context from find()'s facts.
MemoryBreakdown memoryFromDict(const pybind11::dict& d);
RunContext contextFromDict(const pybind11::dict& d);

/// The result cache's folder and this run's key from autobatch.find's dict {"dir", "fields":
/// [(name, value), ...]}: the key is the SHA-1 of the fields' canonical text, as the CLI's.
CacheReport cacheOf(const pybind11::dict& d);

/// Defines TRIAL_RECORD_KEYS and SEARCH_OPTION_KEYS on `m`: the keys the converters accept.
void defineKeys(pybind11::module_& m);

/// detail::CudaApi over a Python object with the same calls in snake_case.
std::unique_ptr<detail::CudaApi> makePyCudaApi(pybind11::object api);

}  // namespace autobatch::python
