// A fake of the CUDA calls (src/memory/cuda_api.h) that behaves as LibTorch 2.11 does, shared by
// the CUDA backend's tests (tests/memory/cuda_backend_test.cpp) and the scenario table that the C++
// backend and the Python package's CudaApi both replay (tests/fixtures/cuda_meter_scenarios.json;
// its Python twin is tests/python/helpers/fake_cuda.py): the caching allocator's fraction is of
// totalGlobalMem and refuses a segment that would take reserved bytes past it; cuBLAS keeps a 32
// MiB workspace per handle inside the allocator until clearCublasWorkspaces(); the outside part
// (context, kernel modules, handles) grows at the first kernel of each kind; expandable segments
// map 20 MiB pages; a per_process_memory_fraction in the configuration is the allocator's fraction
// from its start; a sticky device error makes every later device call throw it again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>

#include "memory/cuda_api.h"

// GCC 12 at -O2 warns that a copied std::optional<std::string> "may be used uninitialized" (a
// known false positive, GCC bug 80635) when the fake returns its CudaAllocatorFacts.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace autobatch::detail::fakes {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr std::int64_t kPage = 20 * kMiB;
constexpr std::int64_t kWorkspace = 32 * kMiB;  // cuBLAS workspace on sm_90
inline const char* const kStickyError =
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n";

/// The device and its caching allocator, shared by the fake API (owned by the backend) and the
/// test (which plays the trial runner's part: model tensors, steps, kernels).
struct FakeDevice {
  std::int64_t total_global = 150 * kGiB;
  // MIG slices and some drivers report another total in cudaMemGetInfo: the fraction must not
  // be taken of it.
  std::int64_t meminfo_total = 150 * kGiB - 768 * kMiB;
  std::int64_t context = 0;  // outside the allocator: CUDA context, modules, handles
  std::int64_t context_at_init = 500 * kMiB;  // the CUDA context, made with the first tensor
  std::int64_t other_processes = 0;           // outside too
  std::int64_t allocated = 0;                 // tensors alive
  std::int64_t cached = 0;                    // reserved but free (the allocator's cache)
  std::int64_t workspace = 0;  // the cuBLAS workspace (allocated, held until cleared)
  std::int64_t allocated_peak = 0;
  std::int64_t reserved_peak = 0;
  // Of `cached`, the free remainders of split blocks (inactive split: only a request that fits
  // a remainder can use them), and their peak; the allocator's retries after a refusal.
  std::int64_t inactive_split = 0;
  std::int64_t inactive_split_peak = 0;
  std::int64_t retries = 0;
  double fraction = 1.0;
  int set_fraction_calls = 0;
  int sync_calls = 0;
  bool initialised = false;
  bool expandable = false;
  bool sticky = false;
  int calls_after_sticky = 0;
  std::set<std::string> kernels_seen;
  CudaAllocatorFacts facts;

