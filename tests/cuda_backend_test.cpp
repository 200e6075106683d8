// The CUDA memory backend's logic (src/cuda_backend.cpp) on the CPU, against a fake of the CUDA
// calls that behaves as LibTorch 2.11 does: the caching allocator's fraction is of totalGlobalMem
// and refuses a segment that would take reserved bytes past it; cuBLAS keeps a 32 MiB workspace
// per handle inside the allocator until clearCublasWorkspaces(); the outside part (context, kernel
// modules, handles) grows at the first kernel of each kind; expandable segments map 20 MiB pages;
// a sticky device error makes every later device call throw it again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

#include "autobatch/error.h"
#include "cuda_api.h"
#include "memory_backend.h"

// GCC 12 at -O2 warns that a copied std::optional<std::string> "may be used uninitialized" (a
// known false positive, GCC bug 80635) when the fake returns its CudaAllocatorFacts.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace autobatch::detail {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr std::int64_t kPage = 20 * kMiB;
constexpr std::int64_t kWorkspace = 32 * kMiB;  // cuBLAS workspace on sm_90
const char* const kStickyError =
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
  std::int64_t context = 0;          // outside the allocator: CUDA context, modules, handles
  std::int64_t other_processes = 0;  // outside too
  std::int64_t allocated = 0;        // tensors alive
  std::int64_t cached = 0;           // reserved but free (the allocator's cache)
  std::int64_t workspace = 0;        // the cuBLAS workspace (allocated, held until cleared)
  std::int64_t allocated_peak = 0;
  std::int64_t reserved_peak = 0;
  double fraction = 1.0;
  int set_fraction_calls = 0;
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
  }
  /// A tensor of `bytes`: from the cache when it holds enough, else a new segment, refused (as
  /// c10::OutOfMemoryError would be) when reserved would pass fraction x totalGlobalMem. With
  /// expandable segments the check is made on the request and whole 20 MiB pages are mapped, so
  /// reserved can pass the cap by less than a page.
  void allocate(std::int64_t bytes) {
    if (!initialised) throw std::logic_error("allocator used before init");
    if (cached >= bytes) {
      cached -= bytes;
    } else {
      const std::int64_t need = bytes - cached;
      const auto cap = static_cast<std::int64_t>(fraction * static_cast<double>(total_global));
      if (fraction < 1.0 && reserved() + need > cap) {
        throw std::runtime_error("CUDA out of memory. Tried to allocate " + std::to_string(bytes) +
                                 " bytes");
      }
      const std::int64_t mapped = expandable ? (need + kPage - 1) / kPage * kPage : need;
      cached += mapped - bytes;  // what the pages hold beyond the request stays cached
      cached = std::max<std::int64_t>(cached, 0);
    }
    allocated += bytes;
    updatePeaks();
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
    if (!d_.initialised) d_.context += 500 * kMiB;  // the CUDA context comes with the first tensor
    d_.initialised = true;
  }
  CudaAllocatorFacts allocatorFacts() override {
    d_.expandable = d_.facts.expandable_segments;
    if (d_.facts.config_fraction < 1.0) d_.fraction = d_.facts.config_fraction;
    return d_.facts;
  }
  CudaAllocatorStats stats(int /*index*/) override {
    if (!d_.initialised) throw std::logic_error("did you call init?");
    return {d_.allocated + d_.workspace, d_.allocated_peak, d_.reserved(), d_.reserved_peak, 0};
  }
  void resetPeakStats(int /*index*/) override {
    d_.allocated_peak = d_.allocated + d_.workspace;
    d_.reserved_peak = d_.reserved();
  }
  double memoryFraction(int /*index*/) override { return d_.fraction; }
  void setMemoryFraction(double fraction, int /*index*/) override {
    d_.touch();
    if (fraction < 0.0 || fraction > 1.0) throw std::runtime_error("invalid fraction");
    d_.fraction = fraction;
    ++d_.set_fraction_calls;
  }
  void emptyCache() override {
    d_.touch();
    d_.cached = 0;
  }
  void clearCublasWorkspaces() override {
    d_.touch();
    d_.workspace = 0;
  }
  void synchronize(int /*index*/) override { d_.touch(); }

 private:
  FakeDevice& d_;
};

