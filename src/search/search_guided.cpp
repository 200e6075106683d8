// The guided strategy (docs/search.md): a search on the max-of-phases model. Each phase of a step
// (and micro-batch) is affine on its own and the peak is the largest of them, so the boundary is
// the smallest batch at which any phase's line reaches the budget; steps gallop when outcomes keep
// landing on one side and bisect when the bracket does not shrink fast enough.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "autobatch/vocabulary/trial.h"
#include "search/search_strategy.h"

namespace autobatch::detail {
namespace {

// How far to go towards a prediction extrapolated far beyond its secant. Tuned with
// tests/bench/search_bench.cpp.
constexpr double kFarJumpFraction = 0.95;
// After an extrapolation beyond the fits failed, how far to go towards the model's batch (issue
// 28 item 7). Tuned with tests/bench/search_bench.cpp.
constexpr double kBackOff = 0.8;
// A phase's slope before any point gave one.
constexpr double kNoSlope = -std::numeric_limits<double>::infinity();

/// A phase's bytes per sample, and whether a point above the anchor set it.
struct Slope {
  double bytes_per_sample = kNoSlope;
  bool bounded = false;
};

/// What a prediction stands on: the anchor (the largest fit at or below the batch asked for) and
/// the reference point of its secants below it (none: ref null, b 0).
struct Anchor {
  std::map<std::int64_t, MeasuredFit>::const_iterator it;
  std::int64_t a = 0;
  const MeasuredFit* ref = nullptr;
  std::int64_t b = 0;
};

/// The budget and the anchor's overhead as a batch's need is compared with them.
struct Room {
  std::int64_t budget_bytes = 0;
  std::int64_t overhead_bytes = 0;
  std::int64_t block_bytes = 1;  // the unit every phase peak is a multiple of (1: none)
};

/// The anchor for a prediction at or below `below`: the largest fit <= below, its secants' other
/// end the largest fit at or below half of it, else the smallest fit. False when no fit is <=
/// below.
bool findAnchor(const std::map<std::int64_t, MeasuredFit>& fits, std::int64_t below,
                Anchor& anchor) {
  auto at = fits.upper_bound(below);
  if (at == fits.begin()) return false;
  --at;
  anchor.it = at;
  anchor.a = at->first;
  auto it = fits.upper_bound(anchor.a / 2);
  if (it != fits.begin()) {
    --it;
    if (it->first != anchor.a) std::tie(anchor.b, anchor.ref) = std::pair{it->first, &it->second};
  } else if (fits.begin()->first != anchor.a) {
    std::tie(anchor.b, anchor.ref) = std::pair{fits.begin()->first, &fits.begin()->second};
  }
  return true;
}

/// The allocation unit every measured peak is a multiple of: the page (when two peaks differ), the
/// block, else 1 (SearchOptions::allocation_units; the CPU budget allocator counts bytes).
std::int64_t quantum(const std::map<std::int64_t, MeasuredFit>& fits,
                     const AllocationUnits& units) {
  for (const std::int64_t unit : {units.page_bytes, units.block_bytes}) {
    if (unit <= 1) continue;
    std::set<std::int64_t> peaks;
    bool all = !fits.empty();
    for (const auto& [batch, m] : fits) {
      all = all && m.peak > 0 && m.peak % unit == 0;
      peaks.insert(m.peak);
    }
    if (all && (unit == units.block_bytes || peaks.size() >= 2)) return unit;
  }
  return 1;
}

/// The unit every measured phase peak is a multiple of: the block when the allocator hands out
/// whole blocks, else 1.
std::int64_t phaseQuantum(const std::map<std::int64_t, MeasuredFit>& fits,
                          const AllocationUnits& units) {
  const std::int64_t block = units.block_bytes;
  if (block <= 1) return 1;
  bool all = !fits.empty();
  for (const auto& [batch, m] : fits) {
    for (const auto& [key, bytes] : m.phases) all = all && bytes > 0 && bytes % block == 0;
  }
  return all ? block : 1;
}

/// The caching allocator reserves whole blocks (pages with expandable segments): when every
/// measured peak is a multiple of one, a batch fits while its need rounded up stays under the
/// budget rounded down, and the anchor's overhead is that rounding (less one unit, whatever lies
/// beyond it: fragmentation, outside growth).
Room roomAt(const SearchTrials& trials, const AllocationUnits& units, std::int64_t budget_bytes,
            const MeasuredFit& anchor) {
  Room room{budget_bytes, anchor.overhead, phaseQuantum(trials.fits, units)};
  const std::int64_t unit = quantum(trials.fits, units);
  if (unit > 1) {
    room.budget_bytes = budget_bytes / unit * unit;
    room.overhead_bytes = std::max<std::int64_t>(0, anchor.overhead - unit + 1);
  }
  return room;
}

/// The slope of the phase `key` (at `value` bytes at the anchor): the steepest secant to a fit
/// above the anchor (they bracket the boundary, so they interpolate), else the secant below it, in
/// either case raised to what an out-of-memory trial above the anchor proves.
Slope phaseSlope(const SearchTrials& trials, const Anchor& anchor, const Room& room,
                 const std::string& key, std::int64_t value) {
  const std::int64_t a = anchor.a;
  Slope slope;
  for (auto up = std::next(anchor.it); up != trials.fits.end(); ++up) {
    const auto there = up->second.phases.find(key);
    if (there == up->second.phases.end()) continue;
    const double s =
        static_cast<double>(there->second - value) / static_cast<double>(up->first - a);
    if (s > slope.bytes_per_sample) slope = {s, true};
  }
  if (!slope.bounded && anchor.ref != nullptr) {
    const auto there = anchor.ref->phases.find(key);
    if (there != anchor.ref->phases.end()) {
      const std::int64_t span = a - anchor.b;
      double s = static_cast<double>(value - there->second) / static_cast<double>(span);
      // Far beyond the secant, its error matters: each end may be off by one allocation unit,
      // so take the steepest slope they allow (a short secant over 2 MiB blocks may read flat
      // where the phase grows).
      const auto left = static_cast<double>(room.budget_bytes - room.overhead_bytes - value);
      if (room.block_bytes > 1 && (s <= 0.0 || left / s > 4.0 * static_cast<double>(span))) {
        s += static_cast<double>(2 * room.block_bytes) / static_cast<double>(span);
      }
      slope.bytes_per_sample = s;
    }
  }
  for (auto up = trials.bounds.upper_bound(a); up != trials.bounds.end(); ++up) {
    if (up->second.first != key) continue;
    const double s =
        static_cast<double>(up->second.second - value) / static_cast<double>(up->first - a);
    if (s > slope.bytes_per_sample) slope = {s, true};
  }
  return slope;
}

/// Backward starts with every activation forward saved still alive: at large batches its peak
/// grows at least as fast as forward's. Its own secant from a small batch may not show it (at
/// small batches backward peaks at its end, when the weight gradients are all allocated), and then
/// it overshoots: mlp_8x2048's backward rises 24.6 KB per sample from 1 to 2, 73.5 KB from 2 to
/// 7072, and 90.1 KB, forward's slope, near 7258.
/// A package's one call is the same: its peak counting none of the gradients it returns
/// ("forward-backward-activations", src/probes/trial_runner.cpp) plays forward's part. Without it
/// ResNet-18's package jumped from batch 2 to 265 and 244 (both out of memory; the answer was 75)
/// on a forward-backward secant of 0.43 MiB per sample.
void boundByActivations(std::map<std::string, Slope>& slopes) {
  static const std::array<std::pair<std::string, std::string>, 2> bounded_by = {{
      {std::string(phaseKey(TrialPhase::kBackward)) + "#",
       std::string(phaseKey(TrialPhase::kForward)) + "#"},
      {std::string(phaseKey(TrialPhase::kForwardBackward)) + "#",
       std::string(phaseKey(TrialPhase::kCallActivations)) + "#"},
  }};
  for (auto& [key, slope] : slopes) {
    if (slope.bounded) continue;
    for (const auto& [prefix, by_prefix] : bounded_by) {
      if (!key.starts_with(prefix)) continue;
      const auto by = slopes.find(by_prefix + key.substr(prefix.size()));
      if (by != slopes.end()) {
        slope.bytes_per_sample = std::max(slope.bytes_per_sample, by->second.bytes_per_sample);
      }
    }
  }
}

/// How far a trial's forward and backward peak may be from a replayed peak that stands
/// (MeasuredFit::replayed_peak): its lines are doubles from whole bytes.
constexpr double kReplayToleranceBytes = 1024.0;

/// The phases a replayed peak covers: the forward, loss and backward of the one micro-batch.
bool replayedPhase(const std::string& key) {
  return key == phaseKeyOf(phaseKey(TrialPhase::kForward), 0) ||
         key == phaseKeyOf(phaseKey(TrialPhase::kLoss), 0) ||
         key == phaseKeyOf(phaseKey(TrialPhase::kBackward), 0);
}

/// The replayed peak at `batch`: the largest of its lines.
double replayedAt(const std::vector<PeakLine>& lines, std::int64_t batch) {
  double most = -std::numeric_limits<double>::infinity();
  for (const PeakLine& line : lines) {
    most =
        std::max(most, line.intercept_bytes + line.bytes_per_sample * static_cast<double>(batch));
  }
  return most;
}

/// The replayed peak a step stands on (docs/search.md, "The replayed peak"): that of the largest
/// fit at or below the anchor with one, while every trial agrees with it: each fit's largest
/// forward, loss or backward peak within kReplayToleranceBytes of it (a full trial checks a
/// replay made from a measuring one's two sizes), each out-of-memory trial that failed in those
/// phases refused above it. Null when none stands: a model
/// whose allocations are not affine in the batch (or change order with it) shows that at the
/// first trial measured after the replay, and the phases' secants step from there.
const std::vector<PeakLine>* standingReplay(const SearchTrials& trials, const Anchor& anchor) {
  const std::vector<PeakLine>* lines = nullptr;
  for (auto it = std::make_reverse_iterator(std::next(anchor.it)); it != trials.fits.rend(); ++it) {
    if (!it->second.replayed_peak.empty()) {
      lines = &it->second.replayed_peak;
      break;
    }
  }
  if (lines == nullptr) return nullptr;
  for (const auto& [batch, fit] : trials.fits) {
    double measured = -1.0;
    for (const auto& [key, bytes] : fit.phases) {
      if (replayedPhase(key)) measured = std::max(measured, static_cast<double>(bytes));
    }
    if (measured < 0.0 || std::abs(replayedAt(*lines, batch) - measured) > kReplayToleranceBytes) {
      return nullptr;
    }
  }
  for (const auto& [batch, bound] : trials.bounds) {
    if (replayedPhase(bound.first) &&
        replayedAt(*lines, batch) < static_cast<double>(bound.second) - kReplayToleranceBytes) {
      return nullptr;
    }
  }
  return lines;
}

/// The largest batch whose replayed peak stays within `room` (the anchor's overhead on top), or
/// -1 when a line that does not grow is over it at the anchor `a` already (one that falls with
/// the batch and is under it there stays under above).
double replayedBoundary(const std::vector<PeakLine>& lines, const Room& room, std::int64_t a) {
  const auto left = static_cast<double>(room.budget_bytes - room.overhead_bytes);
  double best = std::numeric_limits<double>::infinity();
  for (const PeakLine& line : lines) {
    if (line.bytes_per_sample <= 0.0) {
      if (line.intercept_bytes + line.bytes_per_sample * static_cast<double>(a) > left) {
        return -1.0;
      }
      continue;
    }
    best = std::min(best, std::floor((left - line.intercept_bytes) / line.bytes_per_sample));
  }
  return best;
}

class GuidedStrategy final : public SearchStrategy {
 public:
  GuidedStrategy(const SearchOptions& options, SearchGoal goal)
      : options_(options),
        goal_(goal),
        stage_(goal == SearchGoal::kMaximum ? Stage::kSeeds : Stage::kSteps) {}

