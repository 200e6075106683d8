// The trial runner (autobatch/probes/trial_runner.h): the memory backend, the optimizer, the step
// loop, the classification of failures and the re-run, the weight snapshot and the trial guards.
// What differs between model formats is the step program's (step_program.h); nothing here asks
// which format a model is.
#include "autobatch/probes/trial_runner.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "autobatch/probes/model_format.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/failure.h"
#include "memory/memory_backend.h"
#include "memory/storage_bytes.h"
#include "probes/optimizers.h"
#include "probes/rng_state_guard.h"
#include "probes/runner_checks.h"
#include "probes/step_program.h"
#include "probes/step_progress.h"
#include "probes/trained_parameters.h"
#include "probes/trial_classification.h"
#include "probes/trial_inputs.h"
#include "probes/trial_plan.h"
#include "probes/weight_snapshot.h"

namespace autobatch {
namespace {

// What the runner lends its step program: the CPU budget allocator's log and refusal count
// (memory_backend.h), which a step whose call hides its allocations and errors reads (pt2).
// Marks the trials run in its lifetime as evaluation trials; the flag as it was afterwards.
class EvaluatingScope {
 public:
  explicit EvaluatingScope(bool& flag) : flag_(flag), was_(flag) { flag_ = true; }
  ~EvaluatingScope() { flag_ = was_; }
  EvaluatingScope(const EvaluatingScope&) = delete;
  EvaluatingScope& operator=(const EvaluatingScope&) = delete;

 private:
  bool& flag_;
  bool was_;
};

class BudgetAllocationLog final : public detail::AllocationLog {
 public:
  std::pair<std::uint64_t, std::string> refusals() const override {
    return detail::budgetRefusals();
  }
  std::int64_t start() override { return detail::startAllocationLog(); }
  std::vector<detail::AllocationEvent> stop() override { return detail::stopAllocationLog(); }
  void recordPhasePeak(detail::TrialPhase phase, int micro, std::int64_t bytes) override {
    detail::recordBudgetPhasePeak(phase, micro, bytes);
  }
};

}  // namespace

struct TrialRunner::Impl final : detail::StepHost {
  TrainingSpec spec;
  std::int64_t reserve_bytes = 0;
  at::Device device{at::kCPU};
  bool saved_rethrow = false;
  bool saved_cudnn_benchmark = false;
  // Destroyed after the step program and the snapshot (declared first).
  std::unique_ptr<detail::MemoryBackend> backend;
  std::unique_ptr<detail::StepProgram> step;
  detail::WeightSnapshot snapshot;
  BudgetAllocationLog allocation_log;
  detail::TrainedParameters parameters;
  std::int64_t baseline_bytes = 0;
  // The last out of memory and the largest fit: evidence for classifying an ambiguous failure.
  detail::TrialEvidence evidence;
  // A fatal device error (sticky CUDA error) was seen: no device work any more, not even in the
  // destructor (a weight restore on a dead context throws, and from a destructor that terminates).
  bool poisoned = false;
  OptimizerImpl optimizer_impl = OptimizerImpl::kLoop;  // spec.optimizer_impl, auto resolved
  // A training loop's `x, y` between micro-batches: the inputs (and a package's targets).
  std::vector<at::Tensor> held_inputs;
  int trials_run = 0;
  detail::TrialPoint point;  // where the trial in progress is (fault injection in tests)
  // Evaluation trials (runEval): the training state held between them (holdEvalState), whether
  // the trial in progress is one, and what they taught (apart from the training trials').
  bool holding_state = false;
  bool evaluating = false;
  bool keep_optimizer = false;  // the hold's training step: its optimizer becomes the resident one
  std::unique_ptr<detail::TrialOptimizer> resident_optimizer;
  at::Tensor resident_ddp_buckets;
  detail::TrialEvidence eval_evidence;

  void enter(detail::TrialPhase phase) override {
    point.phase = phase;
    detail::setTrialPoint(point);
    if (!poisoned) backend->enterPhase(phase, point.micro_batch_index);
  }
  int microBatchIndex() const override { return point.micro_batch_index; }
  detail::AllocationLog& allocationLog() override { return allocation_log; }