/// The message of the autobatch::Error that `f` throws; "" (and a test failure) when it throws
/// none.
std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected autobatch::Error";
  return "";
}

std::unique_ptr<MemoryBackend> backendOn(FakeDevice& d, std::int64_t limit,
                                         std::int64_t reserve = 0) {
  return makeCudaBackendWith(std::make_unique<FakeCudaApi>(d), 0, limit, reserve);
}

void setUpModelAndWarmUp(FakeDevice& d, std::int64_t model_bytes);

/// A backend as the trial runner leaves it after setup: a 300 MiB model loaded, the warm-up step
/// run, finishSetup() done.
std::unique_ptr<MemoryBackend> readyBackend(FakeDevice& d, std::int64_t limit,
                                            std::int64_t reserve = 0) {
  auto backend = backendOn(d, limit, reserve);
  setUpModelAndWarmUp(d, 300 * kMiB);
  backend->finishSetup(0);
  return backend;
}

/// What the trial runner does before finishSetup(): the model on the device, one warm-up step
/// (its activations freed into the cache, the cuBLAS workspace created, the first kernels'
/// modules loaded).
void setUpModelAndWarmUp(FakeDevice& d, std::int64_t model_bytes) {
  d.allocate(model_bytes);
  d.allocate(100 * kMiB);
  d.kernel("matmul", 40 * kMiB);
  d.kernel("conv", 60 * kMiB);
  d.release(100 * kMiB);
}

// Fault 1: torch.device('cuda') != torch.device('cuda:0') in 2.11. An implementation that keeps
// "cuda" as given (Device(cuda, -1)) rejects the model's own cuda:0 tensors and reads the stats of
// no device.
TEST(CudaBackendTest, IndexlessCudaResolvesToTheCurrentDevice) {
  EXPECT_EQ(resolveDeviceName("cuda", 0), "cuda:0");
  EXPECT_EQ(resolveDeviceName("cuda", 3), "cuda:3");
  EXPECT_EQ(resolveDeviceName("cuda:1", 3), "cuda:1");
  EXPECT_EQ(resolveDeviceName("cpu", 3), "cpu");
}

// Fault 5: an implementation that reads the baseline and the outside part while the warm-up's
// cuBLAS workspace and cached blocks are still held counts 32 MiB of workspace in the baseline
// (every later trial then ends below it) and reads the outside part before it is complete.
TEST(CudaBackendTest, BaselineAndOutsideAreReadAfterTheWarmUpIsReleased) {
  FakeDevice d;
  auto backend = backendOn(d, 20 * kGiB);
  EXPECT_TRUE(backend->needsWarmUp());
  const std::int64_t model = 300 * kMiB;
  setUpModelAndWarmUp(d, model);
  backend->finishSetup(0);
  EXPECT_EQ(d.workspace, 0);
  EXPECT_EQ(d.cached, 0);
  EXPECT_EQ(backend->currentBytes(), model);
  EXPECT_EQ(backend->outsideBytes(), 500 * kMiB + 40 * kMiB + 60 * kMiB);
}

// Fault 7: the allocator's cap is fraction x totalGlobalMem (c10/cuda/CUDACachingAllocator.cpp,
// setMemoryFraction, 2.11). An implementation that divides by cudaMemGetInfo's total (768 MiB
// smaller here) allows 768 MiB x fraction too much; one that forgets the outside part allows the
// whole context on top of the limit.
TEST(CudaBackendTest, FractionIsOfTotalGlobalMemLessTheOutsidePartAndTheReserve) {
  FakeDevice d;
  const std::int64_t limit = 20 * kGiB;
  const std::int64_t reserve = 256 * kMiB;
  auto backend = readyBackend(d, limit, reserve);
  const double allowed = d.fraction * static_cast<double>(d.total_global);
  const auto expected = static_cast<double>(limit - reserve - backend->outsideBytes());
  EXPECT_NEAR(allowed, expected, 1.0);
  EXPECT_EQ(backend->limitBytes(), limit);
  EXPECT_EQ(backend->allocatorInfo().fraction, d.fraction);
}