  std::int64_t next(const SearchTrials& trials, const Bracket& bracket) override {
    stepped_ = false;
    measuring_ = false;
    if (stage_ == Stage::kSteps) return step(trials, bracket);
    return opening(trials, bracket);
  }

  void noteOutcome(bool fit, const Bracket& before, const Bracket& after) override {
    if (!stepped_) return;  // the opening probes are no guesses at the boundary
    const std::int64_t width_before = before.high - before.low;
    const std::int64_t width_after = after.high - after.low;
    // A short-aimed far jump is not a guess at the boundary: it starts no gallop.
    streak_ = fit ? (far_jump_ ? 0 : std::max(streak_, 0) + 1) : std::min(streak_, 0) - 1;
    if (width_before < kUnbounded / 2 && width_after * 2 > width_before) {
      ++stalls_;
    } else {
      stalls_ = 0;
    }
    width_before_ = width_before;
  }

  bool measuring() const override { return measuring_; }

 private:
  /// The maximum's opening probes, in order; then kSteps (the safe goal starts there).
  enum class Stage { kSeeds, kFirst, kSecond, kSteps };

  /// The seeds, min_batch and the second probe; then the steps.
  std::int64_t opening(const SearchTrials& trials, const Bracket& bracket) {
    const std::int64_t b1 = options_.min_batch;
    const bool seeded = !options_.seed_batches.empty();
    switch (stage_) {
      case Stage::kSeeds:
        while (seed_index_ < options_.seed_batches.size()) {
          const std::int64_t x = std::clamp(options_.seed_batches[seed_index_++], b1, trials.cap);
          if (trials.fits.contains(x) || trials.fails.contains(x) || x <= bracket.low ||
              x >= bracket.high) {
            continue;
          }
          return x;
        }
        if (trials.fits.empty()) {
          // A full trial: min_batch verified is an answer whatever stops the search later (a
          // model error, the time budget), and its failure says that nothing fits.
          stage_ = Stage::kFirst;
          return b1;
        }
        break;
      case Stage::kFirst:
        if (trials.fits.empty()) return 0;  // min_batch does not fit
        if (!seeded) {
          if (b1 >= trials.cap) return 0;
          stage_ = Stage::kSecond;
          const std::int64_t b2 = secondProbe(trials);
          // The second probe measures (the model predicts from it), unless it is the cap: then it
          // is the answer if it fits, and a shortened trial there would be repeated in full.
          measuring_ = b2 < trials.cap;
          return b2;
        }
        break;
      case Stage::kSecond:
      case Stage::kSteps:
        break;
    }
    stage_ = Stage::kSteps;
    return step(trials, bracket);
  }

