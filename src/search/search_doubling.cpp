// The baseline strategies, PyTorch Lightning's BatchSizeFinder modes (docs/search.md): binsearch
// (double to the first failure, then bisect) and power (double to the first failure, keep the last
// fit).
#include <algorithm>
#include <cstdint>
#include <memory>

#include "search/search_strategy.h"

namespace autobatch::detail {
namespace {

class DoublingStrategy final : public SearchStrategy {
 public:
  DoublingStrategy(const SearchOptions& options, SearchGoal goal, bool bisect)
      : options_(options),
        bisect_(bisect),
        stage_(goal == SearchGoal::kMaximum ? Stage::kStart : Stage::kSafe) {}

  std::int64_t next(const SearchTrials& trials, const Bracket& bracket) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kHalving;
        last_ = std::clamp(options_.initial_batch, options_.min_batch, trials.cap);
        return last_;
      case Stage::kHalving:
        // Lightning: halve until something fits, then double until the first failure.
        if (!last_fit_) {
          if (last_ <= options_.min_batch) return 0;  // nothing fits
          last_ = std::max(options_.min_batch, std::min(last_ / 2, bracket.high - 1));
          return last_;
        }
        stage_ = Stage::kDoubling;
        [[fallthrough]];
      case Stage::kDoubling:
        if (bracket.low < trials.cap &&
            trials.fails.upper_bound(bracket.low) == trials.fails.end()) {
          return std::min(bracket.low * 2, trials.cap);
        }
        stage_ = Stage::kBisect;
        [[fallthrough]];
      case Stage::kBisect:
        if (!bisect_ || bracket.closed) return 0;
        return bracket.low + (bracket.high - bracket.low) / 2;
      case Stage::kSafe:
        return safeNext(bracket);
    }
    return 0;
  }

  void noteOutcome(bool fit, const Bracket& /*before*/, const Bracket& /*after*/) override {
    last_fit_ = fit;
  }

 private:
  /// Stages of the maximum's search, in order; kSafe serves the safe goal alone.
  enum class Stage { kStart, kHalving, kDoubling, kBisect, kSafe };

  std::int64_t safeNext(const Bracket& bracket) const {
    if (bracket.closed) return 0;
    if (bisect_) return bracket.low + (bracket.high - bracket.low) / 2;
    // The powers below the maximum were all tried; only halve when none was safe.
    if (bracket.low > 0) return 0;
    return std::max(options_.min_batch, bracket.high / 2);
  }

  const SearchOptions& options_;
  const bool bisect_;
  Stage stage_;
  std::int64_t last_ = 0;  // the batch of the last halving step
  bool last_fit_ = false;  // the outcome of the last batch given
};

}  // namespace

std::unique_ptr<SearchStrategy> makeDoublingStrategy(const SearchOptions& options, SearchGoal goal,
                                                     bool bisect) {
  return std::make_unique<DoublingStrategy>(options, goal, bisect);
}

}  // namespace autobatch::detail
