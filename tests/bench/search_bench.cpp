// search_bench: trials per strategy over random affine memory models (2 MiB allocator rounding,
// non-negative per-sample noise), with an exactness check of every answer. Results and the
// command line: docs/search.md. Usage: search_bench [models] [seed]
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "../fake_probe.h"
#include "autobatch/search.h"

namespace {

using autobatch::testing::MemoryModel;

struct Tally {
  long long total = 0;
  long long worst = 0;
  long long wrong = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const int models = argc > 1 ? std::atoi(argv[1]) : 2000;
  const auto seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1ULL;
  const std::array<autobatch::Strategy, 3> strategies{
      autobatch::Strategy::kGuided, autobatch::Strategy::kBinsearch, autobatch::Strategy::kPower};
  for (const double margin_fraction : {-1.0, 0.05}) {
    std::mt19937_64 rng(seed);
    std::array<Tally, 3> tally{};
    for (int i = 0; i < models; ++i) {
      const MemoryModel model = autobatch::testing::randomModel(rng, 16.0, 8192.0);
      const std::int64_t threshold = model.threshold();
      for (std::size_t s = 0; s < 3; ++s) {
        autobatch::SearchOptions options;
        options.strategy = strategies[s];
        if (margin_fraction < 0) {
          options.margin_bytes = 0;
        } else {
          options.margin_fraction = margin_fraction;
        }
        const auto result = autobatch::findMaxBatch(autobatch::testing::probeFor(model), options);
        const std::int64_t expected = strategies[s] == autobatch::Strategy::kPower
                                          ? autobatch::testing::largestPowerOfTwoAtMost(threshold)
                                          : threshold;
        const auto n = static_cast<long long>(result.trials.size());
        tally[s].total += n;
        tally[s].worst = std::max(tally[s].worst, n);
        if (result.max_micro_batch != expected) ++tally[s].wrong;
      }
    }
    std::printf(
        "%d random models (thresholds log-uniform in [16, 8192], 2 MiB rounding, "
        "per-sample noise <= 10%%), %s:\n",
        models,
        margin_fraction < 0 ? "margin 0 (maximum only)" : "margin 5% (maximum and safe batch)");
    std::printf("  %-10s %10s %6s %14s\n", "strategy", "mean", "max", "wrong answers");
    for (std::size_t s = 0; s < 3; ++s) {
      std::printf("  %-10s %10.2f %6lld %14lld\n",
                  std::string(autobatch::toString(strategies[s])).c_str(),
                  static_cast<double>(tally[s].total) / models, tally[s].worst, tally[s].wrong);
    }
  }
  return 0;
}
