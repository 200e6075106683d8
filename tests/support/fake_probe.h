// Fake probes for the search tests and the search benchmark: memory models, no LibTorch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/trial.h"

namespace autobatch::testing {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

/// noise(B) of a running-sum noise table: prefix[B], and beyond its end the last value plus
/// max_step per sample (the models below share it).
inline std::int64_t noiseAt(const std::vector<std::int64_t>& prefix, std::int64_t max_step,
                            std::int64_t batch) {
  if (prefix.empty()) return 0;
  const auto last = static_cast<std::int64_t>(prefix.size()) - 1;
  if (batch <= last) return prefix[static_cast<std::size_t>(batch)];
  return prefix.back() + (batch - last) * max_step;
}

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
    return noiseAt(noise_prefix, noise_max_step, batch);
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

/// One phase of a training step, affine in the micro-batch: fixed + per_sample * B (+ the
/// model's noise when `noisy`).
struct FakePhase {
  const char* name = "backward";
  std::int64_t fixed_bytes = 0;
  std::int64_t per_sample_bytes = 0;
  bool noisy = false;
};

/// The real shape of a training step's memory (issue 17): each phase is affine on its own, the
/// peak is the largest of them (a phase listed twice is the larger of its two lines). Phases run in
/// order; a trial fails in the first phase whose need is over the limit, after allocating what fits
/// of that phase in `chunks` equal pieces (layers), and reports the bytes in use then plus the
/// refused piece (a lower bound on the phase's need), as the CPU budget allocator and the CUDA
/// caching allocator do.
struct PhasedModel {
  std::int64_t limit_bytes = 16 * kGiB;
  std::vector<FakePhase> phases;
  /// Rounding of each phase's allocated peak (2 MiB: the caching allocator's large blocks); 1:
  /// none.
  std::int64_t block_bytes = 1;
  /// Rounding of the reserved figure (peak_bytes) only (20 MiB: expandable-segment pages); 1: none.
  std::int64_t page_bytes = 1;
  /// Non-negative per-sample extras of noisy phases, as in MemoryModel (monotone).
  std::vector<std::int64_t> noise_prefix;
  std::int64_t noise_max_step = 0;
  /// Extra bytes of every phase of the second micro-batch but the optimizer step (gradients alive).
  std::int64_t accumulation_extra_bytes = 0;
  int chunks = 8;
  /// (e) drift: every failed trial lowers the limit by a random fraction in [0, drift), and the
  /// failed trial reports the lowered limit (the limit in force after it).
  double drift = 0.0;
  std::uint64_t drift_seed = 1;
  /// (f) one non-monotone step: batches in [bump_from, bump_from + bump_width) need bump_bytes
  /// more.
  std::int64_t bump_from = 0;
  std::int64_t bump_width = 0;
  std::int64_t bump_bytes = 0;

  std::int64_t noise(std::int64_t batch) const {
    return noiseAt(noise_prefix, noise_max_step, batch);
  }
  static std::int64_t roundUp(std::int64_t bytes, std::int64_t unit) {
    return (bytes + unit - 1) / unit * unit;
  }
  /// Allocated bytes of phase `p` of micro-batch `micro` at `batch`, before block rounding.
  std::int64_t need(const FakePhase& p, std::int64_t batch, int micro) const {
    std::int64_t bytes = p.fixed_bytes + p.per_sample_bytes * batch;
    if (p.noisy) bytes += noise(batch);
    if (micro >= 1 && std::string_view(p.name) != "optimizer-step") {
      bytes += accumulation_extra_bytes;
    }
    if (batch >= bump_from && batch < bump_from + bump_width) bytes += bump_bytes;
    return bytes;
  }
  /// What is compared with the limit for phase `p`: the reserved figure.
  std::int64_t reserved(const FakePhase& p, std::int64_t batch, int micro) const {
    return roundUp(roundUp(need(p, batch, micro), block_bytes), page_bytes);
  }
  bool fits(std::int64_t batch, std::int64_t limit, int micro_batches = 1) const {
    for (int micro = 0; micro < micro_batches; ++micro) {
      for (const auto& p : phases) {
        if (reserved(p, batch, micro) > limit) return false;
      }
    }
    return true;
  }
  /// The largest batch that fits at `limit` with every smaller one fitting too (the definition
  /// for monotone models), by a linear scan.
  std::int64_t threshold(std::int64_t limit) const {
    std::int64_t b = 0;
    while (fits(b + 1, limit)) ++b;
    return b;
  }
  std::int64_t threshold() const { return threshold(limit_bytes); }

