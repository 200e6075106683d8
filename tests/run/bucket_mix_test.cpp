// Mixed verification of a sweep's buckets (src/run/bucket_mix.cpp, autobatch/run/bucket_mix.h,
// issue 18) with fake mixed trials (LibTorch-free).
#include "autobatch/run/bucket_mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace bucket_mix_test {

// A fake mixed trial: bucket `length` fails when its micro-batch is above cap[length] (the
// fragmentation a mix leaves), at its first step over the cap; otherwise the trial fits.
MixedProbe cappedMix(std::map<std::int64_t, std::int64_t> cap, int& calls) {
  return [cap = std::move(cap), &calls](const std::vector<Bucket>& steps) {
    ++calls;
    TrialResult r;
    r.request.micro_batch_size = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      r.request.micro_batch_size = std::max(r.request.micro_batch_size, steps[i].micro_batch_size);
      if (steps[i].micro_batch_size > cap.at(steps[i].length)) {
        r.outcome = TrialOutcome::kOutOfMemory;
        r.failed_step_index = static_cast<int>(i);
        return r;
      }
    }
    return r;
  };
}

TEST(BucketMixTest, OrderAlternatesTheLongestWithTheOthersFromTheShortestUp) {
  // Catches an order that never runs the longest bucket right after the shortest (the mix that
  // leaves the cache carved for the other shape) or leaves a bucket out.
  EXPECT_EQ(mixedOrder(0), std::vector<std::size_t>{});
  EXPECT_EQ(mixedOrder(1), (std::vector<std::size_t>{0}));
  EXPECT_EQ(mixedOrder(2), (std::vector<std::size_t>{0, 1, 0}));
  EXPECT_EQ(mixedOrder(3), (std::vector<std::size_t>{0, 2, 0, 1, 0}));
  EXPECT_EQ(mixedOrder(4), (std::vector<std::size_t>{0, 3, 0, 2, 0, 1, 0}));
}

TEST(BucketMixTest, AFailedFirstMixLowersTheFailingBucketAndVerifiesAgain) {
  // The longest bucket fits alone at 6 but not after the shortest in the mix (cap 5): the first
  // trial fails at step 2 (the longest again, after 32:40). Catches lowering the bucket whose
  // index is the step's (step 2 is bucket 0 in the order, not bucket 2), lowering every bucket, or
  // answering without a second, passing trial.
  int calls = 0;
  const std::vector<Bucket> buckets = {{128, 6}, {64, 14}, {32, 40}};
  const MixVerification v =
      verifyBucketMix(buckets, cappedMix({{128, 5}, {64, 14}, {32, 40}}, calls), 0);
  EXPECT_EQ(v.status, "lowered");
  ASSERT_EQ(v.trials.size(), 2U);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(v.trials[0].steps,
            (std::vector<Bucket>{{128, 6}, {32, 40}, {128, 6}, {64, 14}, {128, 6}}));
  EXPECT_EQ(v.trials[0].failed_length, 128);
  EXPECT_EQ(v.trials[1].result.outcome, TrialOutcome::kFits);
  EXPECT_EQ(v.trials[1].failed_length, 0);
  EXPECT_EQ(v.buckets, (std::vector<Bucket>{{128, 5}, {64, 14}, {32, 40}}));
  ASSERT_EQ(v.lowered.size(), 1U);
  EXPECT_EQ(v.lowered[0].length, 128);
  EXPECT_EQ(v.lowered[0].from, 6);
  EXPECT_EQ(v.lowered[0].to, 5);

  // A mix that fits at once is "verified", one trial, nothing lowered.
  calls = 0;
  const MixVerification ok =
      verifyBucketMix(buckets, cappedMix({{128, 6}, {64, 14}, {32, 40}}, calls), 0);
  EXPECT_EQ(ok.status, "verified");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ok.buckets, buckets);
  EXPECT_TRUE(ok.lowered.empty());
}