  Impl(TrainingSpec given_spec, const SearchOptions& options, const detail::StepSource& source)
      : spec(std::move(given_spec)) {
    detail::checkRunnerOptions(spec, options);
    reserve_bytes = options.reserve_bytes;
    device = detail::parseDevice(spec.device);
    const ModelFormat& format = source.format();
    if (format.cpu_only && !device.is_cpu()) {
      throw Error("model " + std::string(format.file_kind) + " '" + spec.model_path +
                  "': expected --device cpu, but got " + spec.device + "; " +
                  std::string(format.cpu_only_reason));
    }
    optimizer_impl = detail::resolveOptimizerImpl(spec.optimizer_impl, device.is_cuda());
    installBackend(options);
    saved_rethrow = FLAGS_torch_jit_enable_rethrow_caught_exception;
    FLAGS_torch_jit_enable_rethrow_caught_exception = true;  // keeps c10::OutOfMemoryError's type
    saved_cudnn_benchmark = at::globalContext().benchmarkCuDNN();
    at::globalContext().setBenchmarkCuDNN(spec.cudnn_benchmark);

    step = source.load({spec, device});
    // Host-side snapshot of every parameter and buffer, taken before a precision cast.
    snapshot = detail::WeightSnapshot(step->parameters(), step->buffers());
    snapshot.checkDevice(device);
    if (spec.precision == Precision::kFp16 || spec.precision == Precision::kBf16) {
      step->castTo(detail::modelFloatType(spec.precision));
    }
    parameters = detail::TrainedParameters(step->parameters(), spec.ddp, spec.model_path);
    const std::int64_t untracked_bytes = untrackedModelBytes();
    if (backend->needsWarmUp()) warmUp(std::max<std::int64_t>(options.min_batch, 1));
    backend->finishSetup(untracked_bytes);
    baseline_bytes = backend->currentBytes();
    // Said before the trials run, not only in the report: a --memory-limit clipped to the room.
    for (const auto& warning : backend->limitWarnings()) spdlog::warn("{}", warning);
  }

