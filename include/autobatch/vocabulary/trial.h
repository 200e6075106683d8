// autobatch/vocabulary/trial.h — the vocabulary shared by the trial runner and the search.
//
// The search never sees LibTorch: it calls a `Probe`, a function that runs (or fakes) one trial
// for a `TrialRequest` and returns a `TrialResult`. The trial runner
// (autobatch/probes/trial_runner.h) provides the real probe; tests provide fake ones. This header
// includes no LibTorch header. Thread safety: plain value types; a Probe is called from one thread
// at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace autobatch {

/// Returns true when the caller asked to stop (SIGINT/SIGTERM in the CLI, a launcher's own flag).
/// Called between training steps, from the thread that runs them; must be cheap and never throw.
using CancelHook = std::function<bool()>;

/// One trial to run: `steps` optimizer steps, each made of `micro_batches_per_step`
/// forward/backward passes of `micro_batch_size` samples. The steps per trial come from
/// TrainingSpec.
struct TrialRequest {
  /// Samples in one micro-batch (the leading dimension of every input). Range: >= 1.
  std::int64_t micro_batch_size = 1;
  /// Micro-batches per optimizer step: 1, or 2 to include the peak of gradient accumulation
  /// (gradients are alive during the second forward; N >= 2 micro-batches peak like 2).
  int micro_batches_per_step = 1;
  /// Checked before every step and, on the CPU (the budget allocator), at every allocation inside
  /// a step, from the trial's thread: a cancelled trial stops within an op (one op already
  /// running finishes first; on CUDA, at the end of the step in progress), issue 40 row 15. Keep
  /// it cheap (an atomic flag, a clock) and free of tensor allocations. May be empty.
  CancelHook cancel;
  /// A measuring trial: the search asks for the memory of each phase at this size, to predict
  /// from (the guided search's second probe and its short-aimed far jumps), not for a candidate
  /// answer (docs/search.md, "Measuring trials"). A probe may then run a shortened trial
  /// whose phases see what the full trial's steady state holds, and say so in
  /// TrialResult::shortened; one that ignores the flag runs its full trial (the command's
  /// TrialRunner does). A shortened fit is never an answer, nor a shortened failure the bound
  /// above the answer, until a full trial of the same size confirms it (the driver runs it),
  /// unless the probe marks the failure TrialResult::stands_for_full.
  bool measure = false;
};

/// What a trial ended with. Model and device errors are not outcomes: they leave as exceptions.
enum class TrialOutcome {
  kFits,         ///< every step of the trial ran to completion under the memory limit
  kOutOfMemory,  ///< an allocation failed (caching allocator, CPU budget, cuBLAS/cuDNN, ...)
  kSizeLimit,    ///< a kernel's hard size limit (e.g. cuDNN NOT_SUPPORTED, 32-bit indexing)
};

/// "fits", "out-of-memory" or "size-limit".
std::string_view toString(TrialOutcome outcome);

/// The part of a training step that a trial's memory is attributed to (TrialResult::phase_peaks,
/// TrialResult::failed_phase). A TorchScript step runs kInputs, kForward, kLoss, kBackward per
/// micro-batch, then kOptimizerStep. A pt2 (AOTInductor) package runs kInputs, then
/// kForwardBackward, its one call (forward, loss and backward together), then kOptimizerStep.
/// kCallActivations is not a phase of its own but a measure of that call, recorded beside it: its
/// peak counting none of the gradients it returns (the bytes held when the call started, plus the
/// largest sum of its other allocations alive at once). Like eager's forward, it grows with the
/// batch where forward-backward's peak, reached at small batches with every gradient held, reads
/// flat; the search bounds forward-backward's slope by it (docs/search.md, docs/formats.md).
/// kIdle: between steps (never reported).
enum class TrialPhase {
  kIdle,
  kInputs,
  kForward,
  kLoss,
  kBackward,
  kOptimizerStep,
  kForwardBackward,
  kCallActivations
};

