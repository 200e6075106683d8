// autobatch/search/search.h — finds the largest micro-batch that trains, from trials run by a
// probe.
//
// Contract: the search is plain C++ (no LibTorch). It sees only a `Probe`
// (autobatch/vocabulary/trial.h), decides which micro-batch to try next, and never reports a size
// it did not see fit: every batch in a SearchResult was the request of a trial whose outcome was
// kFits and that was not cancelled. Out-of-memory and size-limit outcomes steer the search;
// exceptions thrown by the probe (model or device errors) propagate unchanged and end the search.
// Strategies and their guarantees: docs/search.md. The overloads that run a model (TrainingSpec)
// live elsewhere. Thread safety: findMaxBatch calls the probe and the cancel hook from the calling
// thread only (a trial runner asks the hook from the same thread, inside the probe); concurrent
// searches need their own probes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch {

/// How a search ended.
enum class SearchStatus {
  kFound,  ///< "found": the bracket closed within the tolerance (or at a bound)
  /// "nothing-fits": the minimum batch did not fit (OOM or size limit), or fit only with a peak
  /// above the limit less the margin (then max_micro_batch > 0 and safe_micro_batch == 0)
  kNothingFits,
  kTrialBudget,  ///< "trial-budget": SearchOptions::max_trials ran out; best verified size kept
  kTimeBudget,   ///< "time-budget": SearchOptions::time_limit_s ran out; best verified size kept
  kCancelled,    ///< "cancelled": the cancel hook asked to stop; best verified size kept
};

/// "found", "nothing-fits", "trial-budget", "time-budget" or "cancelled".
std::string_view toString(SearchStatus status);

/// peak(B) = fixed_bytes + per_sample_bytes * B, fitted to the measured peaks (TrialResult::
/// peak_bytes) of fitting single-micro-batch trials. Least squares over all of them; the search
/// itself steers by secants (docs/search.md).
struct AffineFit {
  /// Intercept, in bytes (parameters, gradients, optimizer state, workspaces). May be negative
  /// when the curve bends upwards.
  double fixed_bytes = 0.0;
  /// Slope, in bytes per sample.
  double per_sample_bytes = 0.0;
  /// Distinct batch sizes the fit used; 0 or 1 means no fit (both figures 0).
  int points = 0;

  /// fixed_bytes + per_sample_bytes * micro_batch_size, in bytes (0 without a fit).
  double predictBytes(std::int64_t micro_batch_size) const;
};

/// Samples per second of a completed trial: micro_batch_size * micro_batches_per_step /
/// step_ms * 1000. 0 when the trial did not fit or has no step time.
double samplesPerSecond(const TrialResult& trial);

/// What a search found. Batch sizes are micro-batch sizes in samples; 0 means "none verified".
struct SearchResult {
  SearchStatus status = SearchStatus::kFound;
  /// The largest micro-batch seen to fit (raw maximum, no headroom). 0 when nothing was verified.
  std::int64_t max_micro_batch = 0;
  /// The largest micro-batch seen to fit whose measured peak_bytes <= memory_limit_bytes -
  /// margin_bytes. <= max_micro_batch; 0 when none was verified. Equals max_micro_batch when the
  /// probe reports no memory limit.
  std::int64_t safe_micro_batch = 0;
  /// Micro-batches per optimizer step of the search trials (SearchOptions::
  /// micro_batches_per_step): 1 or 2.
  int micro_batches_per_step = 1;
  /// The limit the trials ran under, in bytes (the last trial's TrialResult::memory_limit_bytes,
  /// else SearchOptions::memory_limit_bytes). 0 when unknown.
  std::int64_t memory_limit_bytes = 0;
  /// Headroom in bytes: SearchOptions::margin_bytes if >= 0, else margin_fraction x the limit.
  std::int64_t margin_bytes = 0;
  /// The affine model of peak bytes against the micro-batch (single-micro-batch fitting trials).
  AffineFit fit;
  /// fit.predictBytes(max_micro_batch) and the peak measured there, in bytes (0 when none).
  double predicted_peak_bytes = 0.0;
  std::int64_t measured_peak_bytes = 0;
  /// The accumulation plan for SearchOptions::target_batch, planned on plan_max_micro_batch;
  /// nullopt when no target was given or nothing fits.
  std::optional<AccumulationPlans> plan;
  /// The maximum micro-batch the plan was made for: safe_micro_batch, or smaller when the
  /// two-micro-batch verification had to step down. 0 without a plan.
  std::int64_t plan_max_micro_batch = 0;
  /// True when the plan's largest micro-batch was seen to fit (under the margin) with 2
  /// micro-batches per step, when the search trials already ran 2 micro-batches per step, or when
  /// the plan needs no accumulation (one micro-batch of at most the verified safe batch; memory
  /// is assumed monotone below it).
  bool plan_verified = false;
  /// Every trial, in the order run (retries included).
  std::vector<TrialResult> trials;
  /// Wall time of the search, in seconds (trials included).
  double elapsed_s = 0.0;
  /// The smallest micro-batch that hit a kernel's size limit (kSizeLimit), and its reason;
  /// 0 and "" when none did. The search stays below it.
  std::int64_t size_limit_batch = 0;
  std::string size_limit_reason;
  /// kNothingFits only: what the minimum batch needs, at least, in bytes: the failed trial's
  /// peak_bytes + failed_request_bytes (an OOM trial only gives a lower bound), or its measured
  /// peak_bytes when it fit only above the limit less the margin. 0 when unknown.
  std::int64_t min_batch_needs_at_least_bytes = 0;
  /// What bounds max_micro_batch from above: "memory" (a larger batch ran out of memory, or
  /// nothing fits at the minimum batch; when the search stopped before any batch was verified,
  /// the budget or cancellation that stopped it), "max-batch" (SearchOptions::max_batch: memory may
  /// allow more, not searched), "dataset-size" (SearchOptions::dataset_size), "size-limit" (the
  /// next batch hit a kernel's size limit), or, when the search stopped before its bracket closed,
  /// "trial-budget", "time-budget" or "cancelled" (larger batches were not ruled out).
  std::string capped_by;
  /// True when a batch failed although a larger one fit (after one retry of the failed size).
  bool non_monotonic = false;
  /// The fitting single-micro-batch trial with the most samples per second (0 when none).
  std::int64_t fastest_micro_batch = 0;
  /// Human-readable warnings (non-monotonic memory, transient failures, budgets, the fastest
  /// batch not being the largest, step-downs of the plan). The CLI logs them.
  std::vector<std::string> warnings;
};

/// Headroom in bytes under a limit of `memory_limit_bytes`: options.margin_bytes when >= 0, else
/// options.margin_fraction x the limit (rounded down).
std::int64_t marginBytes(const SearchOptions& options, std::int64_t memory_limit_bytes);

/// Finds the largest micro-batch for which `probe` reports kFits, and the safe batch under the
/// headroom, per `options` (strategy, bounds, tolerance, budgets, cancel hook, target and plan).
///
/// Side effects: runs trials through `probe` (each may run real training steps); every request
/// carries options.cancel. Returns: see SearchResult; a budget, cancellation or nothing fitting
/// is a status, not an exception.
/// Throws: autobatch::Error for invalid options (min_batch < 1, max_batch or dataset_size below
/// min_batch, margin_fraction outside [0, 1), negative relative_tolerance, micro_batches_per_step
/// not 1 or 2, allocation units below 1 byte, a strategy outside the enumeration, an impossible
/// target/world size — the planner's message); any exception thrown by the probe, unchanged.
SearchResult findMaxBatch(const Probe& probe, const SearchOptions& options);

}  // namespace autobatch
