// Fake probes for the search tests and the search benchmark: memory models, no LibTorch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "autobatch/trial.h"

namespace autobatch::testing {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

/// peak(B) = round_up(fixed + per_sample * B + noise(B), rounding), monotone in B: noise(B) is a
/// running sum of non-negative per-sample extras. A trial fits when peak(B) <= limit.
struct MemoryModel {
  std::int64_t limit_bytes = 16 * kGiB;
  std::int64_t fixed_bytes = kGiB;
  std::int64_t per_sample_bytes = 8 * kMiB;
  /// Allocator rounding (2 MiB for CUDA segments); 1 means none.
  std::int64_t rounding_bytes = 1;
  /// noise_prefix[B] = noise(B); beyond its end noise grows by noise_max_step per sample.
  std::vector<std::int64_t> noise_prefix;
  std::int64_t noise_max_step = 0;
  /// Extra bytes of a step with 2 micro-batches (gradients alive during the second forward).
  std::int64_t accumulation_extra_bytes = 0;

  std::int64_t noise(std::int64_t batch) const {
    if (noise_prefix.empty()) return 0;
    const auto last = static_cast<std::int64_t>(noise_prefix.size()) - 1;
    if (batch <= last) return noise_prefix[static_cast<std::size_t>(batch)];
    return noise_prefix.back() + (batch - last) * noise_max_step;
  }

  std::int64_t peak(std::int64_t batch, int micro_batches_per_step = 1) const {
    std::int64_t bytes = fixed_bytes + per_sample_bytes * batch + noise(batch);
    if (micro_batches_per_step >= 2) bytes += accumulation_extra_bytes;
    return (bytes + rounding_bytes - 1) / rounding_bytes * rounding_bytes;
  }

  /// The largest batch that fits with one micro-batch, by a linear scan (the definition).
  std::int64_t threshold() const {
    std::int64_t b = 0;
    while (peak(b + 1) <= limit_bytes) ++b;
    return b;
  }

  /// The trial's result under this model: fits, or out-of-memory with the peak before the failed
  /// allocation and its size (together exactly the need).
  TrialResult run(const TrialRequest& request) const {
    TrialResult r;
    r.request = request;
    r.memory_limit_bytes = limit_bytes;
    const std::int64_t need = peak(request.micro_batch_size, request.micro_batches_per_step);
    r.steps_completed = 2;
    if (need <= limit_bytes) {
      r.peak_bytes = r.peak_allocated_bytes = r.peak_reserved_bytes = need;
      r.step_ms = 1.0 + 0.01 * static_cast<double>(request.micro_batch_size);
      return r;
    }
    r.outcome = TrialOutcome::kOutOfMemory;
    r.reason = "CUDA out of memory (fake)";
    r.peak_bytes = r.peak_allocated_bytes = r.peak_reserved_bytes =
        std::min(limit_bytes, fixed_bytes);
    r.failed_request_bytes = need - r.peak_bytes;
    r.steps_completed = 0;
    return r;
  }
};

/// A model whose threshold is exactly `threshold` (no rounding, no noise).
inline MemoryModel modelWithThreshold(std::int64_t threshold) {
  MemoryModel m;
  m.fixed_bytes = kGiB;
  m.per_sample_bytes = kMiB;
  m.limit_bytes = m.fixed_bytes + m.per_sample_bytes * threshold + m.per_sample_bytes / 2;
  return m;
}

/// A random affine model with 2 MiB rounding and non-negative per-sample noise of up to
/// noise_fraction x per_sample; thresholds log-uniform in [min_threshold, max_threshold].
inline MemoryModel randomModel(std::mt19937_64& rng, double min_threshold, double max_threshold,
                               double noise_fraction = 0.1) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  MemoryModel m;
  m.limit_bytes = static_cast<std::int64_t>((8.0 + 72.0 * unit(rng)) * static_cast<double>(kGiB));
  m.fixed_bytes =
      static_cast<std::int64_t>((0.02 + 0.68 * unit(rng)) * static_cast<double>(m.limit_bytes));
  const double target = std::exp(std::log(min_threshold) +
                                 unit(rng) * (std::log(max_threshold) - std::log(min_threshold)));
  m.per_sample_bytes = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(static_cast<double>(m.limit_bytes - m.fixed_bytes) / target));
  m.rounding_bytes = 2 * kMiB;
  m.noise_max_step =
      static_cast<std::int64_t>(noise_fraction * static_cast<double>(m.per_sample_bytes));
  const auto size = static_cast<std::size_t>(4.0 * target) + 64;
  m.noise_prefix.assign(size, 0);
  for (std::size_t b = 1; b < size; ++b) {
    m.noise_prefix[b] =
        m.noise_prefix[b - 1] +
        static_cast<std::int64_t>(unit(rng) * static_cast<double>(m.noise_max_step));
  }
  m.accumulation_extra_bytes = m.fixed_bytes / 8;
  return m;
}

/// A probe over `model` (the model must outlive the probe).
inline Probe probeFor(const MemoryModel& model) {
  return [&model](const TrialRequest& request) { return model.run(request); };
}

/// The largest power of two <= n (n >= 1).
inline std::int64_t largestPowerOfTwoAtMost(std::int64_t n) {
  std::int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace autobatch::testing