TEST(BucketMixTest, LowersStepByStepUntilTheMixFitsAndDropsABucketThatNeverDoes) {
  // 64:100 must come down to <= 80: 100 -> 90 -> 81 -> 73 (10% steps, at least 1). Catches a
  // lowering that jumps (halving would give 50) or that stops after one round.
  EXPECT_EQ(lowerBucketBatch(100), 90);
  EXPECT_EQ(lowerBucketBatch(9), 8);
  EXPECT_EQ(lowerBucketBatch(1), 0);
  int calls = 0;
  const MixVerification v =
      verifyBucketMix({{128, 30}, {64, 100}}, cappedMix({{128, 30}, {64, 80}}, calls), 0);
  EXPECT_EQ(v.status, "lowered");
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(v.buckets, (std::vector<Bucket>{{128, 30}, {64, 73}}));
  ASSERT_EQ(v.lowered.size(), 1U);
  EXPECT_EQ(v.lowered[0].from, 100);
  EXPECT_EQ(v.lowered[0].to, 73);

  // A bucket that fails in every mix down to 1 leaves it (micro-batch 0); what is left is one
  // bucket, searched alone: "lowered", no further trial. Catches a loop that mixes a bucket at 0.
  calls = 0;
  const MixVerification drop =
      verifyBucketMix({{128, 2}, {64, 4}}, cappedMix({{128, 0}, {64, 4}}, calls), 0, 10);
  EXPECT_EQ(drop.status, "lowered");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(drop.buckets, (std::vector<Bucket>{{128, 0}, {64, 4}}));
  EXPECT_EQ(drop.lowered[0].to, 0);

  // Out of rounds: "unverified". Issue 27 row 12: the bucket that failed was never seen to pass
  // mixed, so it is dropped (0), not kept at its last try (73); the one that never failed stays.
  // Catches an answer that exports a size no mixed trial passed.
  calls = 0;
  const MixVerification out =
      verifyBucketMix({{128, 30}, {64, 100}}, cappedMix({{128, 30}, {64, 10}}, calls), 0, 3);
  EXPECT_EQ(out.status, "unverified");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(out.buckets, (std::vector<Bucket>{{128, 30}, {64, 0}}));
  ASSERT_EQ(out.lowered.size(), 1U);
  EXPECT_EQ(out.lowered[0].from, 100);
  EXPECT_EQ(out.lowered[0].to, 0);
}

TEST(BucketMixTest, NothingToMixAndBadProbesAreSaidSo) {
  // One bucket (or one left after zeros): "skipped", no trial. Catches a verification that runs a
  // one-shape "mix" and calls it verified.
  int calls = 0;
  EXPECT_EQ(verifyBucketMix({{128, 3}}, cappedMix({{128, 3}}, calls), 0).status, "skipped");
  EXPECT_EQ(verifyBucketMix({{128, 0}, {64, 3}}, cappedMix({{128, 0}, {64, 3}}, calls), 0).status,
            "skipped");
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(verifyBucketMix({{128, 3}, {64, 5}}, cappedMix({{128, 3}, {64, 5}}, calls), 0, 0),
               Error);
  const MixedProbe lost = [](const std::vector<Bucket>&) {
    TrialResult r;
    r.outcome = TrialOutcome::kOutOfMemory;
    r.failed_step_index = 7;
    return r;
  };
  EXPECT_THROW(verifyBucketMix({{128, 3}, {64, 5}}, lost, 0), Error);
  const MixVerification cancelled =
      verifyBucketMix({{128, 3}, {64, 5}}, lost, 0, 6, [] { return true; });
  EXPECT_EQ(cancelled.status, "cancelled");
  EXPECT_TRUE(cancelled.trials.empty());
}

// Issue 27, row 12: mixed verification under the margin.

// A fake mixed trial that always fits under `limit` and peaks like a real one: each step needs
// 1000 bytes plus one per token (micro-batch x length) of its own, plus a tenth of the previous
// step's tokens, still held when it starts (the loop's variables); the trial's peak is the
// largest step's.
MixedProbe heldMix(std::int64_t limit, int& calls) {
  return [limit, &calls](const std::vector<Bucket>& steps) {
    ++calls;
    TrialResult r;
    r.memory_limit_bytes = limit;
    std::int64_t held = 0;
    for (const auto& b : steps) {
      const std::int64_t tokens = b.micro_batch_size * b.length;
      r.peak_bytes = std::max(r.peak_bytes, 1000 + tokens + held);
      held = tokens / 10;
    }
    return r;
  };
}