  /// Under peak(B) = fixed + per_sample * B with fixed >= 0, peak(k * b1) <= k * peak(b1): the
  /// largest k with k * peak(b1) <= limit is the largest multiple the first probe proves safe.
  std::int64_t secondProbe(const SearchTrials& trials) const {
    const std::int64_t b1 = options_.min_batch;
    std::int64_t b2 = 2 * b1;
    const std::int64_t p1 = trials.fits.begin()->second.peak;
    const std::int64_t limit = trials.limit_bytes;
    if (limit > 0 && p1 > 0 && p1 < limit) b2 = std::max(b2, b1 * (limit / p1));
    return std::min(b2, trials.cap);
  }

  /// A model-guided step inside the bracket, from the model at its budget, anchored at its low.
  std::int64_t step(const SearchTrials& trials, const Bracket& bracket) {
    if (bracket.closed) return 0;
    stepped_ = true;
    const std::int64_t pred = predict(trials, bracket.budget_bytes, bracket.low);
    // The maximum's bracket closed by an out-of-memory trial (the safe goal starts from fits
    // near the maximum: its steps interpolate).
    high_failed_ = goal_ == SearchGoal::kMaximum && trials.fails.contains(bracket.high);
    return guidedNext(trials.cap, bracket.low, bracket.high, pred);
  }

