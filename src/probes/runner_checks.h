// runner_checks.h (internal) — what the trial runner checks and resolves before it loads a model:
// the training spec's and search options' numbers, and the device name. Thread safety: none
// needed (parseDevice reads the current CUDA device once).
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"

namespace autobatch::detail {

/// Throws autobatch::Error ("expected ..., but got ...") for steps per trial or accumulation
/// steps under 1, a negative memory limit or reserve, and 1 step per trial where step 2 holds
/// more than step 1 (an optimizer with state, or --zero-grad zeros; issue 27, row 8).
void checkRunnerOptions(const TrainingSpec& spec, const SearchOptions& options);

/// "cpu", "cuda" (resolved here, once, to cuda:<current device>) or "cuda:N". Throws
/// autobatch::Error for any other text.
at::Device parseDevice(const std::string& text);

}  // namespace autobatch::detail
