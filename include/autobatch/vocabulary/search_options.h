// autobatch/vocabulary/search_options.h — how the search for the largest micro-batch is run.
//
// Plain value type, no LibTorch. Read by the search (autobatch/search/search.h) and, for the memory
// limit and reserve, by the trial runner that sets up the memory backend.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "autobatch/vocabulary/trial.h"

namespace autobatch {

/// Search strategies. See docs/search.md for how each one picks the next batch.
enum class Strategy {
  kGuided,     ///< "guided": affine memory model from two small probes, jump near the boundary,
               ///< then bisect a narrow bracket, refitting with every measurement (default)
  kBinsearch,  ///< "binsearch": PyTorch Lightning's BatchSizeFinder: double to the first failure,
               ///< then bisect
  kPower,      ///< "power": Lightning's power mode: double to the first failure, keep the last fit
};

std::string_view toString(Strategy strategy);
/// Throws: autobatch::Error listing the valid names.
Strategy parseStrategy(std::string_view name);
/// Every strategy's name, in the enum's order: "guided", "binsearch", "power".
std::vector<std::string_view> strategyNames();

/// Which accumulation plan is primary (exported by --env).
enum class PlanKind {
  kAuto,      ///< "auto": uniform unless its micro-batch is below half the maximum, then balanced
  kUniform,   ///< "uniform": equal micro-batches (the largest divisor of the per-rank target)
  kBalanced,  ///< "balanced": fewest steps, micro-batches differing by at most one sample
  ///< "fastest": the plan with the higher samples per second predicted from the trials' measured
  ///< step times; balanced only when it beats uniform by at least 5%, else uniform; auto's rule
  ///< when either has no prediction (no trial within 25% of its micro-batch). Decided by the
  ///< search (findMaxBatch); planAccumulation alone treats it as auto. The CLI's default.
  kFastest,
};

std::string_view toString(PlanKind kind);
/// Throws: autobatch::Error listing the valid names.
PlanKind parsePlanKind(std::string_view name);
/// Every plan kind's name, in the enum's order: "auto", "uniform", "balanced", "fastest".
std::vector<std::string_view> planKindNames();

struct SearchOptions {
  /// Memory limit in bytes. 0: the device's (CUDA: free at start plus what this process holds;
  /// CPU: the room left by the tightest of the cgroup limits (v1 or v2, every level),
  /// MemAvailable and RLIMIT_DATA/RLIMIT_AS, plus the tensors held, measured once the model is
  /// loaded). On CUDA a smaller value emulates a smaller card through the caching allocator's
  /// memory fraction. On the CPU, whatever the value, a process guard also refuses (as out of
  /// memory) any tensor allocation that would take the whole process within max(64 MiB, 2%) of a
  /// cgroup limit or of the memory available: the kernel enforces those by killing the process
  /// (docs/trial_runner.md, "the process guard").
  std::int64_t memory_limit_bytes = 0;
  /// Bytes kept free for what a trial does not show (other processes, EMA copies, data loaders);
  /// taken off the limit before the search. Range >= 0. Default: 0.
  std::int64_t reserve_bytes = 0;
  /// Headroom as a fraction of the limit, in [0, 1). Ignored when margin_bytes >= 0. Default: 0.05.
  double margin_fraction = 0.05;
  /// Headroom in bytes; -1 means "use margin_fraction". Default: -1.
  std::int64_t margin_bytes = -1;
  /// Smallest micro-batch tried. Range >= 1. Default: 1.
  std::int64_t min_batch = 1;
  /// Largest micro-batch tried; 0 means no bound. Default: 0.
  std::int64_t max_batch = 0;
  /// Samples in the dataset (a micro-batch never exceeds it); 0 means unknown. Default: 0.
  std::int64_t dataset_size = 0;
  /// First size of the doubling strategies (Lightning's init_val). Default: 2.
  std::int64_t initial_batch = 2;
  /// Default: guided.
  Strategy strategy = Strategy::kGuided;
  /// Micro-batches per optimizer step of every search trial (TrialRequest::micro_batches_per_step):
  /// 1, or 2 when the job accumulates gradients (TrainingSpec::accumulation_steps >= 2), so that
  /// the peak of the second forward, with gradients alive, is what is measured. Default: 1.
  int micro_batches_per_step = 1;
  /// Guided only: micro-batches to try first, in order, before min_batch and the model's probes:
  /// sizes a related search makes likely (a length sweep seeds each shorter length with the
  /// longer length's maximum, which fits since memory grows with the length, and with that
  /// maximum scaled to the same tokens per micro-batch). Each is still a trial: a size is reported
  /// only when seen to fit. Clamped into [min_batch, bounds]. Empty: start at min_batch.
  std::vector<std::int64_t> seed_batches;
  /// The units the probe's allocator reserves memory in, as the search reads the measured peaks
  /// (AllocationUnits, docs/search.md). findMaxBatch(TrainingSpec) and findMaxBatch(TrialRunner&)
  /// set it from the trial runner (TrialRunner::allocatorInfo()). A probe whose allocator counts
  /// bytes may pass {1, 1}. Each unit >= 1. Default: kCudaCachingAllocatorUnits (2 MiB blocks,
  /// 20 MiB pages), taken only where every measured peak is a multiple of the unit.
  AllocationUnits allocation_units = kCudaCachingAllocatorUnits;
  /// Stop when hi <= lo * (1 + relative_tolerance); 0 is exact (lo + 1 == hi). Default: 0.
  double relative_tolerance = 0.0;
  /// Most trials to run; 0 means no budget. Default: 0.
  int max_trials = 0;
  /// Wall-clock budget of the search in seconds; 0 means none. Default: 0.
  double time_limit_s = 0.0;
  /// Target effective (global) batch for the accumulation plan; 0 means no plan. Default: 0.
  std::int64_t target_batch = 0;
  /// Data-parallel ranks that share the target batch. Range >= 1. Default: 1.
  int world_size = 1;
  /// Default: auto (the CLI's default is fastest).
  PlanKind plan = PlanKind::kAuto;
  /// Checked between trials and passed to every trial (TrialRequest::cancel: also asked at every
  /// CPU allocation inside a step, so keep it cheap). May be empty.
  CancelHook cancel;
  /// Called before every trial with its request, from the searching thread (progress logs, and
  /// naming the batch in an error the trial throws). Must not throw. May be empty.
  std::function<void(const TrialRequest&)> before_trial;
  /// Called after every trial with its result, from the searching thread (progress logs). Must
  /// not throw. May be empty.
  std::function<void(const TrialResult&)> on_trial;
};

}  // namespace autobatch