/// The phase's name as the JSON writes it (trials[].phase_peaks[].phase, PhasePeak::phase,
/// TrialResult::failed_phase): "inputs", "forward", "loss", "backward", "optimizer-step",
/// "forward-backward" (a package's call), "forward-backward-activations" (that call less its
/// gradients), "idle" (between steps). "unknown" for a value outside the enumeration. Never throws.
inline const char* phaseKey(TrialPhase phase) {
  switch (phase) {
    case TrialPhase::kIdle:
      return "idle";
    case TrialPhase::kInputs:
      return "inputs";
    case TrialPhase::kForward:
      return "forward";
    case TrialPhase::kLoss:
      return "loss";
    case TrialPhase::kBackward:
      return "backward";
    case TrialPhase::kOptimizerStep:
      return "optimizer-step";
    case TrialPhase::kForwardBackward:
      return "forward-backward";
    case TrialPhase::kCallActivations:
      return "forward-backward-activations";
  }
  return "unknown";
}

namespace detail {
// The spellings the library's own sources used before the vocabulary became public (issue 28).
using autobatch::phaseKey;
using autobatch::TrialPhase;
}  // namespace detail

/// One line of a replayed peak (TrialResult::replayed_peak): at micro-batch B the bytes held are
/// `intercept_bytes + bytes_per_sample * B`.
struct PeakLine {
  double intercept_bytes = 0.0;
  double bytes_per_sample = 0.0;
};

/// The peak of one phase of one micro-batch within a trial (the largest over its steps).
struct PhasePeak {
  /// phaseKey() of the phase: "inputs", "forward", "loss", "backward" or "optimizer-step"; for a
  /// pt2 package "inputs", "forward-backward" (its one call), "optimizer-step", and
  /// "forward-backward-activations": not a phase but a measure of that call, its peak counting
  /// none of the gradients it returns (never above forward-backward's; the search reads its
  /// slope, docs/formats.md).
  std::string phase;
  /// 0-based micro-batch within the optimizer step (0 for the optimizer step).
  int micro_batch_index = 0;
  /// Peak bytes held by tensors while the phase ran (CUDA: the caching allocator's "allocated").
  std::int64_t peak_allocated_bytes = 0;
};

