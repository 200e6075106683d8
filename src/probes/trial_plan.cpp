#include "probes/trial_plan.h"

#include <algorithm>

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {

// The one change of behaviour of issue 28: a format whose input shapes are fixed (pt2) is
// refused here, in the library, not only by the CLI's --lengths.
MixedPlan planMixedTrial(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                         const CancelHook& cancel, const std::vector<InputSpec>& inputs,
                         const ModelFormat& format, const std::string& model_path) {
  if (!format.capabilities.varying_shapes) {
    throw Error(
        "mixed trial: expected a model whose input shapes can vary from step to step, "
        "but '" +
        model_path + "' is a " + std::string(format.name) + " " + std::string(format.file_kind) +
        ", whose input shapes are fixed at export; verify a mix of shapes on the "
        "model's TorchScript archive");
  }
  if (steps.empty() || micro_batches_per_step < 1) {
    throw Error(
        "mixed trial: expected at least one step and micro_batches_per_step >= 1, but got " +
        std::to_string(steps.size()) + " steps and " + std::to_string(micro_batches_per_step));
  }
  MixedPlan plan;
  plan.request.micro_batches_per_step = micro_batches_per_step;
  plan.request.cancel = cancel;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const MixedStep& mixed = steps[i];
    bool same_kinds = mixed.inputs.size() == inputs.size();
    for (std::size_t k = 0; same_kinds && k < inputs.size(); ++k) {
      same_kinds = mixed.inputs[k].dtype == inputs[k].dtype;
    }
    if (mixed.micro_batch_size < 1 || !same_kinds) {
      throw Error("mixed trial step " + std::to_string(i) +
                  ": expected micro_batch_size >= 1 and inputs of the runner's count and dtypes (" +
                  std::to_string(inputs.size()) + "), but got micro-batch " +
                  std::to_string(mixed.micro_batch_size) + " and " +
                  std::to_string(mixed.inputs.size()) + " inputs");
    }
    plan.steps.push_back({mixed.micro_batch_size, &mixed.inputs});
    plan.request.micro_batch_size = std::max(plan.request.micro_batch_size, mixed.micro_batch_size);
  }
  return plan;
}

}  // namespace autobatch::detail
