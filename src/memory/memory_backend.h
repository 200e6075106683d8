// Internal: how the trial runner measures and limits memory. One interface, two backends:
// the CPU budget allocator (cpu_budget.cpp) and the CUDA caching allocator (cuda_backend.cpp).
// LibTorch-free header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/trial.h"

namespace autobatch::detail {

// TrialPhase and phaseKey (the part of a training step an allocation belongs to, and its JSON
// name) live in the public autobatch/vocabulary/trial.h, which also declares them in this namespace
// (detail::TrialPhase, detail::phaseKey) for the backends, the runner and fault injection.

/// The peak of tensor bytes while one phase of one micro-batch ran (the largest over the trial's
/// steps), in bytes.
struct PhasePeakBytes {
  TrialPhase phase = TrialPhase::kIdle;
  int micro_batch_index = 0;  ///< 0-based within the optimizer step; 0 for the optimizer step
  std::int64_t peak_bytes = 0;
};

/// Keeps the largest peak per (phase, micro-batch) in the order first seen.
inline void recordPhasePeak(std::vector<PhasePeakBytes>& peaks, TrialPhase phase, int micro,
                            std::int64_t bytes) {
  if (phase == TrialPhase::kIdle) return;
  for (auto& p : peaks) {
    if (p.phase == phase && p.micro_batch_index == micro) {
      p.peak_bytes = std::max(p.peak_bytes, bytes);
      return;
    }
  }
  peaks.push_back({phase, micro, bytes});
}

/// Peaks of one trial, in bytes.
struct MemoryPeaks {
  std::int64_t peak_allocated_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
  /// Compared with the limit: peak reserved plus what lies outside the allocator.
  std::int64_t peak_bytes = 0;
  std::int64_t allocator_retries = 0;
  /// CUDA: the largest bytes of split, unused cached blocks during the trial (fragmentation:
  /// reserved memory only small requests can use; CudaAllocatorStats). 0 on the CPU.
  std::int64_t inactive_split_peak_bytes = 0;
  /// CUDA: growth of the memory outside the caching allocator seen at this trial's end (lazily
  /// loaded kernel modules, library handles); already counted in peak_bytes. 0 on the CPU.
  std::int64_t outside_growth_bytes = 0;
  /// The allocated-bytes peak of each phase of each micro-batch (issue 17: which phase sets the
  /// trial's peak).
  std::vector<PhasePeakBytes> phase_peaks;
};

class MemoryBackend {
 public:
  MemoryBackend() = default;
  MemoryBackend(const MemoryBackend&) = delete;
  MemoryBackend& operator=(const MemoryBackend&) = delete;
  /// Restores what the backend changed (CPU allocator, memory fraction).
  virtual ~MemoryBackend() = default;

