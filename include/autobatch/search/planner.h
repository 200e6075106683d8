// autobatch/search/planner.h — turns a maximum micro-batch and a target effective batch into a
// gradient-accumulation plan.
//
// Contract: pure arithmetic, no LibTorch, no I/O, no allocation beyond the returned vectors.
// The effective batch of every returned plan equals the target exactly (micro-batches summed over
// the accumulation steps, times the world size); an impossible target is an autobatch::Error, never
// a silently smaller batch. Thread safety: the function is pure and may be called from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "autobatch/vocabulary/search_options.h"

namespace autobatch {

/// The most accumulation steps whose micro-batch sizes the reports list one by one (the JSON's
/// "micro_batches", AUTOBATCH_MICRO_BATCHES); above it only the groups describe a plan.
inline constexpr std::int64_t kMicroBatchListLimit = 4096;

/// `count` micro-batches of `micro_batch_size` samples each, within one optimizer step of one rank.
struct MicroBatchGroup {
  /// Samples per micro-batch. Range >= 1.
  std::int64_t micro_batch_size = 0;
  /// How many micro-batches of that size one optimizer step runs. Range >= 1.
  std::int64_t count = 0;

  bool operator==(const MicroBatchGroup&) const = default;
};

/// One accumulation plan for one rank. The same plan runs on every rank.
struct AccumulationPlan {
  /// kUniform or kBalanced (never kAuto or kFastest).
  PlanKind kind = PlanKind::kUniform;
  /// The micro-batches of one optimizer step, at most two groups, the larger size first; the two
  /// sizes differ by exactly one sample. A uniform plan has one group.
  std::vector<MicroBatchGroup> groups;
  /// Gradient accumulation steps: micro-batches per optimizer step (the sum of the counts). >= 1.
  std::int64_t accumulation_steps = 0;
  /// Samples per optimizer step on one rank: target / world size.
  std::int64_t per_rank_batch = 0;
  /// Data-parallel ranks. >= 1.
  int world_size = 1;
  /// Samples per optimizer step over all ranks; always equal to the requested target.
  std::int64_t effective_batch = 0;
  /// Samples per second of one rank running this plan, predicted by the search from the trials'
  /// measured step times: each micro-batch takes its size over the samples per second measured
  /// at that size (linear interpolation between the two nearest measured batches, the nearest
  /// alone beyond them). 0: no prediction (no trial within 25% of a micro-batch of the plan, or
  /// planned without a search).
  double predicted_samples_per_second = 0.0;

  /// The largest micro-batch of the plan, in samples (what memory must hold).
  std::int64_t largestMicroBatch() const;
  /// The sizes of the micro-batches of one step, in order (larger ones first);
  /// accumulation_steps entries. Allocates one entry per step: a target of 2^40 samples at a
  /// micro-batch of 2 is 2^39 entries, so reports describe a plan by its groups and list its
  /// sizes only while listsMicroBatches() (docs/report.md).
  std::vector<std::int64_t> microBatchSizes() const;
  /// True when accumulation_steps <= kMicroBatchListLimit: the reports list the sizes.
  bool listsMicroBatches() const;
  /// The loss weight of a micro-batch of `micro_batch_size` samples: its share of the rank's
  /// samples, micro_batch_size / per_rank_batch. Weights of one step sum to 1. Scale each
  /// micro-batch's mean loss by it so the accumulated gradient equals the full batch's mean.
  double lossWeight(std::int64_t micro_batch_size) const;
};

/// Both plans for one (maximum, target, world size), and which one is primary.
struct AccumulationPlans {
  /// Equal micro-batches: the largest divisor of the per-rank target not above the maximum —
  /// what a fixed-size data loader needs. May take many steps when the target has no good divisor
  /// (a prime target takes target steps of 1 sample).
  AccumulationPlan uniform;
  /// The fewest steps, ceil(per-rank target / maximum), micro-batches differing by at most one
  /// sample, each weighted by its share of the samples.
  AccumulationPlan balanced;
  /// kUniform or kBalanced: the plan a launcher should run (exported by --env).
  PlanKind primary_kind = PlanKind::kUniform;
  /// The inputs, for reports.
  std::int64_t max_micro_batch = 0;
  std::int64_t target_batch = 0;

  /// The primary plan (uniform or balanced, per primary_kind).
  const AccumulationPlan& primary() const;
};

/// Plans gradient accumulation so that micro x steps x world_size == target_batch exactly.
///
/// - max_micro_batch: the largest micro-batch one rank can train, in samples (the safe batch of
///   the search). Range >= 1.
/// - target_batch: the effective (global) batch, in samples. Range >= world_size and divisible by
///   world_size.
/// - world_size: data-parallel ranks. Range >= 1. Default: 1.
/// - kind: which plan is primary. kAuto: uniform, unless the uniform micro-batch is below half of
///   min(max_micro_batch, per-rank target), then balanced. kFastest needs measured step times,
///   which only the search has (findMaxBatch decides it); here it is kAuto. Default: kAuto.
///
/// A per-rank target at or below the maximum gives one step of the whole per-rank target in both
/// plans. Returns: both plans (each exact), the primary one marked.
/// Throws: autobatch::Error when an argument is out of range, or when the target is below the
/// world size or not divisible by it; the message names the nearest valid targets, e.g.
/// "target batch: expected a multiple of the world size 3, but got 100; nearest valid targets: 99
/// or 102".
AccumulationPlans planAccumulation(std::int64_t max_micro_batch, std::int64_t target_batch,
                                   int world_size = 1, PlanKind kind = PlanKind::kAuto);

}  // namespace autobatch