  TrialResult run(const TrialRequest& request) {
    TrialResult r;
    r.request = request;
    r.memory_limit_bytes = limit_bytes;
    const std::int64_t batch = request.micro_batch_size;
    std::int64_t top = 0;  // allocated
    std::int64_t reserved_top = 0;
    for (int micro = 0; micro < request.micro_batches_per_step; ++micro) {
      for (const auto& p : phases) {
        const bool step = std::string_view(p.name) == "optimizer-step";
        if (step && micro + 1 < request.micro_batches_per_step) continue;
        if (reserved(p, batch, micro) > limit_bytes) {
          const std::int64_t whole = need(p, batch, micro);
          const std::int64_t base = std::min(p.fixed_bytes, whole);
          const std::int64_t piece = std::max<std::int64_t>(1, (whole - base) / chunks);
          std::int64_t in_use = 0;
          if (roundUp(roundUp(base, block_bytes), page_bytes) <= limit_bytes) {
            in_use = base;
            while (in_use + piece < whole &&
                   roundUp(roundUp(in_use + piece, block_bytes), page_bytes) <= limit_bytes) {
              in_use += piece;
            }
          }
          r.outcome = TrialOutcome::kOutOfMemory;
          r.reason = "CUDA out of memory (fake)";
          r.failed_phase = p.name;
          r.failed_micro_batch_index = step ? 0 : micro;
          r.failed_in_use_bytes = in_use;
          r.failed_request_bytes = in_use == 0 ? base : std::min(piece, whole - in_use);
          r.peak_allocated_bytes = std::max(top, in_use);
          r.peak_reserved_bytes = r.peak_bytes =
              std::max(reserved_top, roundUp(roundUp(in_use, block_bytes), page_bytes));
          if (drift > 0.0) {
            std::mt19937_64 rng(drift_seed++);
            std::uniform_real_distribution<double> unit(0.0, drift);
            limit_bytes -= static_cast<std::int64_t>(unit(rng) * static_cast<double>(limit_bytes));
            r.memory_limit_bytes = limit_bytes;
          }
          return r;
        }
        const std::int64_t allocated = roundUp(need(p, batch, micro), block_bytes);
        r.phase_peaks.push_back({p.name, step ? 0 : micro, allocated});
        top = std::max(top, allocated);
        reserved_top = std::max(reserved_top, reserved(p, batch, micro));
      }
    }
    r.steps_completed = 2;
    r.peak_allocated_bytes = top;
    r.peak_reserved_bytes = r.peak_bytes = reserved_top;
    r.step_ms = 1.0 + 0.01 * static_cast<double>(batch);
    return r;
  }
};

/// The families of simulated curves of issue 17 (tests/bench/search_bench.cpp prints them).
enum class CurveFamily {
  kStepBound,        ///< (a) the optimizer step binds: activations cross it above B* (1.5-8x)
  kActivationBound,  ///< (b) activations bind; the crossing is far below B* (B*/1024-B*/64)
  kCrossingBelow,    ///< (c) the crossing lies between B*/8 and B*
};

/// A random phased model of `family` with a threshold log-uniform in [min_threshold,
/// max_threshold]: forward (F_f + a_f B) below backward (F_b + a B), and the optimizer step
/// (S + s B, s the inputs kept alive: 0.1-2% of a), per-sample noise up to noise_fraction x a
/// on forward and backward. block_bytes / page_bytes: (d)'s rounding.
inline PhasedModel randomPhasedModel(std::mt19937_64& rng, CurveFamily family, double min_threshold,
                                     double max_threshold, std::int64_t block_bytes = 1,
                                     std::int64_t page_bytes = 1, double noise_fraction = 0.1) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  auto log_between = [&](double lo, double hi) {
    return std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo)));
  };
  PhasedModel m;
  const double limit = between(8.0, 80.0) * static_cast<double>(kGiB);
  m.limit_bytes = static_cast<std::int64_t>(limit);
  const double target = log_between(min_threshold, max_threshold);
  double fixed_b = 0;
  double a = 0;
  double s = 0;
  double fixed_s = 0;
  if (family == CurveFamily::kStepBound) {
    const double crossing = target * log_between(1.5, 8.0);
    fixed_s = limit * between(0.3, 0.8);
    s = (limit - fixed_s) / target;
    fixed_b = fixed_s * between(0.2, 0.9);
    a = s + (fixed_s - fixed_b) / crossing;
  } else {
    const double crossing = family == CurveFamily::kActivationBound
                                ? target / log_between(64.0, 1024.0)
                                : target / log_between(1.0, 8.0);
    fixed_b = limit * between(0.02, 0.5);
    a = (limit - fixed_b) / target;
    s = a * between(0.001, 0.02);
    fixed_s = fixed_b + (a - s) * crossing;
  }
  const double fixed_f = fixed_b * between(0.5, 0.9);
  const double a_f = a * between(0.3, 0.8);
  auto bytes = [](double v) { return std::max<std::int64_t>(1, static_cast<std::int64_t>(v)); };
  m.phases = {{"forward", bytes(fixed_f), bytes(a_f), true},
              {"backward", bytes(fixed_b), bytes(a), true},
              {"optimizer-step", bytes(fixed_s), bytes(s), false}};
  m.block_bytes = block_bytes;
  m.page_bytes = page_bytes;
  m.noise_max_step = static_cast<std::int64_t>(noise_fraction * a);
  const auto size = static_cast<std::size_t>(4.0 * target) + 64;
  m.noise_prefix.assign(size, 0);
  for (std::size_t b = 1; b < size; ++b) {
    m.noise_prefix[b] =
        m.noise_prefix[b - 1] +
        static_cast<std::int64_t>(unit(rng) * static_cast<double>(m.noise_max_step));
  }
  m.accumulation_extra_bytes = bytes(fixed_b / 8);
  return m;
}

