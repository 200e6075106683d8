// The trial runner's checks before it loads a model (runner_checks.h).
#include "probes/runner_checks.h"

#include <string>

#include "autobatch/vocabulary/error.h"
#include "memory/cuda_api.h"
#include "memory/cuda_device.h"

namespace autobatch::detail {
namespace {

// One step cannot be a trial's evidence when step 2 holds more than step 1: an optimizer that
// keeps state creates it lazily at step 1's step(), so only step 2's forward and backward run with
// it (and AdamW's exp_avg, exp_avg_sq are two parameter-sized sets); gradients zero-filled and
// kept (--zero-grad zeros) are alive from step 2's forward on. Found on an 8 x Linear(2048, 2048)
// MLP at 1 GiB, AdamW, --zero-grad zeros, margin 0: 1 step answered 10239, which then failed at
// step 2 (2 steps: 5768; issue 27, row 8). Plain SGD and no optimizer with gradients set to None
// repeat step 1 exactly, so 1 step is their whole story.
void checkStepsPerTrial(const TrainingSpec& spec) {
  if (spec.steps_per_trial != 1) return;
  const bool stateful = spec.optimizer == OptimizerKind::kSgdMomentum ||
                        spec.optimizer == OptimizerKind::kAdam ||
                        spec.optimizer == OptimizerKind::kAdamW;
  const bool kept_gradients = spec.zero_grad == ZeroGrad::kZeros;
  if (!stateful && !kept_gradients) return;
  std::string why;
  if (stateful) {
    why = "optimizer " + std::string(toString(spec.optimizer)) +
          " creates its state at the first step(), so only step 2 runs with it";
  }
  if (kept_gradients) {
    why += std::string(why.empty() ? "" : ", and ") +
           "--zero-grad zeros keeps the gradients alive from step 2's forward on";
  }
  throw Error("steps per trial (--steps-per-trial): expected at least 2 with optimizer " +
              std::string(toString(spec.optimizer)) + " and --zero-grad " +
              std::string(toString(spec.zero_grad)) + ", but got 1; " + why +
              ": a batch that fits one step may fail the next; use --steps-per-trial 2 (the "
              "default)" +
              (kept_gradients ? std::string()
                              : std::string(", or an optimizer without state (sgd, none)")));
}

}  // namespace

void checkRunnerOptions(const TrainingSpec& spec, const SearchOptions& options) {
  if (spec.steps_per_trial < 1) {
    throw Error("steps per trial: expected >= 1, but got " + std::to_string(spec.steps_per_trial));
  }
  if (spec.accumulation_steps < 1) {
    throw Error("accumulation steps: expected >= 1, but got " +
                std::to_string(spec.accumulation_steps));
  }
  if (options.reserve_bytes < 0 || options.memory_limit_bytes < 0) {
    throw Error("memory limit and reserve: expected >= 0 bytes, but got limit " +
                std::to_string(options.memory_limit_bytes) + " and reserve " +
                std::to_string(options.reserve_bytes));
  }
  checkStepsPerTrial(spec);
}

// "cuda" becomes cuda:<current device> here, once: every later use (the device check of the
// model's tensors, the limit, statistics, fraction, guards, RNG and the report) sees one index.
at::Device parseDevice(const std::string& text) {
  if (text != "cpu" && text != "cuda" && text.rfind("cuda:", 0) != 0) {
    throw Error("device: expected cpu, cuda or cuda:N, but got '" + text + "'");
  }
  const std::string resolved = resolveDeviceName(text, text == "cuda" ? cudaCurrentDevice() : 0);
  try {
    return {resolved};
  } catch (const c10::Error&) {
    throw Error("device: expected cpu, cuda or cuda:N, but got '" + text + "'");
  }
}

}  // namespace autobatch::detail
