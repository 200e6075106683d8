#include "step_program.h"

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