// Fault 4: memory outside the allocator grows after setup (lazily loaded modules, handles made at
// first use). An implementation that reads it once keeps the old fraction, so the device's real
// usage passes the limit by the growth, and reports peaks without it.
TEST(CudaBackendTest, OutsideGrowthAfterATrialLowersTheFractionAndCountsInThePeak) {
  FakeDevice d;
  const std::int64_t limit = 20 * kGiB;
  auto backend = readyBackend(d, limit);
  const std::int64_t outside_before = backend->outsideBytes();
  const double fraction_before = d.fraction;

  backend->beginTrial();
  d.allocate(2 * kGiB);
  d.kernel("cudnn-rnn", 96 * kMiB);  // a new kind of kernel during the trial
  d.release(2 * kGiB);
  const MemoryPeaks peaks = backend->endTrial();
  EXPECT_EQ(peaks.outside_growth_bytes, 96 * kMiB);
  EXPECT_EQ(backend->outsideBytes(), outside_before + 96 * kMiB);
  EXPECT_EQ(backend->outsideGrowthBytes(), 96 * kMiB);
  EXPECT_EQ(peaks.peak_bytes, peaks.peak_reserved_bytes + outside_before + 96 * kMiB);
  EXPECT_LT(d.fraction, fraction_before);
  EXPECT_NEAR(d.fraction * static_cast<double>(d.total_global),
              static_cast<double>(limit - backend->outsideBytes()), 1.0);
  ASSERT_FALSE(backend->limitWarnings().empty());
  EXPECT_NE(backend->limitWarnings().back().find("grew by 96.00 MiB"), std::string::npos)
      << backend->limitWarnings().back();

  // The next trial with no new kernel: no growth.
  backend->releaseCaches();
  backend->beginTrial();
  d.allocate(kGiB);
  d.release(kGiB);
  EXPECT_EQ(backend->endTrial().outside_growth_bytes, 0);
}

// With the fraction re-applied, the device's real usage (what cudaMemGetInfo sees, outside part
// included) stays under the emulated card whatever the trial does: the check that the limit is
// not circular. Without the re-application a grown outside part takes the device past it.
TEST(CudaBackendTest, DeviceUsageStaysUnderTheLimitAfterOutsideGrowth) {
  FakeDevice d;
  const std::int64_t limit = 8 * kGiB;
  auto backend = readyBackend(d, limit);
  std::int64_t worst_used = 0;
  for (int trial = 0; trial < 4; ++trial) {
    backend->beginTrial();
    d.kernel("kind-" + std::to_string(trial), 200 * kMiB);
    d.release(d.fillUntilOutOfMemory(64 * kMiB, worst_used));
    backend->endTrial();
    backend->releaseCaches();
  }
  // The first trial's growth was not yet known when it ran: its own kernel (200 MiB) is the
  // allowed excess, once; later trials must stay under the limit less nothing.
  EXPECT_LE(worst_used, limit + 200 * kMiB);
  backend->beginTrial();
  std::int64_t last_used = 0;
  const std::int64_t held = d.fillUntilOutOfMemory(64 * kMiB, last_used);
  EXPECT_LE(last_used, limit);
  d.release(held);
  backend->endTrial();
}