  /// "cpu-budget" or "cuda-caching".
  virtual std::string name() const = 0;
  /// The limit before the reserve is taken off, in bytes (> 0).
  virtual std::int64_t limitBytes() const = 0;
  /// Where limitBytes() came from, e.g. "--memory-limit", "MemAvailable at start (...)".
  virtual std::string limitSource() const = 0;
  /// Bytes held by tensors now (CPU: every counted tensor incl. the baseline; CUDA: allocated).
  virtual std::int64_t currentBytes() const = 0;
  /// Called once the model is set up (CPU: adds the bytes of tensors allocated before the
  /// budget allocator was installed; CUDA: measures the part outside the allocator).
  virtual void finishSetup(std::int64_t untracked_model_bytes) = 0;
  /// Resets the peak statistics before a trial.
  virtual void beginTrial() = 0;
  /// The trial enters `phase` of micro-batch `micro` (CUDA: the phase before it is closed and the
  /// allocator's peak reset; the CPU budget allocator follows setTrialPoint instead).
  virtual void enterPhase(TrialPhase /*phase*/, int /*micro*/) {}
  /// Reads the peaks of the trial (after its tensors are gone).
  virtual MemoryPeaks endTrial() = 0;
  /// Releases cached memory so the next trial starts from the same baseline.
  virtual void releaseCaches() = 0;
  /// Waits for queued device work (for step timing).
  virtual void synchronize() = 0;
  /// True when a process limit (RLIMIT_DATA / RLIMIT_AS / cgroup) is set and a failed allocation
  /// came near it: the request's size is known (a request of R bytes refused under the limit shows
  /// the process was within R of it, whatever the tensors counted: oneDNN scratch, allocator
  /// overhead and fragmentation are not tensors), or the trial's tensor peak reached half of the
  /// headroom the limit left at start. `failed_request_bytes` is 0 when the message gives no size.
  virtual bool processLimitNear(std::int64_t peak_bytes,
                                std::int64_t failed_request_bytes) const = 0;
  /// The allocator's configuration as recorded at setup (defaults on the CPU).
  virtual AllocatorInfo allocatorInfo() const { return {}; }
  /// Outside-allocator bytes counted in peak_bytes now (CUDA context etc.; 0 on the CPU).
  virtual std::int64_t outsideBytes() const { return 0; }
  /// Total growth of the outside part since setup, in bytes (0 on the CPU).
  virtual std::int64_t outsideGrowthBytes() const { return 0; }
  /// True when the trial runner must run one warm-up step before finishSetup() so that memory
  /// created lazily by the first kernels (CUDA context modules, cuBLAS/cuDNN handles) is in the
  /// outside part from the start (CUDA).
  virtual bool needsWarmUp() const { return false; }
  /// After a fatal device error (a sticky CUDA error: device-side assert, illegal address): no
  /// device call is made any more (endTrial returns zero peaks, releaseCaches and synchronize do
  /// nothing, the destructor leaves the memory fraction as it is).
  virtual void markPoisoned() {}
  virtual bool poisoned() const { return false; }
  /// What the user should know about the limit, now: --memory-limit above what the process or
  /// the device can use, a process limit changed while the trials ran. Empty when nothing.
  virtual std::vector<std::string> limitWarnings() const { return {}; }
};

/// Installs the CPU budget allocator (c10::SetCPUAllocator). `memory_limit_bytes` 0: the
/// system's (cgroup, MemAvailable, RLIMIT_DATA/RLIMIT_AS headroom plus the baseline). The
/// allocator refuses allocations above limitBytes() - `reserve_bytes`.
/// Throws: autobatch::Error when another budget allocator is installed or another allocator of
/// higher priority prevents the swap.
std::unique_ptr<MemoryBackend> makeCpuBudgetBackend(std::int64_t memory_limit_bytes,
                                                    std::int64_t reserve_bytes);

/// The CUDA caching allocator backend for device `index` (cuda_backend.cpp, docs/trial_runner.md).
/// `memory_limit_bytes` 0: the device's totalGlobalMem (or, when lower, the allocator
/// configuration's per_process_memory_fraction of it, or the memory fraction the process had
/// already set, which the backend restores when it goes); otherwise the memory fraction emulates a
/// card of that size. The fraction (limit - reserve - outside part [- one 20 MiB page with
/// expandable segments]) / totalGlobalMem is applied at finishSetup(), after the runner's warm-up
/// step, and lowered again whenever the outside part grows.
///
/// Throws: autobatch::Error when built without CUDA, for no such device, for
/// PYTORCH_NO_CUDA_MEMORY_CACHING=1 and for backend:cudaMallocAsync (exit 2 in the CLI).
std::unique_ptr<MemoryBackend> makeCudaBackend(int index, std::int64_t memory_limit_bytes,
                                               std::int64_t reserve_bytes);
class CudaApi;
/// As makeCudaBackend over the given CUDA calls (tests pass a fake). `api` must not be null.
std::unique_ptr<MemoryBackend> makeCudaBackendWith(std::unique_ptr<CudaApi> api, int index,
                                                   std::int64_t memory_limit_bytes,
                                                   std::int64_t reserve_bytes);

/// Scope in which CPU allocations by this thread are not counted by the budget allocator (the
/// host-side snapshot of the weights). Nestable.
class UntrackedCpuScope {
 public:
  UntrackedCpuScope();
  ~UntrackedCpuScope();
  UntrackedCpuScope(const UntrackedCpuScope&) = delete;
  UntrackedCpuScope& operator=(const UntrackedCpuScope&) = delete;
};

/// Scope in which a trial's steps can be stopped inside a step on the CPU (issue 40 row 15: one
/// step at a batch of 217,435 ran for minutes past a 10 s budget, and SIGTERM waited for it).
/// While alive, every allocation this thread makes through the CPU budget allocator (counted, not
/// in an UntrackedCpuScope, not inside an at::parallel_for region) first calls `hook`; when it
/// answers true the allocation throws c10::Error ("autobatch: trial interrupted ..."; never a
/// c10::OutOfMemoryError, so it is not taken for running out) and interruptFired() turns true.
/// Every op allocates its output, so a step stops within one op of the hook firing; an op already
/// running (one large matmul) finishes first. The CUDA caching allocator has no such seam: there a
/// step still ends before the hook is seen (its kernels are queued asynchronously, so the host
/// waits only at the synchronizations). `hook` runs on this thread at every allocation: it must be
/// cheap (the CLI's reads an atomic flag and a clock) and must not allocate tensors (a call made
/// from inside the hook is not checked again). An empty hook arms nothing. Not nestable.
class CpuInterruptScope {
 public:
  explicit CpuInterruptScope(const std::function<bool()>& hook, bool active = true);
  ~CpuInterruptScope();
  CpuInterruptScope(const CpuInterruptScope&) = delete;
  CpuInterruptScope& operator=(const CpuInterruptScope&) = delete;
};

/// Whether the allocations of this thread ask the hook of its CpuInterruptScope (a scope starts
/// active). The Python package arms the scope around a whole probe and turns it on around the
/// trial's steps only, so that putting the weights back after a trial is never stopped.
void setInterruptActive(bool active);

/// The hook armed on this thread by a CpuInterruptScope, asked now (false when none is armed):
/// the check a trial makes between its steps (the Python package's step loop).
bool interruptRequested();

/// True when the CpuInterruptScope armed on this thread has fired (an allocation threw for it):
/// an error that reaches the trial afterwards is the interruption, not the model's.
bool interruptFired();

/// True when `data` was allocated (and is counted) by the budget allocator.
bool isBudgetTracked(const void* data);

/// Watches a storage whose `bytes` the budget backend's finishSetup() counted as external (made
/// before the allocator was installed): when it is freed, its bytes leave the count at the next
/// allocation or read of the count. `weak_storage`: a `c10::StorageImpl*` holding one weak
/// reference (torch.UntypedStorage._weak_ref()), which the allocator owns from now on and
/// releases when the storage dies or the backend is removed. Unchecked: a wrong handle is
/// undefined behaviour.
void watchBudgetExternal(std::uintptr_t weak_storage, std::int64_t bytes);

/// How many allocations the budget allocator has refused in this process (limit, process guard
/// or injected fault) and the last refusal's message (the c10::OutOfMemoryError's text). Code that
/// turns the OutOfMemoryError into a plain error (an AOTInductor package's call) is out of memory
/// when the count moved across it.
std::pair<std::uint64_t, std::string> budgetRefusals();

/// Allocations (count, bytes) the budget allocator took from other threads of the process while
/// trials ran, since the process started (a collective backend's worker threads, a data loader;
/// not the trial's own intra-op workers). Bytes allocated, not held: a difference across a trial
/// says how much another thread allocated during it (issue 43: gloo's buffers in an FSDP2 step).
std::pair<std::int64_t, std::int64_t> budgetForeignAllocations();

/// (the peak since the trial began of the bytes held less those set apart, the bytes set apart
/// held now). Set apart: allocations of other threads, and of this thread inside
/// setBudgetBackendScope(true): a collective backend's buffers (gloo allocates some on the
/// caller's thread inside its collectives, freed when its worker finishes), apart from the
/// step's own (issue 43, scripts/bench/fsdp_fidelity.py). Equal to the trial's peak when nothing
/// was set apart.
std::pair<std::int64_t, std::int64_t> budgetOwnPeak();

/// Marks this thread as inside (true) or outside (false) a collective's call, for budgetOwnPeak.
void setBudgetBackendScope(bool inside);

/// Text appended to the message of every refusal from now on (empty: none, the default). For
/// the fair race of finders (issue 44, scripts/bench/): Lightning's is_oom_error and
/// accelerate's should_reduce_batch_size take a RuntimeError for out of memory only when its one
/// argument contains "DefaultCPUAllocator: can't allocate memory" (or a CUDA text); with that
/// suffix every finder meets the same budget. The refusal stays a c10::OutOfMemoryError.
void setBudgetRefusalSuffix(std::string suffix);

/// One tracked allocation (bytes > 0) or release (bytes < 0) of the budget allocator.
struct AllocationEvent {
  const void* data = nullptr;
  std::int64_t bytes = 0;
};

/// Starts recording every tracked allocation and release of the budget allocator, in order
/// (process-wide; one recording at a time). Used around a package's call, whose intermediates are
/// otherwise invisible to the runner.
/// Returns the bytes the budget allocator counts as held now.
std::int64_t startAllocationLog();

/// Stops the recording and returns it.
std::vector<AllocationEvent> stopAllocationLog();

/// Adds `bytes` as the peak of `phase` of micro-batch `micro` in the trial in progress (the
/// largest is kept), beside the phases the budget allocator closes itself.
void recordBudgetPhasePeak(TrialPhase phase, int micro, std::int64_t bytes);

/// Where the CPU trial in progress is; set by the trial runner, read by fault injection.
struct TrialPoint {
  TrialPhase phase = TrialPhase::kIdle;
  std::int64_t micro_batch_size = 0;
  int micro_batch_index = 0;  ///< 0-based, within the optimizer step
  int step = 0;               ///< 0-based, within the trial
  int trial_index = 0;        ///< 0-based, trials run by this runner
};

/// Records where the trial is (process-wide; one CPU runner per process).
void setTrialPoint(const TrialPoint& point);

/// Decides whether a counted CPU allocation of `bytes` at `point` fails.
using InjectedFault = std::function<bool(const TrialPoint& point, std::int64_t bytes)>;

/// Test seam: while set, the CPU budget allocator asks `fault` before every counted allocation
/// and, when it answers true, fails it exactly as over the limit (c10::OutOfMemoryError "CPU
/// budget allocator: out of memory: tried to allocate N bytes ... (injected in <phase>)").
/// Empty: no injection (the default). `fault` is called under the allocator's lock: it must not
/// allocate tensors. Not for production use.
void setInjectedFault(InjectedFault fault);

/// Decides whether a counted CPU allocation of `bytes` at `point` raises a library error: the
/// message to raise (as c10::Error, the type cuDNN / cuBLAS failures arrive with), or "" for none.
using InjectedError = std::function<std::string(const TrialPoint& point, std::int64_t bytes)>;

/// Test seam beside setInjectedFault: while set, the budget allocator asks `error` before every
/// counted allocation and throws c10::Error with the message it returns (e.g. cuDNN's "GET was
/// unable to find an engine to execute this computation", to test FailureKind::
/// kPossibleOutOfMemory on the CPU). Called under the allocator's lock. Not for production use.
void setInjectedError(InjectedError error);

/// Whether a process limit is near, given the trial's peak and the failed request (bytes).
using InjectedProcessLimit =
    std::function<bool(std::int64_t peak_bytes, std::int64_t request_bytes)>;

/// Test seam beside setInjectedError: while set, the CPU budget backend's processLimitNear
/// answers `near(peak_bytes, failed_request_bytes)` instead of comparing with the process limits
/// read at setup (tests/fixtures/trial_verdicts.json's cases with a process limit, without
/// setting one on the test process). Empty: the real rule (the default). Not for production use.
void setInjectedProcessLimit(InjectedProcessLimit near);

}  // namespace autobatch::detail