  std::int64_t predict(const SearchTrials& trials, std::int64_t budget_bytes, std::int64_t below);
  std::int64_t boundary(const SearchTrials& trials, const Anchor& anchor, const Room& room);
  std::int64_t guidedNext(std::int64_t cap, std::int64_t low, std::int64_t high, std::int64_t pred);

  /// Where repeated fits at the predicted boundary push the next step: from the fifth, doubling
  /// steps (+2, +4, ...).
  std::int64_t gallop(std::int64_t low) const {
    if (streak_ < 5) return low + 1;
    return low + (std::int64_t{1} << std::min(streak_ - 4, 40));
  }

  /// The step after an extrapolation far beyond the fits ran out of memory (issue 28 item 7):
  /// `target`, the model's batch with its slopes raised to the failures' lower bounds (a batch
  /// just under the failure when the refused request was small), drawn towards `low` by kBackOff
  /// (0.8; 0.64 after a second failure in a row). A secant from small probes was off by 21% (a
  /// CIFAR VGG, 1648 for 1366) and 35% (tests/golden/cli/torchscript_search.json, 3273 for
  /// 2414): a fit there anchors a long secant, where a log-space bisection down to the small
  /// probes landed 20x below the answer and climbed back.
  std::int64_t backOff(std::int64_t low, std::int64_t target) const {
    const double fraction = streak_ <= -2 ? kBackOff * kBackOff : kBackOff;
    return low + static_cast<std::int64_t>(fraction * static_cast<double>(target - low));
  }

