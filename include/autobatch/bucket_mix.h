// autobatch/bucket_mix.h — the mixed verification of a length sweep's buckets (issue 18,
// docs/sweeps.md "Mixed verification").
//
// Each bucket (length, micro-batch) of a sweep was searched alone, with the allocator's cache
// emptied before every trial. A shuffled bucketed run mixes them: after a short-length step at a
// large micro-batch the caching allocator holds blocks carved for that shape, and the long-length
// step that fitted alone may not fit any more (a public NeMo OOMptimizer report: every bucket
// passed alone, the shuffled mixed run ran out of memory). The verification runs the buckets
// mixed in one trial and lowers a bucket that fails there, until the mix fits.
// Contract: pure logic over a caller-supplied probe; no LibTorch, no I/O. Thread safety: none
// needed (plain values; the probe is called from the calling thread).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autobatch/trial.h"

namespace autobatch {

/// One bucket of a sweep: a sequence length and the micro-batch to train it with.
struct Bucket {
  std::int64_t length = 0;            ///< tokens (the value of L). Range >= 1.
  std::int64_t micro_batch_size = 0;  ///< sequences. Range >= 1 (0: dropped from the mix).

  bool operator==(const Bucket&) const = default;
};

/// The order of the mixed trial over `bucket_count` buckets given longest first: the longest,
/// then each other bucket from the shortest up, each followed by the longest again — for 3
/// buckets 0, 2, 0, 1, 0; for 1 bucket {0}; for 0 {}. Every bucket runs after a differently shaped
/// step, and the longest (the most memory per sequence at its batch) runs after each of them.
std::vector<std::size_t> mixedOrder(std::size_t bucket_count);

/// Runs one mixed trial: one optimizer step per entry of `steps`, in order, in one trial with no
/// release of the allocator's cache between them. On out of memory (or a kernel size limit) the
/// result's failed_step_index names the step. Throws what the trial runner throws.
using MixedProbe = std::function<TrialResult(const std::vector<Bucket>& steps)>;

/// One mixed trial of the verification.
struct MixedTrial {
  std::vector<Bucket> steps;  ///< the steps as run (mixedOrder over the buckets of that round)
  TrialResult result;
  /// The length of the step that failed; 0 when the trial fit.
  std::int64_t failed_length = 0;
};

/// A bucket the verification lowered.
struct LoweredBucket {
  std::int64_t length = 0;
  std::int64_t from = 0;  ///< the micro-batch the sweep found alone
  std::int64_t to = 0;    ///< the micro-batch that passed mixed; 0: dropped (failed even at 1)
};

/// What the verification did.
struct MixVerification {
  /// "verified" (the buckets fit mixed as found), "lowered" (they fit mixed after lowering),
  /// "unverified" (max_rounds trials failed; the last buckets are not proven), "cancelled",
  /// or "skipped" (fewer than two buckets: nothing to mix).
  std::string status = "skipped";
  /// The buckets after the verification, longest first, same lengths as given (a dropped bucket
  /// has micro_batch_size 0).
  std::vector<Bucket> buckets;
  std::vector<MixedTrial> trials;
  std::vector<LoweredBucket> lowered;
};

/// Lowering a failed bucket: one tenth of its micro-batch, at least one sequence (the search's
/// 10% step; a mixed failure is the allocator's fragmentation, a few blocks, not a wrong size).
std::int64_t lowerBucketBatch(std::int64_t micro_batch_size);

/// Verifies `buckets` (longest first; entries with micro_batch_size < 1 are left out of the
/// mix): runs them mixed (mixedOrder) through `probe`; while a trial fails, lowers the failing
/// step's bucket (lowerBucketBatch; at 0 it leaves the mix) and runs the mix again, at most
/// `max_rounds` trials in all. `cancel` (may be empty) is checked before each trial.
/// Throws: autobatch::Error for max_rounds < 1 or a failed trial whose failed_step_index is
/// outside its steps; whatever the probe throws (model errors end the verification).
MixVerification verifyBucketMix(const std::vector<Bucket>& buckets, const MixedProbe& probe,
                                int max_rounds = 6, const CancelHook& cancel = {});

}  // namespace autobatch
