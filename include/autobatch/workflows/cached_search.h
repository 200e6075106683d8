// autobatch/workflows/cached_search.h — a search that reuses a past search's answer (issue 18,
// `--cache`).
//
// A preflight in every job of a sweep re-runs a search of minutes for the same answer. The cached
// search sets the trial runner up, keys the run by exactly what the answer depends on
// (autobatch/reports/report.h, cacheKeyFields: the model's SHA-1 and size, the resolved inputs,
// loss, optimizer, precision, memory limit, margin, bounds, device and versions), and on a hit
// confirms the cached answer with one trial instead of searching (autobatch/run/result_cache.h). A
// miss, or a hit whose confirming trial fails, searches on the same runner and stores the answer.
//
// Contract: as findMaxBatch (autobatch/autobatch.h) for the trials; the result cache's folder is
// read and written (one JSON file per key, replaced atomically). This header includes no LibTorch
// header. Thread safety: one call at a time per process on the CPU (one budget allocator);
// several processes may share the folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "autobatch/autobatch.h"
#include "autobatch/reports/report.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/vocabulary/version.h"

namespace autobatch {

/// Where the cache is and how a hit is answered.
struct ResultCacheOptions {
  /// The results folder (created on the first store). Required: the CLI gives
  /// defaultCacheDir(processEnvironment()) (autobatch/run/result_cache.h).
  std::string dir;
  /// Answer a hit without the confirming trial (`--cache-trust`). Default: false.
  bool trust = false;
  /// SHA-1 of the model file (40 hex digits) and its size in bytes, part of the key. "": both are
  /// read from spec.model_path once the runner is set up (give them to hash a large model once
  /// for several calls, as a sweep does at every length). Default: "", 0.
  std::string model_sha1;
  std::int64_t model_file_bytes = 0;
  /// The build and devices the key names (versions, the device's name and total memory).
  /// nullopt: buildInfo() (autobatch/vocabulary/version.h). Default: nullopt.
  std::optional<BuildInfo> build;
  /// Called once the trial runner is set up, before any trial, with its facts (memory breakdown
  /// and run context; an empty search): a caller that reports errors can show them when a trial
  /// then throws (the CLI's JSON report does). Must not throw. May be empty.
  std::function<void(const MaxBatchResult& facts)> on_setup;
};

/// The result of findMaxBatchCached().
struct CachedSearchResult {
  /// As findMaxBatch's. On a hit: the cached figures (status "found"), the confirming trial as
  /// the only trial (none when trusted), search.elapsed_s this call's wall time, and the warnings
  /// of reading the cache. After a failed confirmation: the confirming trial first, then the
  /// search's trials, and a warning saying the entry was dropped.
  MaxBatchResult result;
  /// What the cache did: its folder, the key (fields and hash), outcome "hit", "miss" or
  /// "confirm-failed", the entry's time and its search's trials and seconds on a hit, and why an
  /// answer could not be stored ("" when stored or nothing to store).
  CacheReport cache;
};

/// findMaxBatch() through the result cache in `cache.dir`:
/// - hit (an entry with this key that parses, autobatch/run/result_cache.h): one confirming trial
///   (confirmRequest: the cached safe batch, or the plan's largest micro-batch with 2 per step);
///   when it fits under the cached limit less the margin (or with cache.trust, without a trial)
///   the cached answer is returned (outcome "hit");
/// - a confirming trial that fails: the entry is removed, a full search runs and is stored
///   (outcome "confirm-failed"); one that was cancelled keeps the entry (outcome "miss", a
///   warning), and the search after it stops at once;
/// - miss: a full search on the same runner; its answer is stored when its status is "found" and
///   it was not cancelled (options.cancel), stored_at the UTC time of the store.
/// A cache that cannot be read (an unreadable or invalid entry) is a miss with a warning; one
/// that cannot be written is a warning and CacheReport::store_error, never an error.
/// options.before_trial and options.on_trial are called around the confirming trial as around
/// the search's.
/// Throws: as findMaxBatch (autobatch::Error for invalid spec/options or an unreadable model;
/// model and fatal device errors unchanged); autobatch::Error for an empty cache.dir, or when
/// the model's SHA-1 must be read and cannot.
/// Side effects: as findMaxBatch; reads, writes and removes files in cache.dir.
CachedSearchResult findMaxBatchCached(const TrainingSpec& spec, const SearchOptions& options,
                                      const ResultCacheOptions& cache);

/// The result cache around any probe (the trial runner's, or the Python package's eager step):
/// findMaxBatchCached's hit, confirmation, miss and store, for a key the caller made.
/// `cache.dir` and `cache.key` (fields and hash) must be set; outcome, trusted, stored_at,
/// cached_trials, cached_search_s and store_error are filled in. `options` as the search runs
/// them (micro_batches_per_step the probe's: the confirming trial uses it). `trust`: answer a hit
/// without the confirming trial. Returns the search (on a hit the cached answer, elapsed_s this
/// call's time). Throws: autobatch::Error for an empty cache.dir; what the probe throws.
/// Side effects: the probe's trials; reads, writes and removes files in cache.dir.
SearchResult findMaxBatchThroughCache(const Probe& probe, const SearchOptions& options,
                                      CacheReport& cache, bool trust);

}  // namespace autobatch
