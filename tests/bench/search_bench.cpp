// search_bench: trials per strategy on simulated memory curves, with an exactness check of every
// answer. Families (tests/support/fake_probe.h): today's affine curve (2 MiB rounding, per-sample
// noise), and issue 17's max-of-phases curves: (a) the optimizer step binds, (b) activations bind
// with the crossing far below B*, (c) the crossing between B*/8 and B*; each without rounding (the
// CPU budget allocator), with 2 MiB blocks and with 20 MiB expandable-segment pages; (e) drift
// (every failed trial lowers the limit by 0-2%); (f) one non-monotone step. Prints, per family and
// strategy, mean and max trials, the longest run of consecutive failures and the wrong answers.
// Results and the command line: docs/search.md. Usage: search_bench [models] [seed]
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autobatch/search/search.h"
#include "support/fake_probe.h"

namespace {

using autobatch::SearchOptions;
using autobatch::SearchResult;
using autobatch::Strategy;
using autobatch::TrialOutcome;
using autobatch::testing::CurveFamily;
using autobatch::testing::kMiB;
using autobatch::testing::PhasedModel;

constexpr std::array<Strategy, 3> kStrategies{Strategy::kGuided, Strategy::kBinsearch,
                                              Strategy::kPower};

struct Tally {
  long long total = 0;
  long long worst = 0;
  long long longest_failure_run = 0;
  long long wrong = 0;
};

long long longestFailureRun(const SearchResult& r) {
  long long run = 0;
  long long longest = 0;
  for (const auto& t : r.trials) {
    run = t.outcome == TrialOutcome::kFits ? 0 : run + 1;
    longest = std::max(longest, run);
  }
  return longest;
}

// The largest batch seen to fit in the search's own mode (the answer for a non-monotone curve).
std::int64_t largestSeenToFit(const SearchResult& r) {
  std::int64_t best = 0;
  for (const auto& t : r.trials) {
    if (t.outcome == TrialOutcome::kFits && t.request.micro_batches_per_step == 1) {
      best = std::max(best, t.request.micro_batch_size);
    }
  }
  return best;
}

struct Family {
  std::string name;
  // Makes the i-th model of the family (from the shared generator).
  std::function<PhasedModel(std::mt19937_64&)> make;
  bool monotone = true;
};

// The affine family as a one-phase model, so that every family runs through one code path.
PhasedModel affine(std::mt19937_64& rng) {
  const auto m = autobatch::testing::randomModel(rng, 16.0, 8192.0);
  PhasedModel p;
  p.limit_bytes = m.limit_bytes;
  p.phases = {{"backward", m.fixed_bytes, m.per_sample_bytes, true}};
  p.page_bytes = m.rounding_bytes;
  p.noise_prefix = m.noise_prefix;
  p.noise_max_step = m.noise_max_step;
  return p;
}

std::vector<Family> families() {
  std::vector<Family> out;
  out.push_back({"affine", affine});
  const std::array<std::pair<const char*, CurveFamily>, 3> kinds{
      {{"(a) step-bound", CurveFamily::kStepBound},
       {"(b) activation-bound", CurveFamily::kActivationBound},
       {"(c) crossing B*/8..B*", CurveFamily::kCrossingBelow}}};
  const std::array<std::pair<const char*, std::pair<std::int64_t, std::int64_t>>, 3> roundings{
      {{"", {1, 1}}, {", 2 MiB blocks", {2 * kMiB, 1}}, {", 20 MiB pages", {1, 20 * kMiB}}}};
  for (const auto& [rounding_name, rounding] : roundings) {
    for (const auto& [kind_name, kind] : kinds) {
      // Plain copies: clang 14 (the sanitizer job) cannot capture structured bindings.
      const std::int64_t block = rounding.first;
      const std::int64_t page = rounding.second;
      const CurveFamily family = kind;
      out.push_back({std::string(kind_name) + rounding_name, [=](std::mt19937_64& rng) {
                       return autobatch::testing::randomPhasedModel(rng, family, 16.0, 8192.0,
                                                                    block, page);
                     }});
    }
  }
  out.push_back({"(e) drift 0-2%, (c), 2 MiB", [](std::mt19937_64& rng) {
                   auto m = autobatch::testing::randomPhasedModel(rng, CurveFamily::kCrossingBelow,
                                                                  16.0, 8192.0, 2 * kMiB, 1);
                   m.drift = 0.02;
                   m.drift_seed = rng();
                   return m;
                 }});
  out.push_back({"(f) non-monotone step, (c)",
                 [](std::mt19937_64& rng) {
                   auto m = autobatch::testing::randomPhasedModel(rng, CurveFamily::kCrossingBelow,
                                                                  16.0, 8192.0);
                   const std::int64_t t = m.threshold();
                   std::uniform_real_distribution<double> unit(0.2, 0.9);
                   m.bump_from = std::max<std::int64_t>(
                       2, static_cast<std::int64_t>(unit(rng) * static_cast<double>(t)));
                   m.bump_width = std::max<std::int64_t>(1, t / 20);
                   m.bump_bytes = m.limit_bytes;
                   return m;
                 },
                 false});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int models = argc > 1 ? std::atoi(argv[1]) : 2000;
  const auto seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1ULL;
  const auto all = families();
  std::printf(
      "%d models per family, thresholds log-uniform in [16, 8192], seed %llu; trials: mean / max, "
      "longest run of consecutive failures, wrong answers\n",
      models, seed);
  for (const double margin_fraction : {-1.0, 0.05}) {
    std::printf("\n%s\n", margin_fraction < 0 ? "margin 0 (maximum only):"
                                              : "margin 5% (maximum and safe batch):");
    std::printf("  %-30s", "family");
    for (const Strategy s : kStrategies) {
      std::printf(" | %-9s %6s %4s %4s %5s", std::string(autobatch::toString(s)).c_str(), "mean",
                  "max", "run", "wrong");
    }
    std::printf("\n");
    for (const auto& family : all) {
      std::mt19937_64 rng(seed);
      std::array<Tally, 3> tally{};
      for (int i = 0; i < models; ++i) {
        const PhasedModel original = family.make(rng);
        for (std::size_t s = 0; s < kStrategies.size(); ++s) {
          PhasedModel model = original;  // drift changes it
          SearchOptions options;
          options.strategy = kStrategies[s];
          if (margin_fraction < 0) {
            options.margin_bytes = 0;
          } else {
            options.margin_fraction = margin_fraction;
          }
          const SearchResult r =
              autobatch::findMaxBatch(autobatch::testing::probeFor(model), options);
          // Answers at the limit in force when the search ended (drift lowers it).
          const std::int64_t threshold = model.threshold();
          std::int64_t expected = threshold;
          if (!family.monotone) {
            expected = largestSeenToFit(r);
          } else if (kStrategies[s] == Strategy::kPower) {
            expected = autobatch::testing::largestPowerOfTwoAtMost(threshold);
          }
          bool wrong = r.max_micro_batch != expected;
          if (family.monotone && kStrategies[s] != Strategy::kPower && margin_fraction > 0) {
            wrong =
                wrong || r.safe_micro_batch != model.threshold(model.limit_bytes - r.margin_bytes);
          }
          const auto n = static_cast<long long>(r.trials.size());
          tally[s].total += n;
          tally[s].worst = std::max(tally[s].worst, n);
          tally[s].longest_failure_run =
              std::max(tally[s].longest_failure_run, longestFailureRun(r));
          if (wrong) ++tally[s].wrong;
        }
      }
      std::printf("  %-30s", family.name.c_str());
      for (std::size_t s = 0; s < kStrategies.size(); ++s) {
        std::printf(" | %-9s %6.2f %4lld %4lld %5lld", "",
                    static_cast<double>(tally[s].total) / models, tally[s].worst,
                    tally[s].longest_failure_run, tally[s].wrong);
      }
      std::printf("\n");
    }
  }
  return 0;
}
