#include "probes/step_program.h"

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {

const ModelFormat& FileStepSource::format() const {
  if (format_ == nullptr) format_ = &modelFormatAt(path_);
  return *format_;
}

// The one place that maps a format to its step program.
std::unique_ptr<StepProgram> FileStepSource::load(const StepSetup& setup) const {
  return &format() == &pt2Format() ? loadPt2Step(setup) : loadTorchScriptStep(setup);
}

}  // namespace autobatch::detail

namespace autobatch::detail {

void StepProgram::evalStep(std::int64_t /*batch*/, std::vector<at::Tensor> args,
                           at::Generator& /*gen*/, StepHost& /*host*/) {
  args.clear();  // nothing runs
  throw Error("evaluation trial: expected a model format that can run a forward alone, but a " +
              std::string(format().name) +
              " model holds the training step only; export the model as TorchScript "
              "(scripts/autobatch_export.py --format torchscript)");
}

}  // namespace autobatch::detail