/// The result of one trial. Byte figures are peaks over all steps of the trial.
struct TrialResult {
  TrialRequest request;
  TrialOutcome outcome = TrialOutcome::kFits;
  /// Why it did not fit (the allocator's or kernel's message); empty when it fits.
  std::string reason;
  /// Peak bytes held by tensors (CUDA: caching allocator "allocated"; CPU: budget allocator).
  std::int64_t peak_allocated_bytes = 0;
  /// Peak bytes reserved by the allocator (CUDA: segments held by the caching allocator;
  /// CPU: equal to peak_allocated_bytes).
  std::int64_t peak_reserved_bytes = 0;
  /// The figure compared with `memory_limit_bytes`: peak reserved plus the memory the process
  /// holds outside the allocator (CUDA context, kernels; CPU: tensors alive before the trial).
  /// On out-of-memory it is the peak reached before the failing allocation: a lower bound.
  std::int64_t peak_bytes = 0;
  /// The limit this trial ran under, in bytes (after `reserve_bytes` was taken off). The search
  /// reads it for headroom; > 0 for every real trial.
  std::int64_t memory_limit_bytes = 0;
  /// Bytes of the allocation that failed, when known (out-of-memory only), else 0.
  std::int64_t failed_request_bytes = 0;
  /// Out-of-memory only: the phase that asked for the refused allocation ("inputs", "forward",
  /// "loss", "backward", "optimizer-step"; PhasePeak::phase) and its micro-batch; "" when unknown.
  std::string failed_phase;
  int failed_micro_batch_index = 0;
  /// Out-of-memory only: the 0-based optimizer step of the trial that asked for the refused
  /// allocation (TrialRunner::runMixed names its bucket by it); 0 when unknown.
  int failed_step_index = 0;
  /// Out-of-memory only: bytes held by tensors when the refused allocation was asked (CPU budget
  /// allocator: exact; CUDA: "... is allocated by PyTorch" from the allocator's message, less its
  /// rounding), 0 when unknown. failed_in_use_bytes + failed_request_bytes is a lower bound on
  /// the failed phase's peak at this batch (the search uses it, docs/search.md).
  std::int64_t failed_in_use_bytes = 0;
  /// cudaMalloc retries by the caching allocator during the trial (0 on the CPU).
  std::int64_t allocator_retries = 0;
  /// CUDA: the trial's peak of inactive split bytes, the free fragments of split cached blocks
  /// (DeviceStats::inactive_split_bytes): reserved memory only a small request can use. 0 on
  /// the CPU.
  std::int64_t inactive_split_peak_bytes = 0;
  /// CUDA: growth of the memory outside the caching allocator seen at the end of this trial
  /// (lazily loaded kernels, cuDNN / cuBLASLt handles created at first use), in bytes; already in
  /// peak_bytes, and the memory fraction was lowered by it for later trials. 0 on the CPU.
  std::int64_t outside_growth_bytes = 0;
  /// Bytes of the distinct storages the model's output references (every tensor of the IValue
  /// forward returned; the largest over the trial's micro-batches). With TrainingSpec::keep_output
  /// they stay alive through backward and the optimizer step. 0 when no forward completed.
  std::int64_t output_bytes = 0;
  /// The peak of each phase of each micro-batch, in the order first run; the phase holding
  /// peak_allocated_bytes set the trial's peak. Empty for a trial that ran no phase.
  std::vector<PhasePeak> phase_peaks;
  /// When this trial failed with an ambiguous sign of exhaustion (FailureKind::
  /// kPossibleOutOfMemory: cuDNN "unable to find an engine", cublasCreate not initialized, ...),
  /// the trial the runner ran to decide it: the cache emptied, the largest batch already seen to
  /// fit re-run (reason "re-run to classify"). It fit: this trial is out of memory. Null when no
  /// such trial ran. The search lists it as a trial of its own, before this one.
  std::shared_ptr<const TrialResult> classification_rerun;
  /// Mean wall time of one completed optimizer step, in milliseconds (0 if none completed).
  double step_ms = 0.0;
  /// Optimizer steps completed.
  int steps_completed = 0;
  /// True when the cancel hook stopped the trial; a cancelled trial never counts as fitting.
  bool cancelled = false;
  /// True when the probe ran a shortened measuring trial (TrialRequest::measure): a first step
  /// whose forward and backward run on the first min_batch samples of this size's batch (which
  /// makes the optimizer's state for the parameters a job's first step trains), then one whole
  /// step of this size (autobatch.find's EagerProbe, docs/search.md "Measuring trials"). Its
  /// phase peaks are the full trial's on a byte-counting allocator; its fit is not an answer until
  /// a full trial confirms it.
  bool shortened = false;
  /// Only with `shortened` and out of memory: the probe checked that this shortened trial held,
  /// where it failed, what the full trial holds there, so the failure is the full trial's and the
  /// search needs no full trial to confirm it (docs/search.md, "When a shortened failure
  /// stands"). autobatch.find's EagerProbe sets it on the CPU budget allocator (exact bytes, no
  /// fragmentation) when every step of the search so far left the same bytes beyond its batch
  /// whatever its size (no buffer kept at the batch's size, no optimizer state made by some
  /// samples only) and the failed trial's first step left them too; never under the CUDA caching
  /// allocator, whose reserved peak depends on the order of allocations.
  bool stands_for_full = false;
  /// The forward and backward's peak at any micro-batch B (one micro-batch per step), as the
  /// largest of these lines, in bytes as the phase peaks count them: a replay of this trial's
  /// allocations at two sizes, event by event (docs/search.md, "The replayed peak"). Set by
  /// autobatch.find's EagerProbe on a measuring trial that fit on the CPU budget allocator when
  /// its first step (min_batch samples) and its whole step made the same allocations and
  /// releases in the same order; empty elsewhere. Exact where every allocation's bytes are affine
  /// in the batch; the guided strategy uses it only while every trial's measurements agree with
  /// it.
  std::vector<PeakLine> replayed_peak;
};