  std::int64_t reserved() const { return allocated + workspace + cached; }
  std::int64_t used() const { return context + other_processes + reserved(); }
  void touch() {
    if (sticky) {
      ++calls_after_sticky;
      throw std::runtime_error(kStickyError);
    }
  }
  void updatePeaks() {
    allocated_peak = std::max(allocated_peak, allocated + workspace);
    reserved_peak = std::max(reserved_peak, reserved());
    inactive_split_peak = std::max(inactive_split_peak, inactive_split);
  }
  /// A tensor of `bytes`: from the cache when it holds enough, else a new segment, refused (as
  /// c10::OutOfMemoryError would be) when reserved would pass fraction x totalGlobalMem. With
  /// expandable segments the check is made on the request and whole 20 MiB pages are mapped, so
  /// reserved can pass the cap by less than a page.
  /// The cache's split remainders serve no request here (they are smaller than any the tests
  /// make). Refused, the allocator first frees its unsplit cached blocks and tries again, as
  /// c10's caching allocator does (num_alloc_retries counts those tries).
  void allocate(std::int64_t bytes) {
    if (!initialised) throw std::logic_error("allocator used before init");
    std::int64_t usable = cached - inactive_split;
    if (usable >= bytes) {
      cached -= bytes;
    } else {
      std::int64_t need = bytes - usable;
      const auto cap = static_cast<std::int64_t>(fraction * static_cast<double>(total_global));
      if (fraction < 1.0 && reserved() + need > cap && usable > 0) {
        ++retries;
        cached -= usable;  // the unsplit cached blocks go back to the device
        usable = 0;
        need = bytes;
      }
      if (fraction < 1.0 && reserved() + need > cap) {
        throw std::runtime_error("CUDA out of memory. Tried to allocate " + std::to_string(bytes) +
                                 " bytes");
      }
      const std::int64_t mapped = expandable ? (need + kPage - 1) / kPage * kPage : need;
      cached += mapped - need - usable;  // the pages beyond the request stay cached
      cached = std::max<std::int64_t>(cached, inactive_split);
    }
    allocated += bytes;
    updatePeaks();
  }
  /// A request of `bytes` served by splitting a cached block of `block` bytes: the remainder
  /// stays cached, inactive and split.
  void split(std::int64_t bytes, std::int64_t block) {
    if (cached - inactive_split < block || block < bytes) throw std::logic_error("no such block");
    cached -= bytes;
    allocated += bytes;
    inactive_split += block - bytes;
    updatePeaks();
  }
  /// The split allocation freed: its block is whole again (and cached).
  void releaseSplit(std::int64_t bytes, std::int64_t block) {
    allocated -= bytes;
    cached += bytes;
    inactive_split -= block - bytes;
  }
  void release(std::int64_t bytes) {
    allocated -= bytes;
    cached += bytes;
  }
  /// A trial that allocates `request` bytes at a time until the allocator refuses: returns the
  /// bytes it held, and the device's largest usage on the way in `worst_used`.
  std::int64_t fillUntilOutOfMemory(std::int64_t request, std::int64_t& worst_used) {
    std::int64_t held = 0;
    try {
      for (;;) {
        allocate(request);
        held += request;
        worst_used = std::max(worst_used, used());
      }
    } catch (const std::runtime_error&) {  // the allocator's OOM ends the trial
    }
    return held;
  }
  /// The first kernel of a kind loads its module and handles outside the allocator; a matmul also
  /// creates the cuBLAS workspace inside it.
  void kernel(const std::string& kind, std::int64_t module_bytes) {
    if (kernels_seen.insert(kind).second) context += module_bytes;
    if (kind == "matmul" && workspace == 0) {
      workspace = kWorkspace;
      updatePeaks();
    }
  }
};

class FakeCudaApi final : public CudaApi {
 public:
  explicit FakeCudaApi(FakeDevice& d) : d_(d) {}
  int deviceCount() override { return 1; }
  std::int64_t totalGlobalMemBytes(int /*index*/) override { return d_.total_global; }
  CudaMemInfo memInfo(int /*index*/) override {
    d_.touch();
    return {d_.meminfo_total - d_.used(), d_.meminfo_total};
  }
  void initAllocator(int /*index*/) override {
    if (!d_.initialised) d_.context += d_.context_at_init;
    d_.initialised = true;
  }
  CudaAllocatorFacts allocatorFacts() override {
    d_.expandable = d_.facts.expandable_segments;
    if (d_.facts.config_fraction < 1.0) d_.fraction = d_.facts.config_fraction;
    return d_.facts;
  }
  CudaAllocatorStats stats(int /*index*/) override {
    if (!d_.initialised) throw std::logic_error("did you call init?");
    return {d_.allocated + d_.workspace,
            d_.allocated_peak,
            d_.reserved(),
            d_.reserved_peak,
            d_.retries,
            d_.inactive_split,
            d_.inactive_split_peak};
  }
  void resetPeakStats(int /*index*/) override {
    d_.allocated_peak = d_.allocated + d_.workspace;
    d_.reserved_peak = d_.reserved();
    d_.inactive_split_peak = d_.inactive_split;
  }
  double memoryFraction(int /*index*/) override { return d_.fraction; }
  void setMemoryFraction(double fraction, int /*index*/) override {
    d_.touch();
    if (fraction < 0.0 || fraction > 1.0) throw std::runtime_error("invalid fraction");
    d_.fraction = fraction;
    ++d_.set_fraction_calls;
  }
  void emptyCache() override {  // split blocks stay: only whole cached blocks are released
    d_.touch();
    d_.cached = d_.inactive_split;
  }
  void clearCublasWorkspaces() override {
    d_.touch();
    d_.workspace = 0;
  }
  void synchronize(int /*index*/) override {
    d_.touch();
    ++d_.sync_calls;
  }

 private:
  FakeDevice& d_;
};

}  // namespace autobatch::detail::fakes