  ~Impl() {
    if (!poisoned) {
      try {
        snapshot.restore();
        // Undo an fp16/bf16 cast on the caller's module, without counting the restored tensors.
        if (step->borrowed()) snapshot.restoreDtypes(device);
      } catch (const std::exception& e) {  // a destructor must not throw (std::terminate)
        // The message's first line: LibTorch appends a C++ backtrace after it.
        const std::string message = e.what();
        spdlog::warn("could not restore the model's weights: {}",
                     message.substr(0, message.find('\n')));
      }
    } else {
      spdlog::warn(
          "the model's weights were not restored: {} had a fatal error and its memory cannot be "
          "read or written any more",
          device.str());
    }
    step->endTrial();
    at::globalContext().setBenchmarkCuDNN(saved_cudnn_benchmark);
    FLAGS_torch_jit_enable_rethrow_caught_exception = saved_rethrow;
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void installBackend(const SearchOptions& options) {
    if (device.is_cuda()) {
      backend = detail::makeCudaBackend(device.has_index() ? device.index() : 0,
                                        options.memory_limit_bytes, options.reserve_bytes);
    } else {
      // Installed before the model is loaded, so the model's bytes count.
      backend = detail::makeCpuBudgetBackend(options.memory_limit_bytes, options.reserve_bytes);
    }
    if (backend->limitBytes() - reserve_bytes <= 0) {
      throw Error("memory limit: expected more than the reserve of " +
                  std::to_string(reserve_bytes) + " bytes, but got " +
                  std::to_string(backend->limitBytes()) + " bytes (" + backend->limitSource() +
                  "); lower --reserve" +
                  (options.memory_limit_bytes > 0 ? " or raise --memory-limit" : ""));
    }
  }

  // The caller's CPU tensors were allocated before the budget allocator: counted as baseline.
  std::int64_t untrackedModelBytes() const {
    if (!device.is_cpu()) return 0;
    detail::DistinctStorages untracked(
        [](const void* data) { return !detail::isBudgetTracked(data); });
    for (const auto& p : step->parameters()) untracked.add(p);
    for (const auto& b : step->buffers()) untracked.add(b);
    return untracked.bytes();
  }

  // What a training loop's variables hold between its micro-batches, released at the trial's end.
  void releaseHeld() {
    held_inputs.clear();
    step->releaseHeld();
  }

  std::unique_ptr<detail::TrialOptimizer> makeOptimizer() const {
    return detail::makeTrialOptimizer(spec.optimizer, optimizer_impl, parameters.tensors(),
                                      spec.learning_rate);
  }

  at::Tensor makeInput(const InputSpec& input, std::int64_t batch, at::Generator& gen) const {
    return detail::makeInput(input, batch, spec.precision, device, gen);
  }

  // One micro-batch of `batch` samples: its inputs (and the targets a format takes as inputs),
  // made here and held as a loop's `x, y` until the next micro-batch's are made, then the step
  // program's forward, loss and backward; every other tensor of it dies in that call.
  void microStep(std::int64_t batch, const std::vector<InputSpec>& step_inputs,
                 at::Generator& gen) {
    enter(detail::TrialPhase::kInputs);
    detail::checkInputBytes(batch, step_inputs, step->targets(), spec.precision,
                            backend->currentBytes(), backend->limitBytes() - reserve_bytes);
    const std::vector<InputSpec>& targets = step->targets();
    std::vector<at::Tensor> args;
    args.reserve(step_inputs.size() + targets.size());
    for (const auto& input : step_inputs) args.push_back(makeInput(input, batch, gen));
    for (const auto& target : targets) args.push_back(makeInput(target, batch, gen));
    held_inputs = args;
    if (evaluating) {
      step->evalStep(batch, std::move(args), gen, *this);
    } else {
      step->microStep(batch, std::move(args), gen, *this);
    }
  }

  // One warm-up step at the search's smallest micro-batch before the backend reads its baseline
  // (CUDA): the first kernels of each kind load modules and create library handles outside the
  // caching allocator; read before them, the outside part would be too small for every trial. Out
  // of memory and size limits here are left to the first real trial to report; a model error
  // leaves at once (the first trial would raise it too).
  void warmUp(std::int64_t batch) {
    const TrialResult r = runOnce({batch, 1, {}});
    if (r.outcome != TrialOutcome::kFits) {
      spdlog::debug("warm-up step at micro-batch {}: {} ({})", batch, toString(r.outcome),
                    r.reason);
    }
    trials_run = 0;
    evidence.forgetTrials();
  }

  void checkUsable() const {
    if (poisoned) {
      throw Error("trial: expected a usable device, but " + device.str() +
                  " had a fatal error in an earlier trial; start a new process");
    }
  }

  TrialResult run(const TrialRequest& request) {
    if (request.micro_batch_size < 1 || request.micro_batches_per_step < 1) {
      throw Error(
          "trial: expected micro_batch_size >= 1 and micro_batches_per_step >= 1, but "
          "got " +
          std::to_string(request.micro_batch_size) + " and " +
          std::to_string(request.micro_batches_per_step));
    }
    checkUsable();
    // A batch the format cannot run (pt2: outside its compiled range): a hard limit of the model,
    // like a kernel's.
    std::string why = step->batchOutOfRange(request.micro_batch_size);
    if (!why.empty()) {
      TrialResult result;
      result.request = request;
      result.memory_limit_bytes = backend->limitBytes() - reserve_bytes;
      result.outcome = TrialOutcome::kSizeLimit;
      result.reason = std::move(why);
      return result;
    }
    return runOnce(request);
  }

  // A mix of shapes, planned (and refused for a format whose input shapes are fixed) by
  // planMixedTrial (trial_plan.h).
  TrialResult runMixed(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                       const CancelHook& cancel) {
    const detail::MixedPlan plan = detail::planMixedTrial(
        steps, micro_batches_per_step, cancel, step->inputs(), step->format(), spec.model_path);
    checkUsable();
    // A mixed trial neither reads nor changes what single-batch trials taught (largest fit,
    // last out of memory).
    PlanRun outcome = runPlan(plan.request, plan.steps, /*read_last_oom=*/false);
    if (outcome.error) std::rethrow_exception(outcome.error);
    return std::move(outcome.result);
  }

  // Frees what a trial left: weights back, caches emptied. Skipped once the device is poisoned;
  // an error here poisons it (the original error, if any, is the one that leaves).
  void cleanUpAfterTrial(std::exception_ptr& error) {
    if (poisoned) return;
    try {
      snapshot.restore();
      backend->releaseCaches();
    } catch (const std::exception&) {
      if (!error) error = std::current_exception();
      poison();
    }
  }

  void poison() {
    poisoned = true;
    backend->markPoisoned();
  }

  TrialResult runOnce(const TrialRequest& request) {
    const std::vector<detail::PlannedStep> plan(
        static_cast<std::size_t>(spec.steps_per_trial),
        detail::PlannedStep{request.micro_batch_size, &step->inputs()});
    PlanRun outcome = runPlan(request, plan, /*read_last_oom=*/true);
    if (outcome.error) {
      evidence.forgetOutOfMemory();
      std::rethrow_exception(outcome.error);
    }
    evidence.learnFrom(outcome.result);
    return std::move(outcome.result);
  }

  // A trial's result, and the error that leaves instead of it (null when the trial fit, ran out
  // of memory or met a size limit).
  struct PlanRun {
    TrialResult result;
    std::exception_ptr error;
  };

  // Runs `plan` as one trial: the optimizer and its state live across its steps, and the
  // allocator's cache is emptied only after the last one. `read_last_oom`: the trial's error is
  // classified with the last out of memory as evidence (TrialEvidence::classify); a mixed trial
  // reads none of it.
  PlanRun runPlan(const TrialRequest& request, const std::vector<detail::PlannedStep>& plan,
                  bool read_last_oom) {
    PlanRun outcome;
    TrialResult& result = outcome.result;
    result.request = request;
    result.memory_limit_bytes = backend->limitBytes() - reserve_bytes;

    const c10::DeviceGuard device_guard(device);
    const bool saved_optimize = torch::jit::getGraphExecutorOptimize();
    torch::jit::setGraphExecutorOptimize(spec.optimize_graph);
    std::optional<detail::RngStateGuard> rng_guard;
    rng_guard.emplace(device);
    step->beginTrial();
    backend->beginTrial();
    point = {};
    point.micro_batch_size = request.micro_batch_size;
    point.trial_index = trials_run++;

    detail::StepsRun steps = runSteps(request, plan, result);
    std::exception_ptr& error = steps.error;
    enter(detail::TrialPhase::kIdle);
    if (!holding_state) parameters.zeroGrad(ZeroGrad::kNone);  // held: as the training step left
    releaseHeld();
    result.output_bytes = step->outputBytes();
    at::autocast::clear_cache();

    const detail::MemoryPeaks peaks = readPeaks(error);
    bool near_process_limit = false;
    FailureClass failure;
    detail::TrialEvidence& taught = evaluating ? eval_evidence : evidence;
    if (!poisoned) {
      const detail::TrialEvidence none;
      failure = detail::classifyTrialError(error, peaks, read_last_oom ? taught : none,
                                           request.micro_batch_size, *backend, near_process_limit);
    }
    cleanUpAfterTrial(error);
    step->endTrial();
    rng_guard.reset();
    torch::jit::setGraphExecutorOptimize(saved_optimize);
    if (error && !poisoned && failure.kind == FailureKind::kPossibleOutOfMemory) {
      detail::judgeAmbiguous(
          taught, request, near_process_limit, *backend,
          [this](const TrialRequest& again) {
            return evaluating ? runEvalOnce(again) : runOnce(again);
          },
          failure, error, result);
    }
    if (error) {
      outcome.error = error;
      return outcome;
    }
    detail::fillTrialResult(result, peaks, failure, steps);
    return outcome;
  }

  // The trial's steps, in order; an error stops them and is kept with the point it was raised at.
  // The optimizer and its state, DDP's buckets and the generator are gone when this returns.
  detail::StepsRun runSteps(const TrialRequest& request,
                            const std::vector<detail::PlannedStep>& plan, TrialResult& result) {
    detail::StepsRun run;
    // The hook is also seen inside a step, at each CPU allocation: a step at a very large batch
    // stops within an op of the deadline or a signal, not at its end (issue 40 row 15).
    const detail::CpuInterruptScope interrupt(request.cancel);
    std::unique_ptr<detail::TrialOptimizer> optimizer;
    at::Tensor ddp_buckets;  // --ddp: DDP's gradient buckets, alive for the whole trial
    at::Generator gen;
    {
      const detail::UntrackedCpuScope untracked;  // the generator's own state is not the step's
      gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed);
    }
    try {
      if (parameters.ddpBucketBytes() > 0 && !evaluating) {
        ddp_buckets =
            at::empty({parameters.ddpBucketBytes()}, at::TensorOptions(at::kByte).device(device));
      }
      if (!evaluating) optimizer = makeOptimizer();
      const int steps = static_cast<int>(plan.size());
      detail::StepProgress progress(request.micro_batch_size, request.micro_batches_per_step,
                                    steps);
      for (int index = 0; index < steps; ++index) {
        if (request.cancel && request.cancel()) {
          result.cancelled = true;
          break;
        }
        progress.beginStep(index);
        const auto start = std::chrono::steady_clock::now();
        runOptimizerStep(index, plan[static_cast<std::size_t>(index)],
                         request.micro_batches_per_step, optimizer.get(), gen);
        const double step_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        run.total_ms += step_ms;
        progress.endStep(step_ms);
        ++result.steps_completed;
      }
      if (keep_optimizer) {
        resident_optimizer = std::move(optimizer);
        resident_ddp_buckets = std::move(ddp_buckets);
      }
    } catch (...) {  // classified by runPlan; whatever is not OOM or a size limit is rethrown
      if (detail::interruptFired()) {
        result.cancelled = true;  // stopped inside a step: the trial does not count, no error
      } else {
        run.error = std::current_exception();
        run.failed_point = point;
      }
    }
    return run;
  }