/// mlp_8x2048 (scripts/export_models.py) with AdamW (loop), 2 steps per trial, under the CPU
/// budget allocator at --memory-limit 1GiB: every figure below is a peak the real trials measured
/// (2026-11-30, `autobatch --model models/mlp_8x2048.pt --memory-limit 1GiB --margin 0 --json`,
/// batches 1, 2, 7072 and 7258), B* = 7258. Backward is the largest of two lines: at small batches
/// it peaks at its end, when the eight weight gradients are allocated (537 MB + 24.6 KB per
/// sample); at large ones early, when the activations dominate (419.6 MB + 90.1 KB per sample,
/// forward's slope). The optimizer step sets the peak up to about batch 2000.
inline PhasedModel mlp8x2048AdamWAt1GiB() {
  PhasedModel m;
  m.limit_bytes = kGiB;
  m.phases = {{"inputs", 402849792, 24576, false},   {"forward", 402849792, 90112, false},
              {"loss", 402849808, 73728, false},     {"backward", 537133064, 24576, false},
              {"backward", 419635208, 90112, false}, {"optimizer-step", 570687500, 16384, false}};
  return m;
}

/// A replica of issue 28 item 7's CIFAR-style VGG (3x32x32, AdamW) at 700 MiB, B* = 1366: the
/// optimizer step (230 MB) sets the peak at batches 1 and 3, so the second probe is 3; backward is
/// the larger of its end-of-backward line (every weight gradient held, flat) and its activation
/// line (0.387 MB per sample, 1.29x forward's 0.3 MB), which crosses it near batch 26. The secant
/// from 1 to 3 reads forward's slope and predicts 1735 (far jump 1648, out of memory); a refused
/// backward piece of a twelfth of its activations (chunks 12) is a weak bound, just above the
/// limit. Its guided walk before item 7 was the measured one in shape: 1, 3, 1648x,
/// 1639x, 70, 854, 1366, 1367x (the issue: 1, 3, 1648x, 1572x, 69, 820, 1366, 1367x).
inline PhasedModel vggCifarAt700MiB() {
  PhasedModel m;
  m.limit_bytes = 700 * kMiB;
  const std::int64_t end_peak_at_3 = m.limit_bytes - 519750000;  // forward's slope: 1732.5 more
  const std::int64_t activations_fixed = 204000000;
  const std::int64_t inputs_per_sample = 12288;  // the inputs kept alive: 3x32x32 float32
  const std::int64_t per_sample = (m.limit_bytes - activations_fixed) * 2 / 2733;  // B* 1366
  m.phases = {{"inputs", 150000000, inputs_per_sample, false},
              {"forward", 160000000, 300000, false},
              {"loss", 150000000, 20000, false},
              {"backward", end_peak_at_3 - 3 * inputs_per_sample, inputs_per_sample, false},
              {"backward", activations_fixed, per_sample, false},
              {"optimizer-step", 230000000, inputs_per_sample, false}};
  m.chunks = 12;
  return m;
}

/// A probe over a phased model (the model must outlive the probe; drift changes it).
inline Probe probeFor(PhasedModel& model) {
  return [&model](const TrialRequest& request) { return model.run(request); };
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