// Fault 7: expandable segments map 20 MiB pages after checking the request, so reserved bytes can
// pass the cap by up to a page. An implementation that gives the allocator the whole allowance
// lets the device pass the limit.
TEST(CudaBackendTest, ExpandableSegmentsKeepReservedUnderTheLimitByOnePage) {
  FakeDevice d;
  d.facts.expandable_segments = true;
  d.facts.pytorch_alloc_conf = "expandable_segments:True";
  const std::int64_t limit = 4 * kGiB;
  auto backend = readyBackend(d, limit);
  EXPECT_TRUE(backend->allocatorInfo().expandable_segments);
  EXPECT_NEAR(d.fraction * static_cast<double>(d.total_global),
              static_cast<double>(limit - backend->outsideBytes() - kPage), 1.0);
  for (const std::int64_t request : {kMiB * 3, kMiB * 7, kMiB * 19, kMiB * 21}) {
    backend->beginTrial();
    std::int64_t worst_used = 0;
    d.release(d.fillUntilOutOfMemory(request, worst_used));
    const MemoryPeaks peaks = backend->endTrial();
    EXPECT_LE(peaks.peak_bytes, limit) << "request " << request;
    backend->releaseCaches();
  }
}

// Fault 7: PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns the fraction and the statistics off (every peak
// reads 0): a search under it would report every batch as fitting.
TEST(CudaBackendTest, DisabledCachingIsRefusedWithTheReason) {
  FakeDevice d;
  d.facts.caching_disabled = true;
  const std::string message = errorOf([&] { backendOn(d, 0); });
  EXPECT_NE(message.find("PYTORCH_NO_CUDA_MEMORY_CACHING"), std::string::npos) << message;
  EXPECT_NE(message.find("every peak statistic reads 0"), std::string::npos) << message;
  EXPECT_NE(message.find("unset PYTORCH_NO_CUDA_MEMORY_CACHING"), std::string::npos) << message;
  EXPECT_EQ(d.set_fraction_calls, 0);
}