  // One optimizer step: its micro-batches, the optimizer's step, the gradients zeroed.
  void runOptimizerStep(int index, const detail::PlannedStep& planned, int micro_batches,
                        detail::TrialOptimizer* optimizer, at::Generator& gen) {
    point.micro_batch_size = planned.batch;
    for (int micro = 0; micro < micro_batches; ++micro) {
      point.step = index;
      point.micro_batch_index = micro;
      microStep(planned.batch, *planned.inputs, gen);
    }
    if (evaluating) {  // no optimizer step, no zero_grad: the training state is as it was
      enter(detail::TrialPhase::kIdle);
      backend->synchronize();
      return;
    }
    enter(detail::TrialPhase::kOptimizerStep);
    if (optimizer != nullptr) optimizer->step();
    enter(detail::TrialPhase::kIdle);
    parameters.zeroGrad(spec.zero_grad);
    backend->synchronize();
  }

  void checkEvaluates() const {
    if (!step->format().capabilities.evaluation_forward) {
      throw Error("evaluation: expected a model that can run a forward alone, but '" +
                  spec.model_path + "' is a " + std::string(step->format().name) + " " +
                  std::string(step->format().file_kind) +
                  ", which holds the training step only; export the model as TorchScript "
                  "(scripts/autobatch_export.py --format torchscript) to size its evaluation");
    }
  }

