// The guided strategy on a replayed peak (TrialResult::replayed_peak, docs/search.md "The replayed
// peak"): a measuring trial's forward and backward peak at any batch, as autobatch.find's probe
// replays it from the budget allocator's events at two sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "autobatch/search/search.h"
#include "support/fake_probe.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace search_replay_test {

using testing::PhasedModel;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// The fair race's ViT-B/16 row in miniature (issue 44): backward is the larger of two lines, flat
// at small batches (every weight gradient allocated at its end) and forward's slope plus a
// gradient buffer's per sample above; the optimizer step is flat. From min_batch and the second
// probe both in the flat regime, backward's secant reads forward's slope and guesses one too high,
// or, far beyond it, a short-aimed jump first.
PhasedModel vitLike(std::int64_t limit_bytes) {
  PhasedModel m;
  m.limit_bytes = limit_bytes;
  m.phases = {{"forward", 1000 * kMiB, 3026736},
              {"backward", 1336 * kMiB, 39944},
              {"backward", 1000 * kMiB + 12345, 3042056},
              {"optimizer-step", 1336 * kMiB, 0}};
  return m;
}

// The replayed peak the probe would report: the forward and backward's lines, exact.
std::vector<PeakLine> exactLines(const PhasedModel& m) {
  std::vector<PeakLine> lines;
  for (const auto& p : m.phases) {
    if (std::string_view(p.name) == "optimizer-step") continue;
    lines.push_back({static_cast<double>(p.fixed_bytes), static_cast<double>(p.per_sample_bytes)});
  }
  return lines;
}

SearchOptions guided() {
  SearchOptions options;
  options.strategy = Strategy::kGuided;
  options.margin_bytes = 0;
  options.min_batch = 2;
  return options;
}

// A probe that shortens the measuring trials, marks their failures as standing (as find's probe
// does one above the largest full fit on the race's models), and reports `lines` on their fits.
Probe replayingProbe(PhasedModel& m, const std::vector<PeakLine>& lines) {
  return [&m, lines](const TrialRequest& request) {
    TrialResult r = m.run(request);
    if (!request.measure) return r;
    r.shortened = true;
    r.stands_for_full = r.outcome == TrialOutcome::kOutOfMemory;
    if (r.outcome == TrialOutcome::kFits) r.replayed_peak = lines;
    return r;
  };
}

std::vector<std::int64_t> sizes(const SearchResult& r) {
  std::vector<std::int64_t> out;
  for (const auto& t : r.trials) out.push_back(t.request.micro_batch_size);
  return out;
}

// Catches a strategy that ignores the replayed peak (the secants' guess one too high, a full trial
// out of memory before the fit, or a far jump aimed short first) and one that still aims a
// replayed boundary short as a far jump: with the exact replay every search is min_batch, the
// second probe, B* in full and B* + 1 measured, whatever B*.
TEST(SearchReplayTest, AnExactReplayGoesStraightToTheAnswer) {
  int fewer = 0;
  for (std::int64_t limit = 1500 * kMiB; limit <= 2100 * kMiB; limit += 7 * kMiB + 12345) {
    PhasedModel m = vitLike(limit);
    const std::int64_t threshold = m.threshold();
    ASSERT_GT(threshold, 8);
    const SearchResult r = findMaxBatch(replayingProbe(m, exactLines(m)), guided());
    ASSERT_EQ(r.max_micro_batch, threshold) << limit;
    ASSERT_EQ(sizes(r), (std::vector<std::int64_t>{2, 4, threshold, threshold + 1})) << limit;
    ASSERT_FALSE(r.trials[2].shortened);  // the answer's fit is a full trial
    PhasedModel plain = vitLike(limit);
    const SearchResult without = findMaxBatch(replayingProbe(plain, {}), guided());
    ASSERT_EQ(without.max_micro_batch, threshold);
    if (without.trials.size() > r.trials.size()) ++fewer;
  }
  EXPECT_GT(fewer, 40);  // of 86 budgets: the secants alone take more trials on most
}

// Catches a strategy that trusts a replay the trials contradict: lines that agree with min_batch
// and the second probe (both in the flat regime, where the exact flat line sets the peak) but read
// the activations' slopes 2% low guess too high, and 2% high too low; either is dropped at the
// first full trial that measures otherwise (its failure's bound, or its fit's peak), so the answer
// stays exact and the search takes at most two trials more than the secants' alone. Trusted
// without the check, the low replay guesses above a failure again and again.
TEST(SearchReplayTest, AReplayTheTrialsContradictIsDropped) {
  for (const double scale : {0.98, 1.02}) {
    int guessed_from_it = 0;
    for (std::int64_t limit = 1500 * kMiB; limit <= 2100 * kMiB; limit += 23 * kMiB + 999) {
      PhasedModel m = vitLike(limit);
      const std::int64_t threshold = m.threshold();
      std::vector<PeakLine> wrong = exactLines(m);
      for (auto& line : wrong) {
        if (line.bytes_per_sample > 1e6) line.bytes_per_sample *= scale;
      }
      const SearchResult r = findMaxBatch(replayingProbe(m, wrong), guided());
      ASSERT_EQ(r.max_micro_batch, threshold) << scale << " " << limit;
      PhasedModel plain = vitLike(limit);
      const SearchResult without = findMaxBatch(replayingProbe(plain, {}), guided());
      ASSERT_LE(r.trials.size(), without.trials.size() + 2) << scale << " " << limit;
      // The third trial is the wrong replay's guess, in full: the replay was used, then dropped.
      if (!r.trials[2].shortened && r.trials[2].request.micro_batch_size != threshold) {
        ++guessed_from_it;
      }
    }
    EXPECT_GT(guessed_from_it, 20) << scale;
  }
}

}  // namespace search_replay_test
}  // namespace
}  // namespace autobatch
