// autobatch/workflows/length_sweep.h — a sequence-length sweep (issue 18, docs/sweeps.md,
// `--lengths`): the largest micro-batch at each length, longest first, then the lengths' buckets
// run mixed in one trial (autobatch/run/bucket_mix.h) and lowered where the mix does not fit.
//
// Contract: one search per length (findMaxBatch, or findMaxBatchCached with a cache), each with
// the model's inputs at that length, then at most 6 mixed trials on a runner made for the longest
// length that fits. A model error at one length (a position table shorter than the length) is that
// length's row, and the other lengths are still searched. Logs each length's start, the mixed
// trials and each error row through spdlog's default logger. This header includes no LibTorch
// header. Thread safety: one call at a time per process on the CPU (one budget allocator).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/autobatch.h"
#include "autobatch/reports/report.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/workflows/cached_search.h"

namespace autobatch {

/// What to sweep.
struct LengthSweepOptions {
  /// The forward's inputs as `--input` texts (autobatch/vocabulary/input_spec.h), one per text,
  /// some of them naming the length placeholder L ("int64:L:<32000", "2xL"); parsed at each length.
  /// They replace TrainingSpec::inputs. At least one must name L.
  std::vector<std::string> input_texts;
  /// The values of L, in tokens, longest first (as parseLengths returns them). Non-empty, each in
  /// [1, 2^20].
  std::vector<std::int64_t> lengths;
  /// Tokens per optimizer step over all ranks (`--target-tokens`); each length's target is
  /// floor(target_tokens / tokens per sequence) sequences rounded down to a multiple of
  /// options.world_size (0 at a length: no plan there). 0: every length plans for
  /// options.target_batch (in sequences). Default: 0.
  std::int64_t target_tokens = 0;
  /// Search each length through the result cache (one entry per length); nullopt: no cache.
  std::optional<ResultCacheOptions> cache;
  /// --eval (docs/evaluation.md): after each length's training search, the evaluation search at
  /// that length (findMaxBatchAndEval) with this state; its answer is the row's eval columns
  /// (SweepRow::eval_*) and the length's MaxBatchResult::eval. Only kTrainingResident, and not
  /// with `cache` (sweepLengths throws autobatch::Error otherwise). nullopt: training only.
  /// The mixed verification checks the training buckets only. Default: nullopt.
  std::optional<EvalState> eval;
  /// Called with each length's row once it is final, before the next length (and before the
  /// mixed verification may lower it). A model error ends its trial without options.on_trial:
  /// the CLI forgets the trial in progress here. Must not throw. May be empty.
  std::function<void(const SweepRow& row)> on_row;
};

/// One length's search, as the report shows the sweep's answer.
struct LengthRun {
  /// The spec with the inputs at this length.
  TrainingSpec spec;
  /// The search's options at this length: its target_batch (from target_tokens) and seed_batches;
  /// time_limit_s is the whole sweep's (the caller's).
  SearchOptions options;
  /// The search (after the mixed verification lowered it, if it did).
  MaxBatchResult result;
  /// What the result cache did at this length; nullopt without a cache.
  std::optional<CacheReport> cache;
};

/// The result of sweepLengths().
struct LengthSweepResult {
  /// One row per length searched, longest first; mixed: the verification (nullopt when
  /// interrupted before it); longest_trainable_length; target_tokens.
  SweepReport sweep;
  /// The length the sweep answers with: the longest that fits under the margin, else the last
  /// searched without an error; nullopt when none was (interrupted first, or every length
  /// raised).
  std::optional<LengthRun> pick;
  /// "" unless no length trains and some raised a model error: then "no length of the sweep
  /// trains, and the model raised an error at length A: <message>; length B: ..." (the CLI exits
  /// 1 with it, the rows in its report).
  std::string error;
};

/// Sweeps `sweep.lengths` from the longest: each length is searched with `spec` and `options`
/// at that length's inputs, seeded (SearchOptions::seed_batches) by the last longer length that
/// fits with its maximum and that maximum at the same tokens per micro-batch (memory grows with
/// the length); options.time_limit_s (seconds, 0: none) is the whole sweep's budget, each length
/// getting what is left. Then the buckets (each length that fits, at its plan's largest
/// micro-batch, else its safe one) run mixed (verifyBucketMix, up to 6 trials, 2 micro-batches
/// per step when a plan accumulates, under the search's margin) and a bucket that fails there is
/// lowered (lowerSweepRow). options.cancel stops the sweep between lengths and before the mix;
/// options.before_trial and on_trial see every search trial (not the mixed ones).
/// Returns: see LengthSweepResult. A length whose model raised an error is a row with status
/// "error" and the message (no backtrace) naming the micro-batch it was raised at.
/// Throws: autobatch::Error for empty lengths or input texts of which none names L, and what no
/// length can get past, as findMaxBatch throws it: invalid input, c10::OutOfMemoryError before
/// any trial (the model does not fit), a fatal device error, RankError; a model error raised in
/// the mixed trials.
/// Side effects: as findMaxBatch per length; with a cache, as findMaxBatchCached.
LengthSweepResult sweepLengths(const TrainingSpec& spec, const SearchOptions& options,
                               const LengthSweepOptions& sweep);

/// Lowers a length the mixed verification lowered from micro-batch `from` to `to` (samples; 0:
/// it left the mix): row.lowered_from = from, a warning on `search`, the safe micro-batch and the
/// tokens per micro-batch at most `to`; at 0 the row's status becomes "fails-mixed" and the
/// search nothing-fits without a plan; else a plan the search had is made again on at most `to`
/// (replan(), autobatch/search/replan.h), and the row shows it. `options`: the length's (its
/// target). Throws: autobatch::Error from the planner (see replan()).
void lowerSweepRow(SweepRow& row, SearchResult& search, std::int64_t from, std::int64_t to,
                   const SearchOptions& options);

}  // namespace autobatch