TEST(BucketMixTest, AFitOverTheMarginIsNeverVerifiedAndLowersTheBucketOfTheLargestPeak) {
  // Limit 12000, margin 2000: a trial passes at a peak <= 10000. 128:70 after 64:100 peaks at
  // 1000 + 8960 + 640 = 10600: it fits, over the margin. Catches "verified" for any trial that
  // fits (the 63,807,880 over 63,753,421).
  int calls = 0;
  const MixVerification v =
      verifyBucketMix({{128, 70, 9960}, {64, 100, 7400}}, heldMix(12000, calls), 2000);
  EXPECT_EQ(v.status, "lowered");
  ASSERT_EQ(v.trials.size(), 2U);
  EXPECT_EQ(v.trials[0].result.outcome, TrialOutcome::kFits);
  EXPECT_EQ(v.trials[0].result.peak_bytes, 10600);
  EXPECT_TRUE(v.trials[0].over_margin);
  EXPECT_FALSE(v.trials[0].passed);
  EXPECT_EQ(v.trials[0].failed_length, 128);
  // 70 -> 63: 1000 + 8064 + 640 = 9704 <= 10000.
  EXPECT_EQ(v.trials[1].result.peak_bytes, 9704);
  EXPECT_TRUE(v.trials[1].passed);
  EXPECT_FALSE(v.trials[1].over_margin);
  EXPECT_EQ(v.buckets[0].micro_batch_size, 63);
  EXPECT_EQ(v.buckets[1].micro_batch_size, 100);
  EXPECT_EQ(v.margin_bytes, 2000);

  // The same trials at margin 0 pass at once (10600 <= 12000): the margin, not the limit, decides.
  calls = 0;
  EXPECT_EQ(verifyBucketMix({{128, 70}, {64, 100}}, heldMix(12000, calls), 0).status, "verified");
  EXPECT_EQ(calls, 1);

  // The shorter bucket sets the peak (64:130 after 128:10: 1000 + 8320 + 128 = 9448 > 9000): it is
  // the one lowered, by its own peak alone (9320 > 2280), 130 -> 117 (8616). Catches lowering
  // the longest bucket whatever set the peak.
  calls = 0;
  const MixVerification shorter =
      verifyBucketMix({{128, 10, 2280}, {64, 130, 9320}}, heldMix(12000, calls), 3000);
  EXPECT_EQ(shorter.status, "lowered");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(shorter.trials[0].failed_length, 64);
  EXPECT_EQ(shorter.buckets[0].micro_batch_size, 10);
  EXPECT_EQ(shorter.buckets[1].micro_batch_size, 117);

  // No peak known (a trusted cache hit ran no trial): the longest is lowered.
  calls = 0;
  const MixVerification unknown =
      verifyBucketMix({{128, 10}, {64, 130}}, heldMix(12000, calls), 3000);
  EXPECT_EQ(unknown.trials[0].failed_length, 128);
}

TEST(BucketMixTest, AMixOverTheMarginInEveryRoundExportsNoSizeOfTheFailingBucket) {
  // Every trial fits but over the margin (the peak stays above 10000 at any size of 128: the
  // margin is 11500 of 12000): 6 rounds, "unverified", and 128 is dropped (0), its lowered "to" 0.
  // Catches the cache-trust case: a bucket whose mix failed 6 times still exported.
  int calls = 0;
  const MixVerification v =
      verifyBucketMix({{128, 70, 9960}, {64, 10, 1640}}, heldMix(12000, calls), 11500);
  EXPECT_EQ(v.status, "unverified");
  EXPECT_EQ(calls, 6);
  for (const auto& t : v.trials) {
    EXPECT_FALSE(t.passed);
    EXPECT_EQ(t.failed_length, 128);
  }
  EXPECT_EQ(v.buckets[0].micro_batch_size, 0);
  EXPECT_EQ(v.buckets[1], (Bucket{64, 10, 1640}));
  ASSERT_EQ(v.lowered.size(), 1U);
  EXPECT_EQ(v.lowered[0].from, 70);
  EXPECT_EQ(v.lowered[0].to, 0);
  EXPECT_THROW(verifyBucketMix({{128, 3}, {64, 5}}, heldMix(12000, calls), -1), Error);
}

}  // namespace bucket_mix_test
}  // namespace
}  // namespace autobatch
