#include "probes/step_progress.h"

#include <spdlog/spdlog.h>

namespace autobatch::detail {

StepProgress::StepProgress(std::int64_t batch, int micro_batches, int steps)
    : batch_(batch), micro_batches_(micro_batches), steps_(steps) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return;
  pthread_attr_setstacksize(&attr, std::size_t{256} << 10);
  started_ = pthread_create(&thread_, &attr, &StepProgress::run, this) == 0;
  pthread_attr_destroy(&attr);
  if (!started_) spdlog::debug("no progress thread for this trial: pthread_create failed");
}

StepProgress::~StepProgress() {
  if (!started_) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  pthread_join(thread_, nullptr);
}

void StepProgress::beginStep(int step) {
  const std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  step_start_ = Clock::now();
  in_step_ = true;
}

void StepProgress::endStep(double step_ms) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    in_step_ = false;
  }
  const auto level = step_ms >= 1000.0 ? spdlog::level::info : spdlog::level::debug;
  spdlog::log(level, "trial of micro-batch {} x {}: step {}/{} done in {:.1f} s", batch_,
              micro_batches_, step_ + 1, steps_, step_ms / 1000.0);
}

void* StepProgress::run(void* self) {
  static_cast<StepProgress*>(self)->watch();
  return nullptr;
}

void StepProgress::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, kEvery, [this] { return stop_; });
    if (stop_ || !in_step_) continue;
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - step_start_).count();
    if (elapsed_s >= static_cast<double>(kEvery.count())) {
      spdlog::info("trial of micro-batch {} x {}: step {}/{} running for {:.0f} s", batch_,
                   micro_batches_, step_ + 1, steps_, elapsed_s);
    }
  }
}

}  // namespace autobatch::detail
