// autobatch/workflows/fleet.h — a fleet table (issue 31, docs/fleet.md, `--fleet`): for each of
// several memory sizes (GPU kinds a job may land on), the largest micro-batch and the plan for the
// target batch, from one run on this device, each size emulated by the backend's memory limit.
//
// Contract: sizes are searched largest first, each with a trial runner of its own under that
// size's limit (SearchOptions::memory_limit_bytes). A trial already run under a larger size
// answers the same request (micro-batch and micro-batches per step) under a smaller one where that
// is sound for the backend:
// - an out-of-memory (or size-limit) outcome always transfers: the same allocations reach the
//   smaller limit no later than they reached the larger one (its failed_in_use_bytes +
//   failed_request_bytes stays a lower bound of the peak);
// - a fit transfers when its peak_bytes plus `transfer_slack_bytes` is within the smaller size's
//   trial limit: on the CPU budget allocator the peak is the exact high-water mark of the bytes it
//   counts against the limit (slack 0); under CUDA's caching allocator peak_bytes is peak
//   reserved plus the memory outside the allocator at that trial, and the slack is one
//   expandable-segments page (20 MiB), by which the allowance under a memory fraction is lower.
//   A fit whose peak is above the smaller limit is not taken as an out-of-memory (on CUDA a cap
//   below peak reserved is not a failure: the allocator frees its cache and retries): it runs.
// Each smaller size's search is seeded (SearchOptions::seed_batches) with the largest micro-batch
// whose trial transfers as a fit. When a size's safe micro-batch rests on a reused trial, that
// micro-batch runs once more under the size's own limit (FleetRow::verified); should it not fit
// there, the size is searched again with nothing reused. Sizes above what this device can emulate
// (the runner clips the limit: the process's room on the CPU, totalGlobalMem on CUDA) are rows
// with status "not-measurable", never a guess. LibTorch-free; logs through spdlog's default
// logger. Thread safety: one call at a time per process (one budget allocator on the CPU).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/reports/report.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch {

/// One memory size to size for.
struct FleetSize {
  std::string name;        ///< a GPU key ("a100-40gb") or the size text as given ("24GiB")
  std::int64_t bytes = 0;  ///< > 0
  std::string source;      ///< the GPU table's source for a key, else "given"
};

/// A GPU kind of the table: its total memory as CUDA reports it (cudaDeviceProp::totalGlobalMem,
/// bytes; what `nvidia-smi` and marketing round to "GB" are other figures) and where that figure
/// was read. docs/fleet.md lists them.
struct FleetGpu {
  std::string_view key;          ///< lowercase, e.g. "a100-40gb"
  std::string_view device_name;  ///< as CUDA names it, e.g. "NVIDIA A100-SXM4-40GB"
  std::int64_t total_bytes;      ///< totalGlobalMem
  std::string_view source;       ///< the printed figure's public source (URL)
};

/// The GPU table, in the order docs/fleet.md lists it.
const std::vector<FleetGpu>& fleetGpus();

/// Parses `--fleet`'s value: a comma-separated list of sizes with their unit ("16GiB", "24GB";
/// autobatch::parseBytes) and GPU keys of fleetGpus(), in any order. Returns them as given.
/// Throws: autobatch::Error naming the item and the fix for an empty list or item, an unknown
/// name (listing the keys), a size that is not > 0, or two items of the same size in bytes.
std::vector<FleetSize> parseFleet(const std::string& text);

/// What one size's search runs on: made by a FleetTargetFactory for that size's limit.
struct FleetTarget {
  /// Runs a trial on the device under this size's limit.
  Probe probe;
  /// The limit its trials run under, after the reserve (TrialResult::memory_limit_bytes).
  std::int64_t trial_limit_bytes = 0;
  /// False when the size is above what this device can emulate (the backend clipped it to
  /// `trial_limit_bytes`).
  bool measurable = true;
  /// The search options the runner asks for (micro-batches per step, allocation units).
  int micro_batches_per_step = 1;
  AllocationUnits allocation_units = kCudaCachingAllocatorUnits;
  /// See the file comment: 0 for the CPU budget allocator, one 20 MiB page on CUDA.
  std::int64_t transfer_slack_bytes = 0;
  /// The runner's memory breakdown and context for the report (MaxBatchResult's fields), filled
  /// into a result after its search. May be empty.
  std::function<void(MaxBatchResult&)> add_facts;
  /// Keeps the runner alive while the probe is used. May be null.
  std::shared_ptr<void> owner;
};

/// Makes the target of one size (a trial runner under `limit_bytes`). May throw
/// c10::OutOfMemoryError when the model does not fit before any trial under that limit (the
/// size's row is then "nothing-fits").
using FleetTargetFactory = std::function<FleetTarget(std::int64_t limit_bytes)>;

/// The result of sizeFleet().
struct FleetResult {
  FleetReport fleet;
  /// The search of the largest measurable size (the report's main result); nullopt when no size
  /// was measurable or the run was interrupted first.
  std::optional<MaxBatchResult> pick;
};

/// The fleet table for `sizes` (at least one; searched largest first) with `options` (its
/// memory_limit_bytes is replaced by each size; target_batch, world_size and the bounds apply to
/// every size; time_limit_s is the whole table's budget, each size getting what is left;
/// options.cancel stops it between sizes, on_trial sees every trial including reused ones).
/// Throws: what findMaxBatch throws (bad options, a model error, a fatal device error).
FleetResult sizeFleet(const std::vector<FleetSize>& sizes, const SearchOptions& options,
                      const FleetTargetFactory& make_target);

/// sizeFleet with a TrialRunner per size for `spec` (CUDA's note from its outside part).
FleetResult sizeFleet(const std::vector<FleetSize>& sizes, const TrainingSpec& spec,
                      const SearchOptions& options);

}  // namespace autobatch
