// The CUDA memory backend's logic (src/memory/cuda_backend.cpp) on the CPU, against a fake of the
// CUDA calls that behaves as LibTorch 2.11 does: the caching allocator's fraction is of
// totalGlobalMem and refuses a segment that would take reserved bytes past it; cuBLAS keeps a 32
// MiB workspace per handle inside the allocator until clearCublasWorkspaces(); the outside part
// (context, kernel modules, handles) grows at the first kernel of each kind; expandable segments
// map 20 MiB pages; a sticky device error makes every later device call throw it again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "autobatch/vocabulary/error.h"
#include "memory/cuda_api.h"
#include "memory/memory_backend.h"
#include "support/fake_cuda.h"

namespace autobatch::detail {
namespace {

using fakes::FakeCudaApi;
using fakes::FakeDevice;
using fakes::kGiB;
using fakes::kMiB;
using fakes::kPage;

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

// ---- the scenario table shared with the Python package (issue 39) ----------------------------

namespace autobatch::detail {
namespace {

using nlohmann::json;

std::int64_t mib(const json& j, const char* key, std::int64_t fallback = 0) {
  return j.contains(key) ? j.at(key).get<std::int64_t>() * kMiB : fallback;
}

// The value of `key` in an allocator configuration "k1:v1,k2:v2" ("" when absent).
std::string confValue(const std::optional<std::string>& conf, const std::string& key) {
  if (!conf) return "";
  std::size_t start = 0;
  while (start <= conf->size()) {
    const std::size_t end = std::min(conf->find(',', start), conf->size());
    const std::string item = conf->substr(start, end - start);
    const std::size_t colon = item.find(':');
    if (colon != std::string::npos && item.substr(0, colon) == key) return item.substr(colon + 1);
    start = end + 1;
  }
  return "";
}

// The facts LibTorch 2.11 reports for the scenario's environment (CUDAAllocatorConfig: generic
// keys from PYTORCH_ALLOC_CONF first, backend and per_process_memory_fraction from
// PYTORCH_CUDA_ALLOC_CONF first), as the Python CudaApi reads them from os.environ.
CudaAllocatorFacts factsOf(const json& scenario) {
  CudaAllocatorFacts f;
  const json env = scenario.value("env", json::object());
  auto var = [&](const char* name) -> std::optional<std::string> {
    if (!env.contains(name)) return std::nullopt;
    return env.at(name).get<std::string>();
  };
  f.pytorch_alloc_conf = var("PYTORCH_ALLOC_CONF");
  f.pytorch_cuda_alloc_conf = var("PYTORCH_CUDA_ALLOC_CONF");
  f.caching_disabled = var("PYTORCH_NO_CUDA_MEMORY_CACHING") == std::optional<std::string>("1");
  f.backend = scenario.value("allocator_backend", "native");
  const auto& generic = f.pytorch_alloc_conf ? f.pytorch_alloc_conf : f.pytorch_cuda_alloc_conf;
  const auto& cuda = f.pytorch_cuda_alloc_conf ? f.pytorch_cuda_alloc_conf : f.pytorch_alloc_conf;
  f.expandable_segments = confValue(generic, "expandable_segments") == "True" ||
                          confValue(generic, "expandable_segments") == "true";
  const std::string fraction = confValue(cuda, "per_process_memory_fraction");
  if (!fraction.empty()) f.config_fraction = std::stod(fraction);
  return f;
}

// Runs one trial's ops; returns the device's largest usage on the way.
std::int64_t runOps(FakeDevice& d, const json& ops) {
  std::int64_t used = d.used();
  for (const json& op : ops) {
    if (op.contains("alloc")) {
      d.allocate(mib(op, "alloc"));
    } else if (op.contains("free")) {
      d.release(mib(op, "free"));
    } else if (op.contains("kernel")) {
      d.kernel(op.at("kernel").get<std::string>(), mib(op, "module_mib"));
    } else if (op.contains("split")) {
      d.split(mib(op, "split"), mib(op, "block"));
    } else if (op.contains("free_split")) {
      d.releaseSplit(mib(op, "free_split"), mib(op, "block"));
    } else if (op.contains("fill")) {
      d.release(d.fillUntilOutOfMemory(mib(op, "fill"), used));
    } else {
      ADD_FAILURE() << "unknown op " << op.dump();
    }
    used = std::max(used, d.used());
  }
  return used;
}

void replay(const json& s) {
  SCOPED_TRACE(s.at("name").get<std::string>());
  const json& expect = s.at("expect");
  FakeDevice d;
  d.total_global = mib(s, "total_global_mib", d.total_global);
  d.meminfo_total = mib(s, "meminfo_total_mib", d.total_global - 768 * kMiB);
  d.context_at_init = mib(s, "context_at_init_mib", d.context_at_init);
  d.fraction = s.value("preset_fraction", 1.0);
  d.facts = factsOf(s);
  std::unique_ptr<MemoryBackend> backend;
  try {
    backend = makeCudaBackendWith(std::make_unique<FakeCudaApi>(d), 0, mib(s, "limit_mib"),
                                  mib(s, "reserve_mib"));
  } catch (const Error& e) {
    ASSERT_TRUE(expect.contains("error")) << e.what();
    EXPECT_NE(std::string(e.what()).find(expect.at("error").get<std::string>()), std::string::npos)
        << e.what();
    EXPECT_EQ(d.set_fraction_calls, 0);
    EXPECT_DOUBLE_EQ(d.fraction, expect.at("fraction_after_remove").get<double>());
    return;
  }
  ASSERT_FALSE(expect.contains("error")) << "expected an error";
  if (expect.contains("limit_mib")) {
    EXPECT_EQ(backend->limitBytes(), mib(expect, "limit_mib"));
  }
  if (expect.contains("source")) {
    EXPECT_NE(backend->limitSource().find(expect.at("source").get<std::string>()),
              std::string::npos)
        << backend->limitSource();
  }
  d.allocate(mib(s, "model_mib", 300 * kMiB));
  if (s.contains("warm_up")) {
    backend->beginTrial();
    runOps(d, s.at("warm_up"));
    backend->endTrial();
    backend->releaseCaches();
  }
  backend->finishSetup(0);
  if (expect.contains("outside_after_setup_mib")) {
    EXPECT_EQ(backend->outsideBytes(), mib(expect, "outside_after_setup_mib"));
  }
  if (expect.contains("allowance_after_setup_mib")) {
    EXPECT_NEAR(d.fraction * static_cast<double>(d.total_global),
                static_cast<double>(mib(expect, "allowance_after_setup_mib")), 1.0);
  }
  const json trials = s.value("trials", json::array());
  const json expected_trials = expect.value("trials", json::array());
  for (std::size_t i = 0; i < trials.size(); ++i) {
    SCOPED_TRACE("trial " + std::to_string(i));
    backend->beginTrial();
    const std::int64_t used = runOps(d, trials[i]);
    const MemoryPeaks peaks = backend->endTrial();
    backend->releaseCaches();
    if (i >= expected_trials.size()) continue;
    const json& e = expected_trials[i];
    if (e.contains("outside_growth_mib")) {
      EXPECT_EQ(peaks.outside_growth_bytes, mib(e, "outside_growth_mib"));
    }
    if (e.contains("peak_minus_reserved_mib")) {
      EXPECT_EQ(peaks.peak_bytes - peaks.peak_reserved_bytes, mib(e, "peak_minus_reserved_mib"));
    }
    if (e.contains("used_at_most_mib")) {
      EXPECT_LE(used, mib(e, "used_at_most_mib"));
    }
    if (e.contains("inactive_split_peak_mib")) {
      EXPECT_EQ(peaks.inactive_split_peak_bytes, mib(e, "inactive_split_peak_mib"));
    }
    if (e.contains("allocator_retries")) {
      EXPECT_EQ(peaks.allocator_retries, e.at("allocator_retries").get<std::int64_t>());
    }
  }
  if (expect.contains("after_search")) {
    const json& a = expect.at("after_search");
    EXPECT_EQ(d.allocated + d.workspace, mib(a, "allocated_mib"));
    EXPECT_EQ(d.reserved(), mib(a, "reserved_mib"));
  }
  const auto warnings = backend->limitWarnings();
  for (const json& w : expect.value("warnings", json::array())) {
    const auto text = w.get<std::string>();
    EXPECT_TRUE(std::any_of(warnings.begin(), warnings.end(), [&](const std::string& x) {
      return x.find(text) != std::string::npos;
    })) << text;
  }
  backend.reset();
  EXPECT_DOUBLE_EQ(d.fraction, expect.at("fraction_after_remove").get<double>());
}

// The table of tests/fixtures/cuda_meter_scenarios.json (rows 1, 2, 4, 7 and 8 of issue 39), the
// same rows tests/python/test_cuda_meter.py replays through the package's CudaApi. The C++ backend
// is the reference both sides answer to: a backend that read the outside part before the warm-up,
// left the workspaces, restored 1.0 instead of the process's fraction or took a limit above the
// card fails its row here.
TEST(CudaBackendTest, SharedScenarios) {
  const std::string path = std::string(AUTOBATCH_TEST_FIXTURES) + "/cuda_meter_scenarios.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const json table = json::parse(in);
  ASSERT_GE(table.at("scenarios").size(), 9U);
  for (const json& s : table.at("scenarios")) replay(s);
}

}  // namespace
}  // namespace autobatch::detail
