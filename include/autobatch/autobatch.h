// autobatch/autobatch.h — the library's entry points: find the largest micro-batch of a model,
// or check that one micro-batch fits.
//
// Contract: findMaxBatch() loads (or borrows) a TorchScript model, runs real training steps at
// the micro-batches the search picks (autobatch/search/search.h, autobatch/probes/trial_runner.h),
// and returns the search's result together with the model's memory breakdown and where the limit
// came from. Out-of-memory is a result; invalid input throws autobatch::Error; errors raised by the
// model or the device propagate unchanged. After it returns or throws, a borrowed module has its
// original weights, buffers and training mode, the process-wide state is restored, and the
// allocator is back to the bytes it held before the call: a launcher can train right after.
// This header includes no LibTorch header (the module type is forward-declared).
// Thread safety: one call at a time per process on the CPU (one budget allocator).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/search/planner.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/vocabulary/trial.h"

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace autobatch {

class TrialRunner;

/// What the model itself holds, exact (counted from its tensors), in bytes unless named.
struct MemoryBreakdown {
  std::int64_t parameter_count = 0;        ///< elements of the trained parameters
  std::int64_t parameter_bytes = 0;        ///< all parameters, after an fp16/bf16 cast
  std::int64_t gradient_bytes = 0;         ///< gradients of the trained parameters
  std::int64_t optimizer_state_bytes = 0;  ///< adam/adamw 2x, sgd-momentum 1x the trained bytes
  std::int64_t baseline_bytes = 0;  ///< tensors alive before every trial (the model, inputs' not)
  std::int64_t outside_bytes = 0;   ///< device memory outside the allocator (CUDA context); CPU 0
  /// growth of outside_bytes after setup (included in it), seen at trials' ends; CPU 0
  std::int64_t outside_growth_bytes = 0;
  std::int64_t ddp_bucket_bytes = 0;  ///< TrainingSpec::ddp: the DDP bucket copy every trial held
  /// The optimizer implementation that ran: "loop", "foreach" or "fused" (TrainingSpec::
  /// optimizer_impl with auto resolved for the device); "" for optimizer none.
  std::string optimizer_impl;
  /// The model file's format: "torchscript" (torch.jit.save archive) or "pt2" (a torch.export +
  /// AOTInductor training-step package, docs/formats.md).
  std::string model_format = "torchscript";
};

/// Where and how the trials ran.
struct RunContext {
  std::string device;                   ///< "cpu", "cuda:0", ...
  std::string backend;                  ///< "cpu-budget" or "cuda-caching"
  std::int64_t memory_limit_bytes = 0;  ///< the limit the trials ran under (after the reserve)
  std::string memory_limit_source;      ///< e.g. "--memory-limit", "MemAvailable 123..."
  AllocatorInfo allocator;              ///< the caching allocator's configuration (CUDA)
  std::vector<InputSpec> inputs;        ///< the inputs the trials used (flags, else the archive)
  LossKind loss = LossKind::kMean;      ///< the loss the trials used
  int micro_batches_per_trial = 1;      ///< min(accumulation_steps, 2)
  /// TrialRunner::memoryLimitWarnings() once the trials ran (the report lists them first among
  /// its warnings), then TrialRunner::modelWarnings().
  std::vector<std::string> warnings;
};

/// The result of findMaxBatch().
/// The evaluation search (--eval, --eval-only; docs/evaluation.md): the largest evaluation batch
/// with a state resident (TrialRunner::holdEvalState, runEval).
struct EvalResult {
  EvalState state = EvalState::kTrainingResident;
  /// The micro-batch of the training step that made the state (the search's smallest,
  /// SearchOptions::min_batch); 0 for kParametersOnly.
  std::int64_t training_batch = 0;
  /// That training step's trial (kTrainingResident; empty for kParametersOnly).
  TrialResult training_step;
  /// False when the training state itself did not fit (training_step says why): no evaluation
  /// trial ran and `search` is empty (status nothing-fits). Never an evaluation result.
  bool state_fits = true;
  /// Bytes held by tensors with the state resident, before the first evaluation trial.
  std::int64_t resident_bytes = 0;
  /// The search over evaluation batches: every trial is an evaluation trial (2 batches, the
  /// previous batch's output alive); max/safe are the evaluation batch; capped_by what bound it.
  SearchResult search;
};

struct MaxBatchResult {
  SearchResult search;
  MemoryBreakdown memory;
  RunContext context;
  /// --eval / --eval-only: the evaluation search; nullopt otherwise. With --eval-only, `search`
  /// is the same evaluation search (the run's answer).
  std::optional<EvalResult> eval;
};

/// The options of an evaluation search derived from the training search's `options`: 2 batches
/// per trial (the previous batch's output alive while the next runs), no accumulation plan
/// (target_batch 0), one rank, the initial batch at least `start_batch` (the training search's
/// safe batch; 0: the options' own) and at most options.max_batch when that is set. Everything
/// else (bounds, margin, trial and time budgets, allocation units, cancel) is kept. Pure; never
/// throws. Used by findMaxEvalBatch and the Python package's evaluation search (docs/python.md).
SearchOptions evalSearchOptions(const SearchOptions& options, std::int64_t start_batch);

/// The evaluation search on a set-up runner: holds `state` (kTrainingResident: one training step
/// at max(options.min_batch, 1)), searches the evaluation batch with runner.evalProbe() under
/// `options` (2 batches per trial; no target plan; initial batch at least `start_batch`), then
/// releases the state. Throws: as findMaxBatch; autobatch::Error for a format that cannot
/// evaluate (pt2).
EvalResult findMaxEvalBatch(TrialRunner& runner, const SearchOptions& options, EvalState state,
                            std::int64_t start_batch = 0);

/// findMaxBatch, then (kTrainingResident) the evaluation search on the same runner; for
/// kParametersOnly the evaluation search alone (result.search is it). Throws: as findMaxBatch.
MaxBatchResult findMaxBatchAndEval(const TrainingSpec& spec, const SearchOptions& options,
                                   EvalState state);

/// Removes the files autobatch has on disk for a moment: a pt2 package's compiled code, extracted
/// under $TMPDIR (else /tmp) while the package loads and removed once it is loaded
/// (docs/formats.md). For a signal handler about to _exit(), where no destructor runs (the CLI's
/// second SIGINT/SIGTERM): async-signal-safe (atomics, unlink and rmdir only). Never throws.
void removeScratchFiles() noexcept;

/// The format of the model file at `path`: "pt2" for an AOTInductor package (a zip archive with a
/// data/aotinductor/ entry; docs/formats.md), else "torchscript" (what the runner tries to load
/// otherwise, and whose loader explains a file that is neither). Reads the archive's directory
/// only. Never throws.
std::string modelFormatOf(const std::string& path);

/// Finds the largest micro-batch of the model at `spec.model_path` (a TorchScript archive or a
/// pt2 package, see modelFormatOf) on `spec.device`.
/// Runs `spec.steps_per_trial` real optimizer steps per trial, with min(accumulation_steps, 2)
/// micro-batches per step. Returns: see MaxBatchResult (a budget, cancellation or nothing fitting
/// is search.status, not an exception).
/// Throws: autobatch::Error for invalid spec/options or an unreadable/non-TorchScript file;
/// model errors (forward, backward) and fatal device errors unchanged.
/// Side effects: allocates and frees device memory; installs and removes the CPU budget allocator
/// (CPU) or sets and restores the caching allocator's memory fraction (CUDA).
MaxBatchResult findMaxBatch(const TrainingSpec& spec, const SearchOptions& options);

/// As above on a module the caller already loaded on `spec.device` (spec.model_path is used only
/// in messages; spec.inputs must be given). The module is borrowed; afterwards its weights,
/// buffers and training mode are exactly as given.
MaxBatchResult findMaxBatch(torch::jit::Module& module, const TrainingSpec& spec,
                            const SearchOptions& options);

/// As above on a runner the caller set up (autobatch/probes/trial_runner.h): the CLI reads the
/// runner's facts first (runnerFacts) to look up the result cache, then searches on the same
/// runner. options.micro_batches_per_step is replaced by the runner's (min(accumulation_steps, 2)).
MaxBatchResult findMaxBatch(TrialRunner& runner, const SearchOptions& options);

/// The memory breakdown and run context of a set-up runner, with an empty search (no trial run).
MaxBatchResult runnerFacts(const TrialRunner& runner);

/// `options` as a search on `runner` runs them: micro_batches_per_step the runner's
/// (min(accumulation_steps, 2)) and allocation_units its allocator's. Pure.
SearchOptions runnerSearchOptions(const TrialRunner& runner, const SearchOptions& options);

/// The result of checkBatch().
struct CheckResult {
  TrialResult trial;              ///< the trial at the checked micro-batch
  bool fits = false;              ///< the trial fit (raw, no headroom)
  bool fits_with_margin = false;  ///< it fit and peak_bytes <= limit - margin
  std::int64_t margin_bytes = 0;  ///< the headroom applied, in bytes
  MemoryBreakdown memory;
  RunContext context;
  /// checkEvalBatch: the state the evaluation trial ran beside (its search left empty); `trial`
  /// is then the evaluation trial, or the training step when the state did not fit.
  std::optional<EvalResult> eval;
};

/// A check's verdict on `check.trial`: `fits` (`ran` and the trial fit, not cancelled),
/// `margin_bytes` (marginBytes of options at the trial's limit) and `fits_with_margin` (fits and
/// peak_bytes <= limit - margin). Shared by checkBatch, checkEvalBatch and the Python package's
/// check_eval_batch (`ran` false: the training state did not fit, no evaluation trial ran).
/// Pure; never throws.
void setCheckVerdict(CheckResult& check, const SearchOptions& options, bool ran);

/// Preflight: runs one trial at `micro_batch_size` (steps per trial and accumulation from `spec`)
/// and says whether it fits, raw and with the margin of `options`.
/// Throws: as findMaxBatch; autobatch::Error for micro_batch_size < 1.
CheckResult checkBatch(const TrainingSpec& spec, const SearchOptions& options,
                       std::int64_t micro_batch_size);

/// Preflight of an evaluation batch (--check-eval-batch): the training state held as
/// findMaxEvalBatch holds it (kTrainingResident), then one evaluation trial of 2 batches of
/// `eval_batch`. fits / fits_with_margin as checkBatch; false with eval->state_fits false when
/// the training state does not fit. Throws: as checkBatch; autobatch::Error for eval_batch < 1 or
/// a format that cannot evaluate.
CheckResult checkEvalBatch(const TrainingSpec& spec, const SearchOptions& options,
                           std::int64_t eval_batch);

/// SHA-1 of `bytes`, 40 hex digits (c10::sha1): the result cache's key hash.
std::string sha1Hex(const std::string& bytes);

/// SHA-1 of a file's bytes, 40 hex digits (c10::sha1), for the report's fingerprint.
/// Throws: autobatch::Error when the file cannot be read.
std::string fileSha1(const std::string& path);

}  // namespace autobatch
