// autobatch/run/result_cache.h — a folder of past search results, for repeat preflights (issue 18).
//
// A preflight in every job of a sweep re-runs a search of minutes for the same answer. With
// `--cache` the CLI keys each result by a hash of exactly what the answer depends on
// (autobatch/reports/report.h, cacheKeyFields) and, on a hit, confirms the cached answer with one
// trial instead of searching. This file holds the storage: one JSON file per key, written to a
// temporary file in the same folder and renamed over the entry, so that several ranks of one node
// writing the same key at once leave one whole entry (rename is atomic within a file system). An
// entry that cannot be read or parsed is a miss with a warning, never an error.
//
// LibTorch-free. Thread safety: functions of their arguments and the file system; concurrent
// calls from several processes are safe as described above.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autobatch/run/ranks.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch {

/// What a result depends on: named fields (model SHA-1 and size, resolved inputs, loss, optimizer
/// and its implementation, zero-grad mode, output lifetime, precision, steps, micro-batches per
/// step, the resolved memory limit, reserve and margin, bounds, DDP bucket bytes, device name and
/// total memory, driver / LibTorch / autobatch versions, allocator configuration), and their hash.
struct CacheKey {
  /// 40 hex digits: SHA-1 of canonicalText() (the CLI hashes it with c10::sha1).
  std::string hash;
  /// (name, value) in a fixed order; values as text.
  std::vector<std::pair<std::string, std::string>> fields;

  /// "name=value\n" per field, in order: what the hash is taken of.
  std::string canonicalText() const;
};

/// One stored search result: what a repeat preflight needs to answer, in the units of
/// autobatch/search/search.h (micro-batch sizes in samples, bytes).
struct CachedResult {
  std::string key;                      ///< CacheKey::hash it was stored under
  std::string stored_at;                ///< UTC, ISO 8601 ("2026-11-30T20:15:03Z")
  std::string status;                   ///< the search's status ("found", ...)
  std::int64_t max_micro_batch = 0;     ///< largest micro-batch seen to fit
  std::int64_t safe_micro_batch = 0;    ///< largest under the limit less the margin
  std::int64_t memory_limit_bytes = 0;  ///< the limit the trials ran under
  std::int64_t margin_bytes = 0;        ///< the headroom, in bytes
  std::string capped_by;                ///< SearchResult::capped_by
  /// The largest micro-batch seen to fit under the margin with 2 micro-batches per step (the
  /// plan's check); 0 when none ran.
  std::int64_t accumulation_max_micro_batch = 0;
  int trials = 0;         ///< trials the search ran
  double search_s = 0.0;  ///< the search's wall time, in seconds
};

/// The results folder: $AUTOBATCH_CACHE_DIR, else $XDG_CACHE_HOME/autobatch/results, else
/// $HOME/.cache/autobatch/results. Throws: autobatch::Error when none of the three is set.
std::string defaultCacheDir(const EnvLookup& env);

/// Reads an entry's text, as storeCachedResult wrote it, for `key`, checking every field it uses:
/// schema_version 1; key and every field of `key` equal; stored_at a UTC time
/// ("2026-11-30T20:15:03Z"); status "found" (only those are stored); max_micro_batch a whole
/// number in [1, 2^40], safe_micro_batch in [1, max_micro_batch], accumulation_max_micro_batch in
/// [0, max_micro_batch]; memory_limit_bytes >= 0 and margin_bytes in [0, the limit) (any >= 0
/// without a limit); capped_by a SearchResult::capped_by value; trials in [0, INT_MAX]; search_s
/// a number >= 0. Whole numbers must be JSON integers: 2.5, "3" and true are refused, never
/// truncated. Throws: autobatch::Error "not JSON: ..." for text that does not parse, else
/// "<field>: expected X, but got Y" naming the first invalid field (nested ones as
/// "fields.<name>"); values are shown cut to 40 characters. Pure; fuzzed by tests/fuzz/.
CachedResult parseCachedResult(std::string_view text, const CacheKey& key);

/// The entry of `key` in `dir`, or nullopt: no entry (a miss), or one that cannot be read (a
/// folder, unreadable: the reason from errno), is not JSON, or fails parseCachedResult (a miss,
/// and a warning naming the file and the reason, for an invalid field its name, is appended to
/// `warnings`). An ignored entry is left in place; the search's answer is stored over it.
std::optional<CachedResult> loadCachedResult(const std::string& dir, const CacheKey& key,
                                             std::vector<std::string>& warnings);

/// Writes `result` as the entry of `key` in `dir` (created when missing): a temporary file in
/// `dir`, then rename(2) over the entry. Returns "" on success, else why it failed, with the
/// system's reason ("cannot rename A to B: Is a directory"); the temporary file is removed (the
/// caller warns; a cache that cannot be written never fails a preflight).
std::string storeCachedResult(const std::string& dir, const CacheKey& key,
                              const CachedResult& result);

/// Removes the entry of `key` (a hit whose confirming trial failed). Missing: nothing to do.
/// Returns "" when it is gone, else why it could not be removed ("cannot remove PATH: Permission
/// denied"). Never throws.
std::string dropCachedResult(const std::string& dir, const CacheKey& key);

/// The entry's path: `dir`/<hash>.json.
std::string cacheEntryPath(const std::string& dir, const CacheKey& key);

/// What to store of a search: nullopt unless it found a safe batch with its bracket closed
/// (status "found"); a budget, cancellation or nothing fitting is not an answer to reuse.
/// accumulation_max_micro_batch: the largest batch of its 2-micro-batch trials that fit under the
/// margin. `stored_at`: UTC, ISO 8601.
std::optional<CachedResult> cachedResultOf(const SearchResult& search,
                                           const std::string& stored_at);

/// The plan a hit answers with, for options.target_batch (nullopt without a target): planned on
/// the cached safe batch, or on accumulation_max_micro_batch when the plan accumulates and that
/// is known and smaller (the plan's check stepped down).
std::optional<AccumulationPlans> cachedPlan(const CachedResult& entry,
                                            const SearchOptions& options);

/// The one trial that confirms a hit: the cached safe batch with `micro_batches_per_trial`
/// micro-batches per step; when the plan accumulates (and the search ran 1 per step), the plan's
/// largest micro-batch with 2 per step, as the search verifies a plan.
TrialRequest confirmRequest(const CachedResult& entry, const SearchOptions& options,
                            int micro_batches_per_trial);

/// A confirming trial passes when it fit, was not cancelled and its peak is within the cached
/// limit less the margin, under the same limit (a changed limit is another key, but a trial is
/// checked against what it ran under).
bool confirms(const CachedResult& entry, const TrialResult& trial);

/// The search result a hit answers with: the cached figures, status "found", `confirm` (when one
/// ran) as its only trial and the plan of cachedPlan(), verified when the confirming trial
/// checked its largest micro-batch (or it needs no accumulation, or the cache says that batch fit
/// with 2 micro-batches per step). elapsed_s: 0 (the caller times the run).
SearchResult searchResultFromCache(const CachedResult& entry, const SearchOptions& options,
                                   const std::optional<TrialResult>& confirm);

}  // namespace autobatch
