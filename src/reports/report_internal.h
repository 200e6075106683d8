// Internal: what the report's parts share (src/reports/report.cpp defines it; report_text.cpp,
// report_json.cpp and report_env.cpp use it). Not installed. LibTorch-free; pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "autobatch/reports/report.h"

namespace autobatch::detail {

/// The run's context (device, limit, inputs, warnings): the search's, else the check's; nullptr
/// before either ran (a usage error, say).
const RunContext* contextOf(const ReportData& data);

/// The model's memory breakdown: the search's, else the check's; nullptr before either ran.
const MemoryBreakdown* memoryOf(const ReportData& data);

/// What the report calls `device` ("cuda", "cuda:1", "cpu"): the CUDA device's name from
/// build.cuda_devices ("cuda" is index 0), "cpu" for a non-CUDA device, else `device` itself.
std::string gpuName(const BuildInfo& build, const std::string& device);

/// The total memory of CUDA device `device` ("cuda" or "cuda:N"), in bytes; 0 when it is not in
/// build.cuda_devices (the CPU included).
std::int64_t gpuBytes(const BuildInfo& build, const std::string& device);

/// The phase an out-of-memory trial failed in ("backward", "forward #2" for the second
/// micro-batch); "" when the trial did not fail in a phase.
std::string failedPhase(const TrialResult& trial);

/// What the model holds whatever the batch: parameters, gradients and optimizer state, in bytes.
std::int64_t modelNeedsBytes(const MemoryBreakdown& memory);

/// The JSON report's "plans" object for `search` under `options`, as text ("null" without a
/// plan): the Python package's autobatch.plan() reads it (src/python/core.cpp) without a whole
/// report. Defined in report_json.cpp.
std::string plansJsonText(const SearchResult& search, const SearchOptions& options);

}  // namespace autobatch::detail
