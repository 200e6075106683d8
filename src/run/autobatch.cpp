#include "autobatch/autobatch.h"

#include <c10/util/hash.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/vocabulary/error.h"
#include "probes/pt2_package.h"

namespace autobatch {
namespace {

MemoryBreakdown breakdownOf(const TrialRunner& runner) {
  MemoryBreakdown m;
  m.parameter_count = runner.parameterCount();
  m.parameter_bytes = runner.parameterBytes();
  m.gradient_bytes = runner.gradientBytes();
  m.optimizer_state_bytes = runner.optimizerStateBytes();
  m.baseline_bytes = runner.baselineBytes();
  m.outside_bytes = runner.outsideBytes();
  m.outside_growth_bytes = runner.outsideGrowthBytes();
  m.ddp_bucket_bytes = runner.ddpBucketBytes();
  m.optimizer_impl = runner.optimizerImpl();
  m.model_format = runner.modelFormat();
  return m;
}

RunContext contextOf(const TrialRunner& runner) {
  RunContext c;
  c.device = runner.device();
  c.backend = runner.backendName();
  c.memory_limit_bytes = runner.memoryLimitBytes();
  c.memory_limit_source = runner.memoryLimitSource();
  c.allocator = runner.allocatorInfo();
  c.inputs = runner.inputs();
  c.loss = runner.loss();
  c.micro_batches_per_trial = runner.microBatchesPerTrial();
  c.warnings = runner.memoryLimitWarnings();
  for (auto& w : runner.modelWarnings()) c.warnings.push_back(std::move(w));
  return c;
}

MaxBatchResult searchWith(TrialRunner& runner, const SearchOptions& options) {
  MaxBatchResult result;
  result.search = findMaxBatch(runner.probe(), runnerSearchOptions(runner, options));
  result.memory = breakdownOf(runner);
  result.context = contextOf(runner);
  return result;
}

// One check trial of `request` through `run`, with the search's hooks around it.
template <typename Run>
TrialResult hookedTrial(TrialRequest request, const SearchOptions& options, Run run) {
  request.cancel = options.cancel;
  if (options.before_trial) options.before_trial(request);
  TrialResult trial = run(request);
  if (options.on_trial) options.on_trial(trial);
  return trial;
}

// A check's verdict on its trial (raw and under the margin) and the runner's facts.
void finishCheck(CheckResult& check, const TrialRunner& runner, const SearchOptions& options,
                 bool ran) {
  setCheckVerdict(check, options, ran);
  check.memory = breakdownOf(runner);
  check.context = contextOf(runner);
}

}  // namespace

MaxBatchResult findMaxBatch(const TrainingSpec& spec, const SearchOptions& options) {
  TrialRunner runner(spec, options);
  return searchWith(runner, options);
}

MaxBatchResult findMaxBatch(TrialRunner& runner, const SearchOptions& options) {
  return searchWith(runner, options);
}

SearchOptions runnerSearchOptions(const TrialRunner& runner, const SearchOptions& options) {
  SearchOptions o = options;
  // Every search trial runs the user's job as it will run: with accumulation, two micro-batches
  // per optimizer step (gradients alive during the second forward; N >= 2 peaks like 2).
  o.micro_batches_per_step = runner.microBatchesPerTrial();
  // The units its allocator reserves in: the CUDA caching allocator's (the CPU keeps them too).
  o.allocation_units = runner.allocatorInfo().allocation_units;
  return o;
}

MaxBatchResult runnerFacts(const TrialRunner& runner) {
  MaxBatchResult result;
  result.memory = breakdownOf(runner);
  result.context = contextOf(runner);
  return result;
}

std::string modelFormatOf(const std::string& path) {
  return detail::isAotiPackage(path) ? "pt2" : "torchscript";
}

std::string sha1Hex(const std::string& bytes) { return c10::sha1(bytes).str(); }

MaxBatchResult findMaxBatch(torch::jit::Module& module, const TrainingSpec& spec,
                            const SearchOptions& options) {
  TrialRunner runner(module, spec, options);
  return searchWith(runner, options);
}

CheckResult checkBatch(const TrainingSpec& spec, const SearchOptions& options,
                       std::int64_t micro_batch_size) {
  if (micro_batch_size < 1) {
    throw Error("check batch: expected a micro-batch size >= 1, but got " +
                std::to_string(micro_batch_size));
  }
  TrialRunner runner(spec, options);
  CheckResult check;
  TrialRequest request;
  request.micro_batch_size = micro_batch_size;
  request.micro_batches_per_step = runner.microBatchesPerTrial();
  check.trial = hookedTrial(request, options, [&](const TrialRequest& r) { return runner.run(r); });
  finishCheck(check, runner, options, true);
  return check;
}

EvalResult findMaxEvalBatch(TrialRunner& runner, const SearchOptions& options, EvalState state,
                            std::int64_t start_batch) {
  EvalResult eval;
  eval.state = state;
  if (state == EvalState::kTrainingResident) {
    eval.training_batch = std::max<std::int64_t>(options.min_batch, 1);
  }
  eval.training_step = runner.holdEvalState(state, eval.training_batch);
  eval.state_fits = runner.holdsEvalState();
  if (!eval.state_fits) {
    eval.search.status = SearchStatus::kNothingFits;
    eval.search.capped_by = "memory";
    eval.search.memory_limit_bytes = eval.training_step.memory_limit_bytes;
    return eval;
  }
  eval.resident_bytes = runner.currentBytes();
  SearchOptions o = evalSearchOptions(options, start_batch);
  o.allocation_units = runner.allocatorInfo().allocation_units;
  try {
    eval.search = findMaxBatch(runner.evalProbe(), o);
    for (auto& w : runner.evalWarnings()) eval.search.warnings.push_back(std::move(w));
  } catch (...) {
    runner.releaseEvalState();
    throw;
  }
  runner.releaseEvalState();
  return eval;
}

MaxBatchResult findMaxBatchAndEval(const TrainingSpec& spec, const SearchOptions& options,
                                   EvalState state) {
  TrialRunner runner(spec, options);
  if (state == EvalState::kParametersOnly) {
    MaxBatchResult result = runnerFacts(runner);
    result.eval = findMaxEvalBatch(runner, options, state);
    result.search = result.eval->search;
    return result;
  }
  MaxBatchResult result = searchWith(runner, options);
  if (result.search.status == SearchStatus::kCancelled) return result;
  result.eval = findMaxEvalBatch(runner, options, state, result.search.safe_micro_batch);
  return result;
}

CheckResult checkEvalBatch(const TrainingSpec& spec, const SearchOptions& options,
                           std::int64_t eval_batch) {
  if (eval_batch < 1) {
    throw Error("check eval batch: expected an evaluation batch >= 1, but got " +
                std::to_string(eval_batch));
  }
  TrialRunner runner(spec, options);
  CheckResult check;
  EvalResult eval;
  eval.training_batch = std::max<std::int64_t>(options.min_batch, 1);
  eval.training_step = runner.holdEvalState(EvalState::kTrainingResident, eval.training_batch);
  eval.state_fits = runner.holdsEvalState();
  if (eval.state_fits) {
    eval.resident_bytes = runner.currentBytes();
    TrialRequest request;
    request.micro_batch_size = eval_batch;
    request.micro_batches_per_step = 2;
    check.trial =
        hookedTrial(request, options, [&](const TrialRequest& r) { return runner.runEval(r); });
    runner.releaseEvalState();
  } else {
    check.trial = eval.training_step;
  }
  finishCheck(check, runner, options, eval.state_fits);
  for (auto& w : runner.evalWarnings()) check.context.warnings.push_back(std::move(w));
  check.eval = std::move(eval);
  return check;
}

std::string fileSha1(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("model file: expected a readable file, but cannot open '" + path + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return c10::sha1(bytes.str()).str();
}

}  // namespace autobatch