// Fault 7: backend:cudaMallocAsync has its own limit and statistics rules.
TEST(CudaBackendTest, CudaMallocAsyncIsRefusedWithTheFix) {
  FakeDevice d;
  d.facts.backend = "cudaMallocAsync";
  d.facts.pytorch_cuda_alloc_conf = "backend:cudaMallocAsync";
  const std::string message = errorOf([&] { backendOn(d, 8 * kGiB); });
  EXPECT_NE(message.find("expected the native caching allocator, but got backend:cudaMallocAsync"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"), std::string::npos)
      << message;
  EXPECT_NE(message.find("unset backend:cudaMallocAsync"), std::string::npos) << message;
}

// Fault 7: per_process_memory_fraction in the allocator configuration caps reserved bytes too, and
// setMemoryFraction replaces it: an implementation that ignores it either loses the user's cap
// (ours replaces it) or reports a limit the allocator never enforced.
TEST(CudaBackendTest, ConfiguredFractionIsTheLimitWhenLowerAndTheSourceSaysSo) {
  FakeDevice d;
  d.facts.config_fraction = 0.25;
  d.facts.pytorch_alloc_conf = "per_process_memory_fraction:0.25";
  {
    auto backend = backendOn(d, 0);
    EXPECT_EQ(backend->limitBytes(), static_cast<std::int64_t>(0.25 * 150.0 * kGiB));
    EXPECT_NE(backend->limitSource().find("per_process_memory_fraction:0.25"), std::string::npos)
        << backend->limitSource();
    setUpModelAndWarmUp(d, 300 * kMiB);
    backend->finishSetup(0);
    EXPECT_NEAR(d.fraction * static_cast<double>(d.total_global),
                static_cast<double>(backend->limitBytes() - backend->outsideBytes()), 1.0);
  }
  EXPECT_DOUBLE_EQ(d.fraction, 0.25);  // LibTorch's own cap is back after the search

  FakeDevice e;
  e.facts.config_fraction = 0.5;
  auto lower = backendOn(e, 10 * kGiB);
  EXPECT_EQ(lower->limitBytes(), 10 * kGiB);
  EXPECT_NE(lower->limitSource().find("--memory-limit"), std::string::npos);
  EXPECT_NE(lower->limitSource().find("per_process_memory_fraction:0.5"), std::string::npos);
}

// Which variable LibTorch 2.11 used is recorded with both values; with both set the user is told
// that they are read for different keys.
TEST(CudaBackendTest, BothAllocatorVariablesAreRecordedWithTheOneLibTorchUsed) {
  FakeDevice d;
  d.facts.pytorch_cuda_alloc_conf = "max_split_size_mb:128";
  auto old_only = backendOn(d, 0);
  EXPECT_EQ(old_only->allocatorInfo().config, "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128");
  EXPECT_EQ(old_only->allocatorInfo().config_env, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_FALSE(old_only->allocatorInfo().pytorch_alloc_conf.has_value());

  FakeDevice both;
  both.facts.pytorch_alloc_conf = "expandable_segments:True";
  both.facts.pytorch_cuda_alloc_conf = "max_split_size_mb:128";
  auto b = backendOn(both, 0);
  EXPECT_EQ(b->allocatorInfo().config, "expandable_segments:True");
  EXPECT_EQ(b->allocatorInfo().config_env, "both");
  EXPECT_EQ(b->allocatorInfo().pytorch_cuda_alloc_conf, "max_split_size_mb:128");
  ASSERT_FALSE(b->limitWarnings().empty());
  EXPECT_NE(b->limitWarnings().front().find("keep one"), std::string::npos);
}

// Fault 6: after a sticky device error every device call throws it again. An implementation that
// synchronizes, empties the cache or restores the fraction after it throws from endTrial (before
// the trial is classified) and from its destructor (std::terminate: the process dies with no
// report).
TEST(CudaBackendTest, PoisonedDeviceGetsNoMoreCallsAndTheDestructorDoesNotThrow) {
  FakeDevice d;
  {
    auto backend = readyBackend(d, 8 * kGiB);
    ASSERT_GT(d.set_fraction_calls, 0);
    backend->beginTrial();
    d.sticky = true;
    EXPECT_THROW(backend->endTrial(), std::runtime_error);  // the runner's first sign of it
    const int calls = d.calls_after_sticky;
    backend->markPoisoned();
    EXPECT_TRUE(backend->poisoned());
    const MemoryPeaks peaks = backend->endTrial();
    EXPECT_EQ(peaks.peak_bytes, 0);
    backend->releaseCaches();
    backend->synchronize();
    backend->beginTrial();
    EXPECT_EQ(d.calls_after_sticky, calls);
  }  // the destructor ran without throwing and without touching the device
  EXPECT_EQ(d.calls_after_sticky, 1);
}

// Per-phase peaks on CUDA: the caching allocator keeps one peak, so the backend reads it at each
// phase boundary and resets it; the trial's peak is the largest phase's. Catches a trial peak read
// after the last reset only (it would be the optimizer step's, not the backward's).
TEST(CudaBackendTest, PhasePeaksAreReadAtEachBoundaryAndFoldIntoTheTrialPeak) {
  FakeDevice d;
  auto backend = readyBackend(d, 20 * kGiB);
  const std::int64_t model = backend->currentBytes();
  backend->beginTrial();
  backend->enterPhase(TrialPhase::kForward, 0);
  d.allocate(kGiB);
  backend->enterPhase(TrialPhase::kBackward, 0);
  d.allocate(kGiB);
  d.release(2 * kGiB);
  backend->enterPhase(TrialPhase::kOptimizerStep, 0);
  d.allocate(kGiB / 2);
  d.release(kGiB / 2);
  backend->enterPhase(TrialPhase::kIdle, 0);
  const MemoryPeaks peaks = backend->endTrial();
  ASSERT_EQ(peaks.phase_peaks.size(), 3U);
  EXPECT_EQ(peaks.phase_peaks[0].phase, TrialPhase::kForward);
  EXPECT_EQ(peaks.phase_peaks[0].peak_bytes, model + kGiB);
  EXPECT_EQ(peaks.phase_peaks[1].phase, TrialPhase::kBackward);
  EXPECT_EQ(peaks.phase_peaks[1].peak_bytes, model + 2 * kGiB);
  EXPECT_EQ(peaks.phase_peaks[2].peak_bytes, model + kGiB / 2);
  EXPECT_EQ(peaks.peak_allocated_bytes, model + 2 * kGiB);
  EXPECT_GE(peaks.peak_reserved_bytes, model + 2 * kGiB);
}

// The destructor restores the fraction the process had (a launcher trains after the search).
TEST(CudaBackendTest, FractionIsRestoredWhenTheBackendGoes) {
  FakeDevice d;
  {
    auto backend = readyBackend(d, 8 * kGiB);
    EXPECT_LT(d.fraction, 0.1);
  }
  EXPECT_DOUBLE_EQ(d.fraction, 1.0);
}

// Without --memory-limit or a reserve the device's own memory is the limit: no fraction is set.
TEST(CudaBackendTest, NoLimitLeavesTheFractionAloneAndUsesTotalGlobalMem) {
  FakeDevice d;
  auto backend = readyBackend(d, 0);
  EXPECT_EQ(d.set_fraction_calls, 0);
  EXPECT_EQ(backend->limitBytes(), d.total_global);
}

// A limit that the outside part alone fills is a usage error naming both figures.
TEST(CudaBackendTest, LimitBelowTheOutsidePartIsAnErrorNamingIt) {
  FakeDevice d;
  auto backend = backendOn(d, 512 * kMiB);
  setUpModelAndWarmUp(d, 10 * kMiB);
  const std::string message = errorOf([&] { backend->finishSetup(0); });
  EXPECT_NE(message.find("600.00 MiB cuda:0 holds outside the caching allocator"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("raise --memory-limit"), std::string::npos) << message;
}

TEST(CudaBackendTest, MissingDeviceIsAnErrorNamingTheCount) {
  FakeDevice d;
  const std::string message =
      errorOf([&] { makeCudaBackendWith(std::make_unique<FakeCudaApi>(d), 2, 0, 0); });
  EXPECT_NE(message.find("'cuda:2': expected a visible CUDA device, but the CUDA runtime sees 1"),
            std::string::npos)
      << message;
}

// Issue 27, row 11: a memory limit above what the device has.
// An implementation that keeps --memory-limit above totalGlobalMem as the limit (only capping the
// fraction at 1) reports 8 EiB as the limit, and the search jumps to batches sized for it; the
// limit must be the device's total memory, said in the warning and the source.
TEST(CudaBackendTest, LimitAboveTotalMemoryIsClippedToItAndSaid) {
  FakeDevice d;
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  auto backend = readyBackend(d, huge);
  EXPECT_EQ(backend->limitBytes(), d.total_global);
  const double allowed = d.fraction * static_cast<double>(d.total_global);
  EXPECT_NEAR(allowed, static_cast<double>(d.total_global - backend->outsideBytes()), 1.0);
  EXPECT_NE(backend->limitSource().find("--memory-limit 9223372036854775807, clipped to cuda:0's "
                                        "total memory"),
            std::string::npos)
      << backend->limitSource();
  const auto warnings = backend->limitWarnings();
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("(9223372036854775807 bytes) is more than cuda:0's total memory, "
                             "150.00 GiB (161061273600 bytes): the limit was clipped to it"),
            std::string::npos)
      << warnings[0];
  // One byte over is clipped too; the total itself is kept as given, without a warning.
  FakeDevice e;
  EXPECT_EQ(readyBackend(e, e.total_global + 1)->limitBytes(), e.total_global);
  FakeDevice f;
  auto exact = readyBackend(f, f.total_global);
  EXPECT_EQ(exact->limitBytes(), f.total_global);
  EXPECT_TRUE(exact->limitWarnings().empty());
}

}  // namespace
}  // namespace autobatch::detail