  TrialResult holdEvalState(EvalState state, std::int64_t batch) {
    checkEvaluates();
    checkUsable();
    if (holding_state) {
      throw Error("evaluation: expected no training state held, but one is (releaseEvalState)");
    }
    holding_state = true;
    TrialResult result;
    result.memory_limit_bytes = backend->limitBytes() - reserve_bytes;
    if (state == EvalState::kParametersOnly) return result;
    if (batch < 1)
      throw Error("evaluation: expected a training batch >= 1, but got " + std::to_string(batch));
    const std::vector<detail::PlannedStep> plan(1, detail::PlannedStep{batch, &step->inputs()});
    keep_optimizer = true;
    PlanRun outcome = runPlan({batch, microBatchesPerTrial(), {}}, plan, false);
    keep_optimizer = false;
    if (outcome.error || outcome.result.outcome != TrialOutcome::kFits ||
        outcome.result.cancelled) {
      releaseEvalState();
    }
    if (outcome.error) std::rethrow_exception(outcome.error);
    return std::move(outcome.result);
  }

  void releaseEvalState() {
    resident_optimizer.reset();
    resident_ddp_buckets = at::Tensor();
    holding_state = false;
    eval_evidence.forgetTrials();
    if (poisoned) return;
    parameters.zeroGrad(ZeroGrad::kNone);
    snapshot.restore();
    backend->releaseCaches();
  }

  int microBatchesPerTrial() const { return std::min(spec.accumulation_steps, 2); }

  TrialResult runEval(const TrialRequest& request) {
    if (request.micro_batch_size < 1 || request.micro_batches_per_step < 1) {
      throw Error("evaluation trial: expected a batch >= 1 and batches per trial >= 1, but got " +
                  std::to_string(request.micro_batch_size) + " and " +
                  std::to_string(request.micro_batches_per_step));
    }
    checkEvaluates();
    checkUsable();
    if (!holding_state) {
      throw Error("evaluation trial: expected the evaluation state held (holdEvalState) first");
    }
    return runEvalOnce(request);
  }

  TrialResult runEvalOnce(const TrialRequest& request) {
    const std::vector<detail::PlannedStep> plan(
        1, detail::PlannedStep{request.micro_batch_size, &step->inputs()});
    PlanRun outcome;
    {
      const EvaluatingScope scope(evaluating);
      outcome = runPlan(request, plan, /*read_last_oom=*/true);
    }
    if (outcome.error) {
      eval_evidence.forgetOutOfMemory();
      std::rethrow_exception(outcome.error);
    }
    eval_evidence.learnFrom(outcome.result);
    return std::move(outcome.result);
  }

