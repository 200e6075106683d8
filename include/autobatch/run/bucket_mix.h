// autobatch/run/bucket_mix.h — the mixed verification of a length sweep's buckets (issue 18,
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

#include "autobatch/vocabulary/trial.h"

namespace autobatch {

/// One bucket of a sweep: a sequence length and the micro-batch to train it with.
struct Bucket {
  std::int64_t length = 0;            ///< tokens (the value of L). Range >= 1.
  std::int64_t micro_batch_size = 0;  ///< sequences. Range >= 1 (0: dropped from the mix).
  /// The peak its own search measured at micro_batch_size, in bytes; 0 when unknown (a trusted
  /// cache hit ran no trial). A mixed trial that fits but over the margin names no step: the
  /// bucket with the largest such peak is the one lowered (the mix peaks where its largest bucket
  /// does, plus what the previous step still holds). Lowering scales it with the micro-batch.
  std::int64_t alone_peak_bytes = 0;

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
  /// It fit AND its peak is within the limit less the margin: the only trial that verifies.
  bool passed = false;
  /// It fit, but its peak is above the limit less the margin (a failed mix: the job would run
  /// without its headroom); failed_length is then the bucket lowered for it.
  bool over_margin = false;
  /// The length of the bucket that failed (the failing step's, or for over_margin the one
  /// lowered); 0 when the trial passed.
  std::int64_t failed_length = 0;
};

/// A bucket the verification lowered.
struct LoweredBucket {
  std::int64_t length = 0;
  std::int64_t from = 0;  ///< the micro-batch the sweep found alone
  /// The micro-batch that passed mixed; 0: dropped (failed even at 1, or the mix never passed
  /// after it failed: status "unverified").
  std::int64_t to = 0;
};

/// What the verification did.
struct MixVerification {
  /// "verified" (the buckets passed mixed as found), "lowered" (they passed mixed after
  /// lowering), "unverified" (max_rounds trials failed: every bucket that failed in one is
  /// dropped, micro-batch 0, since no trial proved a size of it), "cancelled", or "skipped"
  /// (fewer than two buckets: nothing to mix). A trial passes only when it fits under the limit
  /// less the margin (MixedTrial::passed).
  std::string status = "skipped";
  /// The buckets after the verification, longest first, same lengths as given (a dropped bucket
  /// has micro_batch_size 0).
  std::vector<Bucket> buckets;
  /// The headroom a mixed trial must keep, in bytes (the search's margin).
  std::int64_t margin_bytes = 0;
  std::vector<MixedTrial> trials;
  std::vector<LoweredBucket> lowered;
};

/// Lowering a failed bucket: one tenth of its micro-batch, at least one sequence (the search's
/// 10% step; a mixed failure is the allocator's fragmentation, a few blocks, not a wrong size).
std::int64_t lowerBucketBatch(std::int64_t micro_batch_size);

/// Verifies `buckets` (longest first; entries with micro_batch_size < 1 are left out of the
/// mix): runs them mixed (mixedOrder) through `probe`; while a trial does not pass (it failed,
/// or it fit with a peak above its memory_limit_bytes less `margin_bytes`), lowers a bucket
/// (lowerBucketBatch; at 0 it leaves the mix): the failing step's, or for a trial over the
/// margin the one with the largest alone_peak_bytes (the longest when none is known). Then it
/// runs the mix again, at most `max_rounds` trials in all. Out of rounds ("unverified"), every
/// bucket that failed in a trial is dropped (micro-batch 0): it was never seen to pass mixed.
/// `cancel` (may be empty) is checked before each trial. `margin_bytes`: >= 0.
/// Throws: autobatch::Error for max_rounds < 1, margin_bytes < 0 or a failed trial whose
/// failed_step_index is outside its steps; whatever the probe throws (model errors end the
/// verification).
MixVerification verifyBucketMix(const std::vector<Bucket>& buckets, const MixedProbe& probe,
                                std::int64_t margin_bytes, int max_rounds = 6,
                                const CancelHook& cancel = {});

}  // namespace autobatch
