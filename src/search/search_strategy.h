// Internal: the search's strategies, apart from its driver (src/search/search.cpp). A strategy only
// answers "given the trials so far and the bracket, which batch next"; the driver runs the trial,
// files its outcome, keeps the bracket, the budgets, the time limit and cancellation, retries, the
// safe phase, the plan verification and every guarantee (docs/search.md).
// Strategies: guided (src/search/search_guided.cpp); power and binsearch
// (src/search/search_doubling.cpp). LibTorch-free. A strategy object serves one goal of one search,
// from one thread.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch::detail {

/// Stands for "no upper bound known"; far below overflow of lo * 4 and (lo + hi) / 2.
inline constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max() / 8;
/// "No budget": the largest peak compares below it.
inline constexpr std::int64_t kNoBudget = std::numeric_limits<std::int64_t>::max();

/// A fitting trial as the memory model sees it.
struct MeasuredFit {
  std::int64_t peak = 0;   ///< TrialResult::peak_bytes, compared with the limit
  std::int64_t limit = 0;  ///< the limit the trial ran under (0: unknown)
  /// peak less the largest phase peak: reserved but unallocated, outside the allocator.
  std::int64_t overhead = 0;
  /// phaseKeyOf(phase, micro-batch) -> the phase's peak allocated bytes; {"" -> peak} without
  /// phase peaks.
  std::map<std::string, std::int64_t> phases;
  /// False for a shortened measuring trial's fit (TrialResult::shortened): it predicts and
  /// brackets like any fit, but the answer is only ever a confirmed one.
  bool confirmed = true;
  /// TrialResult::replayed_peak: the forward and backward's peak at any batch (empty: none).
  std::vector<PeakLine> replayed_peak;
};

/// "backward#0": the key of a phase of one micro-batch in MeasuredFit::phases.
inline std::string phaseKeyOf(std::string_view phase, int micro_batch_index) {
  return std::string(phase) + "#" + std::to_string(micro_batch_index);
}

/// The trials so far in the search's own mode (SearchOptions::micro_batches_per_step), as the
/// driver filed them.
struct SearchTrials {
  std::map<std::int64_t, MeasuredFit> fits;  ///< batch -> what its trial measured
  std::set<std::int64_t> fails;              ///< out-of-memory batches
  /// Out-of-memory batch -> (phase key, lower bound on that phase's peak allocated bytes).
  std::map<std::int64_t, std::pair<std::string, std::int64_t>> bounds;
  std::int64_t cap = 0;          ///< largest batch allowed (bounds and size limits), inclusive
  std::int64_t limit_bytes = 0;  ///< the limit in force, from the trials (0: unknown)
};

/// What a driver loop searches for.
enum class SearchGoal {
  kMaximum,  ///< the largest batch that fits (a strategy opens it with its first probes)
  kSafe,     ///< the largest fit whose peak is within the limit less the margin (after kMaximum)
};

/// Where the answer of the goal in progress lies, as the driver keeps it.
struct Bracket {
  std::int64_t low = 0;   ///< the largest batch that counts for the goal; 0: none
  std::int64_t high = 0;  ///< the smallest batch above low known not to count, or the cap + 1
  /// A batch counts when its peak is within this (kMaximum: the limit in force; kNoBudget when
  /// unknown).
  std::int64_t budget_bytes = kNoBudget;
  bool closed = false;  ///< the goal's answer is decided (within the relative tolerance)
};

/// One strategy for one goal: the driver asks next(), runs the batch it gives and, unless the
/// search stopped, reports the outcome through noteOutcome(), until next() gives 0.
class SearchStrategy {
 public:
  SearchStrategy() = default;
  SearchStrategy(const SearchStrategy&) = delete;
  SearchStrategy& operator=(const SearchStrategy&) = delete;
  virtual ~SearchStrategy() = default;

  /// The next batch to try (>= 1), or 0: this goal's search is over.
  virtual std::int64_t next(const SearchTrials& trials, const Bracket& bracket) = 0;
  /// The batch next() gave `fit` (within the bracket's budget; the safe goal counts only a peak
  /// within it); `before` and `after` are the brackets around its trial.
  virtual void noteOutcome(bool fit, const Bracket& before, const Bracket& after) = 0;
  /// True when the batch next() last gave is asked for its measurements only (TrialRequest::
  /// measure: the second probe below the cap, a short-aimed jump, low + 1 where the model puts the
  /// boundary at the anchor), not as a guess at the answer.
  virtual bool measuring() const { return false; }
};

/// The guided strategy (docs/search.md): the max-of-phases model at the bracket's budget, opened
/// for kMaximum by the seeds, min_batch and the largest multiple of it the first probe proves.
std::unique_ptr<SearchStrategy> makeGuidedStrategy(const SearchOptions& options, SearchGoal goal);

/// Lightning's strategies: for kMaximum, halve from initial_batch until a batch fits, double to
/// the first failure, then bisect (`bisect`: binsearch) or stop (power). For kSafe, binsearch
/// bisects; power halves only while no batch is safe.
std::unique_ptr<SearchStrategy> makeDoublingStrategy(const SearchOptions& options, SearchGoal goal,
                                                     bool bisect);

}  // namespace autobatch::detail