/// The units an allocator reserves memory in, as the search reads the measured peaks
/// (docs/search.md, "The caching allocator's units"). The search takes a unit only when the
/// trials show it: when every fitting trial's peak_bytes is a multiple of page_bytes (and two of
/// them differ), else of block_bytes, it rounds the budget down to that unit; when every phase
/// peak is a multiple of block_bytes, it allows a short secant an error of one block at each end.
/// A unit of 1 is never taken: the peaks are read as bytes.
struct AllocationUnits {
  /// The allocator reserves whole multiples of this, in bytes. Range: >= 1.
  std::int64_t block_bytes = 1;
  /// Expandable segments map memory in pages of this size, in bytes. Range: >= 1.
  std::int64_t page_bytes = 1;
};

/// The CUDA caching allocator's units (LibTorch 2.11; c10/cuda/CUDACachingAllocator.cpp, with its
/// constants in c10/core/AllocatorConfig.h): block_bytes 2 MiB, because every segment it reserves
/// is a multiple of 2 MiB: requests up to kSmallSize (1 MiB) share kSmallBuffer (2 MiB) segments,
/// requests below kMinLargeAlloc (10 MiB) get a kLargeBuffer (20 MiB) segment, larger ones are
/// rounded up to kRoundLarge (2 MiB); page_bytes 20 MiB, kLargeBuffer, the page size in which
/// expandable segments map the large pool.
inline constexpr AllocationUnits kCudaCachingAllocatorUnits{std::int64_t{2} << 20,
                                                            std::int64_t{20} << 20};

/// How the CUDA caching allocator was configured for the trials (docs/trial_runner.md).
struct AllocatorInfo {
  /// PYTORCH_ALLOC_CONF's value, else "PYTORCH_CUDA_ALLOC_CONF=<value>", else "".
  std::string config;
  std::optional<std::string> pytorch_alloc_conf;       ///< nullopt: unset
  std::optional<std::string> pytorch_cuda_alloc_conf;  ///< nullopt: unset
  /// The variable LibTorch 2.11 took its settings from: "PYTORCH_ALLOC_CONF",
  /// "PYTORCH_CUDA_ALLOC_CONF", "both" (generic keys from the first; backend and
  /// per_process_memory_fraction from the second) or "".
  std::string config_env;
  /// expandable_segments:True (the fraction's allowance is one 20 MiB page lower).
  bool expandable_segments = false;
  /// The memory fraction of totalGlobalMem the trials ran under; 1.0: no cap (and on the CPU).
  double fraction = 1.0;
  /// The units the trials' allocator reserves in, for the search (SearchOptions::
  /// allocation_units): the CUDA caching allocator's. The CPU budget allocator counts bytes but
  /// keeps this default, so a CPU search reads its peaks exactly as before the units became data
  /// (issue 28): byte counts are multiples of 2 MiB only by chance, and then the search takes the
  /// unit as it always did.
  AllocationUnits allocation_units = kCudaCachingAllocatorUnits;
};

/// What evaluation trials run beside the model (TrialRunner::holdEvalState, findMaxBatch's
/// evaluation search).
enum class EvalState {
  /// Parameters, optimizer state and (zero_grad zeros) gradients: a validation loop in the
  /// middle of training ("--eval").
  kTrainingResident,
  /// Parameters only: an evaluation job on its own ("--eval-only").
  kParametersOnly,
};

/// "training-resident" or "parameters-only" (the JSON's eval.state). Never throws.
inline const char* evalStateKey(EvalState state) {
  return state == EvalState::kParametersOnly ? "parameters-only" : "training-resident";
}

/// Runs one trial. Returns its result for fits / out-of-memory / size-limit outcomes.
/// Throws: model errors and fatal device errors, unchanged (they end the search).
using Probe = std::function<TrialResult(const TrialRequest&)>;

}  // namespace autobatch
