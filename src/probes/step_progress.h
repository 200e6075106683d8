// step_progress.h (internal) — the trial runner's progress lines while a trial runs.
// LibTorch-free. Thread safety: beginStep / endStep from the trial's thread; the object runs a
// watcher thread of its own for its lifetime.
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace autobatch::detail {

/// Logs while a trial runs, so that a long one never looks like a hang: each step's end (info
/// when the step took a second or more, else debug) and, during a step longer than 10 s, a line
/// every 10 s with the elapsed time, from a thread of its own (spdlog loggers used with it must be
/// thread-safe: the CLI's is). The thread has a 256 KiB stack (a default 8 MiB one counts against
/// RLIMIT_DATA, under which trials may run); when it cannot be created (a process limit), only the
/// step ends are logged. The thread ends with the object.
class StepProgress {
 public:
  /// A trial of `micro_batches` micro-batches of `batch` samples per step, `steps` steps.
  StepProgress(std::int64_t batch, int micro_batches, int steps);
  ~StepProgress();
  StepProgress(const StepProgress&) = delete;
  StepProgress& operator=(const StepProgress&) = delete;

  /// Step `step` (0-based) starts.
  void beginStep(int step);
  /// The step begun last ended after `step_ms` milliseconds.
  void endStep(double step_ms);

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kEvery{10};

  static void* run(void* self);
  void watch();

  std::int64_t batch_;
  int micro_batches_;
  int steps_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool in_step_ = false;
  int step_ = 0;
  Clock::time_point step_start_;
  pthread_t thread_{};
  bool started_ = false;
};

}  // namespace autobatch::detail