  // The trial's peaks, once its tensors are gone. A sticky device error (device-side assert,
  // illegal address) makes every later device call throw it again: the device is marked poisoned
  // before any cleanup touches it, and an error while reading poisons it too.
  detail::MemoryPeaks readPeaks(std::exception_ptr& error) {
    if (error && isFatalDeviceError(error)) poison();
    if (poisoned) return {};
    try {
      return backend->endTrial();  // synchronizes: an asynchronous device error shows here
    } catch (const std::exception&) {
      if (!error) error = std::current_exception();
      poison();
    }
    return {};
  }
};

TrialRunner::TrialRunner(const TrainingSpec& spec, const SearchOptions& options)
    : TrialRunner(spec, options, detail::FileStepSource(spec.model_path)) {}

TrialRunner::TrialRunner(const TrainingSpec& spec, const SearchOptions& options,
                         const detail::StepSource& source)
    : impl_(std::make_unique<Impl>(spec, options, source)) {}

TrialRunner::~TrialRunner() = default;

TrialResult TrialRunner::run(const TrialRequest& request) { return impl_->run(request); }
TrialResult TrialRunner::runMixed(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                                  const CancelHook& cancel) {
  return impl_->runMixed(steps, micro_batches_per_step, cancel);
}

TrialResult TrialRunner::holdEvalState(EvalState state, std::int64_t training_batch) {
  return impl_->holdEvalState(state, training_batch);
}
void TrialRunner::releaseEvalState() { impl_->releaseEvalState(); }
bool TrialRunner::holdsEvalState() const { return impl_->holding_state; }
TrialResult TrialRunner::runEval(const TrialRequest& request) { return impl_->runEval(request); }
Probe TrialRunner::evalProbe() {
  return [this](const TrialRequest& request) { return runEval(request); };
}

Probe TrialRunner::probe() {
  return [this](const TrialRequest& request) { return run(request); };
}

int TrialRunner::microBatchesPerTrial() const { return impl_->microBatchesPerTrial(); }

std::int64_t TrialRunner::parameterCount() const { return impl_->parameters.count(); }
std::int64_t TrialRunner::parameterBytes() const { return impl_->parameters.parameterBytes(); }
std::int64_t TrialRunner::gradientBytes() const { return impl_->parameters.gradientBytes(); }
std::int64_t TrialRunner::optimizerStateBytes() const {
  return impl_->parameters.optimizerStateBytes(impl_->spec.optimizer);
}
std::int64_t TrialRunner::ddpBucketBytes() const { return impl_->parameters.ddpBucketBytes(); }
std::string TrialRunner::optimizerImpl() const {
  if (impl_->spec.optimizer == OptimizerKind::kNone) return "";
  return std::string(toString(impl_->optimizer_impl));
}

std::int64_t TrialRunner::memoryLimitBytes() const {
  return impl_->backend->limitBytes() - impl_->reserve_bytes;
}
std::string TrialRunner::memoryLimitSource() const { return impl_->backend->limitSource(); }
std::vector<std::string> TrialRunner::memoryLimitWarnings() const {
  return impl_->backend->limitWarnings();
}
std::string TrialRunner::backendName() const { return impl_->backend->name(); }
std::string TrialRunner::modelFormat() const { return std::string(impl_->step->format().name); }
std::vector<std::string> TrialRunner::modelWarnings() const { return impl_->step->warnings(); }
std::vector<std::string> TrialRunner::evalWarnings() const { return impl_->step->evalWarnings(); }
std::int64_t TrialRunner::baselineBytes() const { return impl_->baseline_bytes; }
std::int64_t TrialRunner::currentBytes() const { return impl_->backend->currentBytes(); }
std::int64_t TrialRunner::outsideBytes() const { return impl_->backend->outsideBytes(); }
std::int64_t TrialRunner::outsideGrowthBytes() const {
  return impl_->backend->outsideGrowthBytes();
}
AllocatorInfo TrialRunner::allocatorInfo() const { return impl_->backend->allocatorInfo(); }
std::string TrialRunner::device() const { return impl_->device.str(); }
const std::vector<InputSpec>& TrialRunner::inputs() const { return impl_->step->inputs(); }
LossKind TrialRunner::loss() const { return impl_->step->loss(); }
const TrainingSpec& TrialRunner::spec() const { return impl_->spec; }

}  // namespace autobatch