  /// The geometric midpoint of (low, high), rounded; the arithmetic one when low is 0.
  static std::int64_t logMidpoint(std::int64_t low, std::int64_t high) {
    if (low <= 0) return high / 2;
    return static_cast<std::int64_t>(
        std::llround(std::sqrt(static_cast<double>(low) * static_cast<double>(high))));
  }

  const SearchOptions& options_;
  SearchGoal goal_;
  Stage stage_;
  std::size_t seed_index_ = 0;  // the next seed to consider
  bool stepped_ = false;        // the last batch given came from a model-guided step
  bool measuring_ = false;      // the last batch given is asked for its measurements only
  int streak_ = 0;              // > 0: consecutive fits of guided steps; < 0: consecutive failures
  int stalls_ = 0;              // consecutive guided steps that did not halve the bracket
  std::int64_t width_before_ = 0;
  bool far_jump_ = false;     // the last prediction extrapolated far beyond its secant
  bool high_failed_ = false;  // the bracket's high is an out-of-memory trial
  double window_ = 0.0;       // batches the last prediction cannot resolve (block rounding)
};

/// Prediction of the largest batch whose peak stays <= budget_bytes, on the max-of-phases model:
/// each phase (and micro-batch) is affine on its own, the peak is the largest of them plus the
/// anchor's overhead, so the boundary is the smallest batch at which any phase reaches the budget.
/// Each phase's slope is the secant from the anchor (the largest fit <= `below`) to the largest
/// fit at or below half of it (else the smallest fit), raised to what any point above the anchor
/// proves: a measured fit there, or an out-of-memory trial's lower bound on the phase that failed
/// (bytes in use plus the refused request). A phase below the others still gives its slope.
/// 0 when no phase has a usable slope.
std::int64_t GuidedStrategy::predict(const SearchTrials& trials, std::int64_t budget_bytes,
                                     std::int64_t below) {
  far_jump_ = false;
  window_ = 0.0;
  if (budget_bytes <= 0 || budget_bytes == kNoBudget) return 0;
  Anchor anchor;
  if (!findAnchor(trials.fits, below, anchor)) return 0;
  const Room room = roomAt(trials, options_.allocation_units, budget_bytes, anchor.it->second);
  return boundary(trials, anchor, room);
}

/// The smallest batch at which a phase's line from the anchor reaches the room (0: none does);
/// sets far_jump_ and window_ for the step that follows.
std::int64_t GuidedStrategy::boundary(const SearchTrials& trials, const Anchor& anchor,
                                      const Room& room) {
  const MeasuredFit& at_a = anchor.it->second;
  const std::int64_t a = anchor.a;
  std::map<std::string, Slope> slopes;
  for (const auto& [key, value] : at_a.phases) {
    slopes[key] = phaseSlope(trials, anchor, room, key, value);
  }
  boundByActivations(slopes);
  double best = std::numeric_limits<double>::infinity();
  bool best_bounded = false;  // the binding phase's slope came from a point above the anchor
  // The replayed peak, where one stands, puts the forward and backward's boundary where the
  // step's own allocations reach the room, in place of their secants (which a change of regime
  // inside backward misleads: ViT-B/16's guess one too high, docs/search.md).
  const std::vector<PeakLine>* replay = standingReplay(trials, anchor);
  if (replay != nullptr) {
    const double at = replayedBoundary(*replay, room, a);
    best = at < 0.0 ? static_cast<double>(a) - 1.0 : at;
    best_bounded = true;  // exact, not a secant's extrapolation: no far jump
  }
  for (const auto& [key, slope] : slopes) {
    if (slope.bytes_per_sample == kNoSlope) continue;
    if (replay != nullptr && replayedPhase(key)) continue;
    const std::int64_t value = at_a.phases.at(key);
    const auto left = static_cast<double>(room.budget_bytes - room.overhead_bytes - value);
    if (slope.bytes_per_sample <= 0.0) {
      if (left < 0.0) best = std::min(best, static_cast<double>(a) - 1.0);
      continue;  // flat: this phase does not bind
    }
    const double extra = std::floor(left / slope.bytes_per_sample);
    if (static_cast<double>(a) + extra < best) {
      best = static_cast<double>(a) + extra;
      best_bounded = slope.bounded;
      // A phase rounded to whole blocks hides up to a block of its need: that many batches.
      window_ = static_cast<double>(room.block_bytes) / slope.bytes_per_sample;
    }
  }
  if (best == std::numeric_limits<double>::infinity()) return 0;
  // A slope from a point above the anchor makes the step an interpolation, never a far jump.
  far_jump_ = !best_bounded && anchor.ref != nullptr &&
              best - static_cast<double>(a) > 4.0 * static_cast<double>(a - anchor.b);
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::clamp(best, -1e15, 1e15)));
}

