// The wall-clock budget and the cancel flag of a workflow that runs several searches (a fleet, a
// length sweep, a cached search). Internal.
#pragma once

#include <algorithm>
#include <chrono>

#include "autobatch/vocabulary/search_options.h"

namespace autobatch {

using Clock = std::chrono::steady_clock;

// What is left of a workflow's wall-clock budget of `limit_s` seconds started at `start`, in
// seconds: 0 means no limit (limit_s <= 0); once spent, 1e-9 (a positive limit, never "none").
// Issue 27, row 10: the budget was each length's (21.6 s with --time-limit 8).
inline double timeLeftS(double limit_s, Clock::time_point start) {
  if (limit_s <= 0.0) return 0.0;
  const double spent_s = std::chrono::duration<double>(Clock::now() - start).count();
  return std::max(limit_s - spent_s, 1e-9);  // 0 would mean no limit
}

// Whether the caller's cancel flag (SearchOptions::cancel) is set.
inline bool cancelled(const SearchOptions& options) { return options.cancel && options.cancel(); }

}  // namespace autobatch
