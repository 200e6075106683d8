// autobatch/reports/report.h — the results as people and programs read them: a human report, a JSON
// document (schema below), and shell lines a launcher can `eval`.
//
// LibTorch-free. Thread safety: pure functions of their arguments.
//
// JSON schema, version 1 (docs/report.md lists every field): {"schema_version": 1, "status",
// "exit_code", "error", "autobatch": {version, libtorch, cuda, driver}, "device": {...},
// "fingerprint": {...}, "options": {...}, "model": {parameters, bytes...}, "trials": [...],
// "result": {max_micro_batch, safe_micro_batch, ...}, "fit": {...}, "plans": {...}, "check": {...},
// "ranks": {...}, "warnings": [...]}. Keys are never removed within a schema version; new keys may
// appear.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/run/bucket_mix.h"
#include "autobatch/run/ranks.h"
#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/vocabulary/version.h"

namespace autobatch {

/// The JSON report's schema version (see the file comment).
inline constexpr int kReportSchemaVersion = 1;

/// What the result cache (--cache) did in this run.
struct CacheReport {
  std::string dir;  ///< the results folder
  CacheKey key;     ///< the key of this run (hash and fields)
  /// "hit" (answered from the entry), "miss" (searched and stored), "confirm-failed" (the
  /// entry's confirming trial did not fit under the margin: dropped, searched and stored again).
  std::string outcome;
  bool trusted = false;   ///< --cache-trust: a hit answered without the confirming trial
  std::string stored_at;  ///< the entry's time (UTC, ISO 8601) on a hit, else ""
  /// The cached search's own trials and wall time (what the hit saved); 0 on a miss.
  int cached_trials = 0;
  double cached_search_s = 0.0;
  /// Why the entry could not be stored, or "" (a failed store is a warning, not an error).
  std::string store_error;
};

/// One sequence length of a sweep (--lengths, docs/sweeps.md).
struct SweepRow {
  std::int64_t length = 0;  ///< the value of L in the input specs, in tokens
  /// The search's status ("found", "nothing-fits", a budget's ...), "fails-mixed" (the mixed
  /// verification dropped it) or "error" (the model raised an error at this length: `error`).
  std::string status;
  /// status "error": the model's message (no backtrace) and the micro-batch it was raised at;
  /// "" otherwise.
  std::string error;
  std::int64_t max_micro_batch = 0;   ///< sequences; 0 when nothing fits
  std::int64_t safe_micro_batch = 0;  ///< sequences, under the margin; 0 when none
  /// Tokens of one sequence at this length: the element count of one sample of the first input
  /// whose shape names L (autobatch::tokensPerSample: L for "int64:L", 2L for "2xL").
  std::int64_t tokens_per_sample = 0;
  /// safe_micro_batch x tokens_per_sample: tokens of one micro-batch.
  std::int64_t tokens_per_micro_batch = 0;
  /// The phase that set the peak of the safe batch's trial ("backward", ...); "" when unknown.
  std::string binding_phase;
  int trials = 0;
  double elapsed_s = 0.0;
  /// The target in sequences for this length (--target-batch, or floor(--target-tokens /
  /// tokens_per_sample) rounded down to a multiple of the world size); 0: no plan.
  std::int64_t target_batch = 0;
  /// The plan for target_batch on this length's safe batch; nullopt without one.
  std::optional<AccumulationPlans> plan;
  /// Nothing fits: what micro-batch 1 needs at least, in bytes (0 when unknown).
  std::int64_t min_batch_needs_at_least_bytes = 0;
  /// With --cache: this length's CacheReport::outcome ("hit", "miss", ...); else "".
  std::string cache_outcome;
  /// The safe micro-batch this length's search found alone, when the mixed verification lowered
  /// it (safe_micro_batch, tokens and plan are then the lowered ones; status "fails-mixed" when it
  /// left the mix at 0); 0 when not lowered.
  std::int64_t lowered_from = 0;
  /// --eval (docs/evaluation.md, docs/sweeps.md): this length's evaluation search with the
  /// training state resident. eval_status: the search's status ("found", "nothing-fits", a
  /// budget's ...), "state-does-not-fit" (the training state did not fit: no evaluation trial
  /// ran), or "" without --eval (and for an error row).
  std::string eval_status;
  std::int64_t eval_max_batch = 0;   ///< sequences; 0 when none fits
  std::int64_t eval_safe_batch = 0;  ///< sequences, under the margin; 0 when none
  int eval_trials = 0;               ///< the evaluation trials (the training step not counted)
};

/// A length sweep: the rows from the longest length to the shortest.
struct SweepReport {
  std::vector<SweepRow> rows;
  /// The longest length at which a micro-batch fits under the margin; 0 when none.
  std::int64_t longest_trainable_length = 0;
  /// --target-tokens (tokens per optimizer step over all ranks); 0 when not given.
  std::int64_t target_tokens = 0;
  /// The buckets run mixed in one trial (autobatch/run/bucket_mix.h); nullopt when it did not run
  /// (interrupted before it).
  std::optional<MixVerification> mixed;
};

/// One memory size of a fleet table (--fleet, docs/fleet.md).
struct FleetRow {
  /// The size as given: a GPU key of the table (autobatch/workflows/fleet.h, "a100-40gb") or the
  /// size text
  /// ("24GiB").
  std::string name;
  /// The size in bytes: the device's total memory (CUDA's totalGlobalMem) for a GPU key.
  std::int64_t bytes = 0;
  /// Where `bytes` comes from: the table's source for a GPU key, else "given".
  std::string source;
  /// The search's status ("found", "nothing-fits", a budget's ...), or "not-measurable" (above
  /// what this device can emulate: `note` says which size was the largest measurable).
  std::string status;
  std::int64_t max_micro_batch = 0;   ///< samples; 0 when nothing fits or not measured
  std::int64_t safe_micro_batch = 0;  ///< samples, under the margin; 0 when none
  /// The phase that set the peak of the safe batch's trial ("backward", ...); "" when unknown.
  std::string binding_phase;
  /// The plan for the target batch (SearchOptions::target_batch) on the safe batch; nullopt
  /// without a target or when nothing fits.
  std::optional<AccumulationPlans> plan;
  /// Nothing fits: what the minimum micro-batch needs at least, in bytes (0 when unknown).
  std::int64_t min_batch_needs_at_least_bytes = 0;
  /// Trials this size's search saw: run on the device under this size's limit, and answered
  /// from a larger size's trial (a fit whose peak is under this size's limit, an out-of-memory).
  int trials_run = 0;
  int trials_reused = 0;
  /// The safe batch's answer was confirmed by a trial run under this size's own limit (a size
  /// whose answer came from a reused trial runs it once more).
  bool verified = false;
  double elapsed_s = 0.0;
  /// Why a size was not measured, or what else the row needs said; "" when nothing.
  std::string note;
};

/// A fleet table: one search per memory size, largest first, trials shared between sizes.
struct FleetReport {
  /// In the order searched: largest size first.
  std::vector<FleetRow> rows;
  /// The largest size this device could emulate, in bytes (the process's room on the CPU,
  /// totalGlobalMem on CUDA, after the reserve); 0 when unknown.
  std::int64_t largest_measurable_bytes = 0;
  /// Trials run on the device for the whole table (the sum of rows' trials_run).
  int trials_run = 0;
  /// CUDA: that another card's context and workspaces may differ, with this card's measured
  /// outside part; "" on the CPU.
  std::string note;
};

/// Everything one run of the CLI knows, at any point of its life (errors included).
struct ReportData {
  /// "found", "nothing-fits", "trial-budget", "time-budget", "cancelled" (search statuses),
  /// "fits", "does-not-fit" (--check-batch), "interrupted", "usage-error", "runtime-error".
  std::string status;
  /// The process exit code that goes with status (see docs/errors.md).
  int exit_code = 0;
  /// The error message for usage and runtime errors; "" otherwise.
  std::string error;
  TrainingSpec spec;
  SearchOptions options;
  BuildInfo build;
  /// SHA-1 of the model file, hex; "" when not computed (no file, error before).
  std::string model_sha1;
  /// Bytes of the model file; 0 when unknown.
  std::int64_t model_file_bytes = 0;
  /// The training step when the library did not build it from `spec` (the Python package's
  /// eager step, docs/python.md: "the user's loss and optimizer, ..."): the human report's model
  /// line names it instead of spec's inputs, loss, optimizer and precision. "" (the CLI) otherwise.
  std::string step_description;
  /// Search mode.
  std::optional<MaxBatchResult> result;
  /// --check-batch mode.
  std::optional<CheckResult> check;
  /// This process's rank (flags or launcher environment); nullopt before it is read.
  std::optional<RankInfo> rank;
  /// Multi-rank preflight: what the ranks agreed on (result.search is already lowered to it).
  std::optional<Agreement> agreement;
  /// --cache: what the result cache did; nullopt without --cache.
  std::optional<CacheReport> cache;
  /// --lengths: the sweep's rows; `result` is then the search of the longest length that fits
  /// (or of the last length tried when none does). nullopt without --lengths.
  std::optional<SweepReport> sweep;
  /// --fleet: the table's rows; `result` is then the search of the largest measurable size
  /// (nullopt with no such size). The JSON's "fleet" key is present only with --fleet.
  std::optional<FleetReport> fleet;
};

/// The result cache's key fields for this run (CacheKey::fields; the hash is left empty for the
/// caller, which hashes canonicalText() with SHA-1): everything the answer depends on, resolved
/// (the inputs and loss the runner used, the optimizer implementation that ran, the memory limit
/// in bytes after the reserve, the device's name and total memory, not its index or the model's
/// path or the rank). Needs data.result (its memory and context; the search may be empty).
CacheKey cacheKeyFields(const ReportData& data);

/// The phase whose peak is the trial's ("backward", "optimizer-step", "forward #2" for the second
/// micro-batch; TrialResult::phase_peaks); "" when none was recorded.
std::string peakPhase(const TrialResult& trial);

/// The JSON document (pretty-printed, 2 spaces, trailing newline).
std::string toJson(const ReportData& data);

/// The human report: model, trials, result, plans (primary marked), memory, ranks, sweep, check.
std::string humanReport(const ReportData& data);

/// Shell lines for `eval`: AUTOBATCH_MICRO_BATCH, AUTOBATCH_ACCUM_STEPS,
/// AUTOBATCH_EFFECTIVE_BATCH, AUTOBATCH_PLAN, AUTOBATCH_MICRO_BATCHES (space-separated sizes of one
/// optimizer step, larger first; loss weight of each = its share of the samples; empty above
/// kMicroBatchListLimit steps), AUTOBATCH_MICRO_BATCH_GROUPS ('size:count ...', always),
/// AUTOBATCH_MAX_MICRO_BATCH, AUTOBATCH_SAFE_MICRO_BATCH, AUTOBATCH_WORLD_SIZE, AUTOBATCH_STATUS,
/// AUTOBATCH_CAPPED_BY; with a sweep also AUTOBATCH_LENGTH (the length those are for: the longest
/// that fits) and AUTOBATCH_BUCKETS='2048:6 1024:14 ...' (length:safe micro-batch of every length
/// that fits). Without a target batch the plan is one step of the safe micro-batch; for a check,
/// the checked micro-batch x the spec's accumulation steps. With nothing verified under the margin
/// the plan's numbers are 0. Every value is one shell word: bare when it holds only letters,
/// digits and `_.,:/+-%@`, else single-quoted with ' written as '\'' (no text can run as code).
std::string envLines(const ReportData& data);

/// Checks, before any trial, that a report can be written to `path` at the end, as
/// writeReportFile() will: `path` is not empty, not a directory, not one of `inputs` (the files
/// the run reads: the model; compared with std::filesystem::equivalent), an existing file opens
/// for writing (nothing is truncated), and its folder exists and accepts a new file (a probe
/// file is created and removed). "-" (standard output) passes. `flag` names the path in messages.
/// Throws: autobatch::Error "--json '<path>': expected ..., but ..." with the system's reason.
void checkReportPath(const std::string& flag, const std::string& path,
                     const std::vector<std::string>& inputs);

/// Writes `text` to `path` so that it is never left truncated: a regular file (or a new one) is
/// written to a temporary file in its folder and renamed over it (through a symbolic link to its
/// target; an existing file keeps its permissions, a new one gets 0666 less the umask); a device,
/// pipe or socket is written in place. Returns "" on success, else the reason
/// ("No space left on device"); the temporary file is then removed and `path` left as it was.
std::string writeReportFile(const std::string& path, const std::string& text);

/// Writes all of `text` to the open descriptor `fd` (retrying short writes and EINTR). Returns ""
/// or the reason ("Bad file descriptor" for fd < 0).
std::string writeReportTo(int fd, const std::string& text);

}  // namespace autobatch
