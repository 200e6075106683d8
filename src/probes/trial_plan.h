// trial_plan.h (internal) — what one trial of the trial runner runs: its optimizer steps, each a
// micro-batch size and the inputs its micro-batches are made of. A single-batch trial repeats
// one step; a mixed trial (TrialRunner::runMixed) is checked here against the model's inputs and
// format. Thread safety: none needed (no state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autobatch/probes/model_format.h"
#include "autobatch/probes/trial_runner.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch::detail {

/// One optimizer step of a trial: its micro-batch and the inputs it is made of (not owned: the
/// runner's inputs or a MixedStep's, alive for the trial).
struct PlannedStep {
  std::int64_t batch = 1;
  const std::vector<InputSpec>* inputs = nullptr;
};

/// A mixed trial's steps, and the request it reports (micro_batch_size: the largest step's).
struct MixedPlan {
  std::vector<PlannedStep> steps;
  TrialRequest request;
};

/// Plans `steps` as one trial of `micro_batches_per_step` micro-batches per step. Throws
/// autobatch::Error when `format` fixes its input shapes (pt2; `model_path` names the model), for
/// no steps or micro_batches_per_step < 1, and for a step whose micro-batch is under 1 or whose
/// inputs differ in count or dtypes from `inputs` (the runner's). The plan points into `steps`.
MixedPlan planMixedTrial(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                         const CancelHook& cancel, const std::vector<InputSpec>& inputs,
                         const ModelFormat& format, const std::string& model_path);

}  // namespace autobatch::detail