/// The next batch inside (low, high) for a model-guided step towards `pred` (0: no model), with
/// galloping when outcomes keep landing on one side, a step back from one or two out-of-memory
/// failures far beyond the fits (backOff), and bisection when the bracket does not shrink fast
/// enough or a third failure follows; never above `cap`.
std::int64_t GuidedStrategy::guidedNext(std::int64_t cap, std::int64_t low, std::int64_t high,
                                        std::int64_t pred) {
  const std::int64_t top = std::min(high, cap + 1) - 1;
  if (pred > 0 && pred <= low + 1 && window_ >= 2.0) {
    // The model puts the boundary at the anchor, but block rounding hides up to window_ batches
    // above it: bisect what is left of that window.
    const double width = std::min(window_, static_cast<double>(high - low - 1));
    const std::int64_t x =
        low + std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(width / 2.0)));
    return std::clamp(x, low + 1, top);
  }
  if (pred > low && far_jump_) {
    // Extrapolating far beyond a short secant: rounding of the small probes' peaks makes the
    // slope uncertain, so aim short; a fit there is a far anchor for an accurate next secant.
    pred = low + static_cast<std::int64_t>(kFarJumpFraction * static_cast<double>(pred - low));
    measuring_ = goal_ == SearchGoal::kMaximum;  // a far anchor to measure, not a guess
  }
  std::int64_t x = 0;
  // A bracket whose top is the user's cap (max_batch) has seen no failure above its low: it is
  // as open as an unbounded one. Taken for a failure, its width never halved as the fits came
  // near the boundary, and the stall rule bisected towards the cap (issue 44: ResNet-50 under a
  // 900 MiB budget with max_batch 8192 fit 329 at the model's boundary, then tried 4261 and ten
  // more failures down to 330).
  // A model that puts the boundary past the cap goes to the cap itself (clamped below; issue 40
  // row 16: a log-space bisection towards the cap crept up to it in 12 trials when all fit).
  if (high >= kUnbounded || high > cap) {
    // pred in (0, low]: the model puts the boundary at the anchor; confirm it by low + 1.
    x = pred > low ? pred : (pred > 0 ? low + 1 : low * 4);
    x = std::max(x, gallop(low));
  } else {
    const std::int64_t width = high - low;
    if (pred <= 0 || (width_before_ > 0 && width * 2 > width_before_ && stalls_ >= 2)) {
      x = low + width / 2;
      stalls_ = 0;
    } else if (streak_ < 0 && streak_ >= -2 && high_failed_ && high > 8 * low) {
      // Out of memory far beyond the largest fit: an extrapolation from small probes failed.
      x = backOff(low, pred > low ? std::min(pred, high - 1) : high - 1);
    } else if (pred >= high || (streak_ < 0 && streak_ <= -2)) {
      // The model puts the boundary at or above a batch that failed (contradicted: its limit or
      // slopes are wrong, e.g. under a real allocator's limit it cannot see), or a second failure
      // in a row: bisect in log space (a far-off slope is off by a factor, not by a few percent),
      // or go to the model's batch when it is lower.
      x = logMidpoint(low, high);
      if (pred > low) x = std::min(x, pred);
    } else {
      x = std::max(pred, gallop(low));
      if (streak_ <= -2) x = std::min(x, high - (std::int64_t{1} << std::min(-streak_ - 1, 40)));
    }
  }
  x = std::clamp(x, low + 1, top);
  // The model puts the boundary at the anchor: low + 1 is tried to see it fail, not as a guess at
  // the answer. Measured, its failure closes the bracket at once when the probe says that it
  // stands for the full trial's (TrialResult::stands_for_full), else the driver confirms it in
  // full; a fit there is confirmed in full before it is an answer.
  if (goal_ == SearchGoal::kMaximum && pred > 0 && pred <= low && x == low + 1) measuring_ = true;
  if (x >= cap) measuring_ = false;  // the cap is the answer if it fits: tried in full
  return x;
}

}  // namespace

std::unique_ptr<SearchStrategy> makeGuidedStrategy(const SearchOptions& options, SearchGoal goal) {
  return std::make_unique<GuidedStrategy>(options, goal);
}

}  // namespace autobatch::detail
