// autobatch/probes/trial_runner.h — runs real training steps of a model at a micro-batch B: a
// TorchScript archive or module, or a pt2 training-step package (autobatch/probes/model_format.h,
// docs/formats.md).
//
// Contract: a TrialRunner owns (or borrows) one model on one device and runs trials: each trial
// is `steps_per_trial` optimizer steps of `micro_batches_per_step` forward/loss/backward passes
// on synthetic inputs, from the same weights, buffers and a fresh optimizer every time. It
// reports whether the trial fits and its peak memory (autobatch/vocabulary/trial.h). Out-of-memory
// and kernel size limits are results; model errors and fatal device errors leave `run` unchanged.
// What differs between the formats (loading, inputs and loss, the micro-step, the batch range a
// package was compiled for) is a step program per format inside the runner; the runner never
// branches on the format, and refuses what the format cannot do (ModelFormat::capabilities).
// Memory: on the CPU a budget allocator (c10::SetCPUAllocator) counts every tensor's bytes and
// refuses allocations above the limit; on CUDA the caching allocator's statistics are read and
// its memory fraction emulates a smaller card. See docs/trial_runner.md.
// State: while a runner lives it holds process-wide state: the CPU allocator (CPU device), the
// caching allocator's memory fraction (CUDA with a limit or reserve), cuDNN benchmark mode and
// FLAGS_torch_jit_enable_rethrow_caught_exception; all restored by the destructor. Per-thread
// state (autocast, graph-executor optimisation) is set by `run` on the calling thread and restored
// before it returns. Thread safety: one thread at a time; one CPU runner per process at a time.
// This header includes no LibTorch header (the model type is forward-declared).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/vocabulary/trial.h"

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace autobatch::detail {
class StepSource;  // src/probes/step_program.h
}  // namespace autobatch::detail

namespace autobatch {

/// One optimizer step of a mixed trial (TrialRunner::runMixed): a micro-batch of
/// `micro_batch_size` samples of `inputs` (e.g. one bucket of a length sweep: the runner's input
/// specs with another length).
struct MixedStep {
  /// Samples per micro-batch. Range >= 1.
  std::int64_t micro_batch_size = 1;
  /// The step's input specs: as many as the runner's inputs(), with the same dtypes; the sample
  /// shapes may differ.
  std::vector<InputSpec> inputs;
};

class TrialRunner {
 public:
  /// Loads `spec.model_path` onto `spec.device` in its format (modelFormatAt,
  /// autobatch/probes/model_format.h) and prepares the trials: a TorchScript archive with
  /// torch::jit::load, its inputs and loss `spec.inputs` / `spec.loss` when given, else the
  /// archive's "autobatch/inputs.json" (autobatch/vocabulary/model_metadata.h), else loss "mean"; a
  /// pt2 package with its own inputs, loss and precision (flags may only repeat them) on the CPU
  /// only (docs/formats.md, "How a package runs"). `options`: memory_limit_bytes (0: the device's)
  /// and reserve_bytes are used; the rest is the search's, except min_batch (the warm-up's
  /// micro-batch). `spec.device` "cuda" means cuda:<current device>, resolved once here (device()
  /// tells it). Side effects: installs the memory backend (see the file comment); on CUDA runs one
  /// warm-up training step at max(options.min_batch, 1) (weights and RNG restored after it), then
  /// releases the cuBLAS workspaces and the cache before the baseline and the memory outside the
  /// allocator are read, and sets the memory fraction (docs/trial_runner.md, "The CUDA backend");
  /// precision fp16/bf16 casts the model. Throws: autobatch::Error for an invalid spec
  /// (steps_per_trial or accumulation_steps < 1, an unknown device, no inputs from either source, a
  /// bad metadata file, another CPU runner alive; for a pt2 package: a device other than the CPU,
  /// flags that contradict the package, a damaged or foreign package); c10::Error from
  /// torch::jit::load for an unreadable archive; on CUDA, autobatch::Error for
  /// PYTORCH_NO_CUDA_MEMORY_CACHING=1, backend:cudaMallocAsync or a limit the memory outside the
  /// allocator already fills, and the model's own error when the warm-up step raises one.
  TrialRunner(const TrainingSpec& spec, const SearchOptions& options = {});

  /// As above with a module the caller already loaded on `spec.device` (spec.model_path is only
  /// used in messages). The module is borrowed and must outlive the runner; its weights, buffers,
  /// dtypes and training mode are exactly as given after every trial and after destruction. The
  /// host-side snapshot used for that is not counted by the CPU budget; the module's own CPU
  /// tensors are (as baseline bytes). Throws: as above; Error when `spec.inputs` is empty.
  TrialRunner(torch::jit::Module& module, const TrainingSpec& spec,
              const SearchOptions& options = {});

  /// Restores the process-wide state listed in the file comment and the borrowed module.
  ~TrialRunner();
  TrialRunner(const TrialRunner&) = delete;
  TrialRunner& operator=(const TrialRunner&) = delete;

  /// Runs one trial of `request.micro_batch_size` samples per micro-batch, `spec.steps_per_trial`
  /// optimizer steps of `request.micro_batches_per_step` micro-batches each (any value >= 1 is
  /// run as given; the search asks for microBatchesPerTrial()). Inputs have shape
  /// [micro_batch_size, sample_shape...]; values are drawn from a generator seeded with spec.seed.
  /// Returns: outcome fits / out-of-memory / size-limit with the trial's peaks. After it returns
  /// or throws, currentBytes() equals baselineBytes() and the weights are restored.
  /// The cancel hook is checked before every step and at every CPU allocation of the trial's
  /// thread (TrialRequest::cancel); a cancelled trial has cancelled = true.
  /// A failure that is only possibly out of memory (FailureKind::kPossibleOutOfMemory) is decided
  /// by re-running the largest micro-batch already seen to fit, with the cache emptied: that
  /// trial comes back in `classification_rerun` (autobatch/vocabulary/trial.h).
  /// Throws: autobatch::Error for micro_batch_size < 1 or micro_batches_per_step < 1, a model
  /// output the loss cannot use, or a device poisoned by an earlier fatal error; model and fatal
  /// device errors unchanged. After a fatal device error (a sticky CUDA error) no device call is
  /// made any more, by run() or the destructor, and the weights are not restored.
  /// Side effects: runs real training steps on the device; allocates and frees device memory.
  TrialResult run(const TrialRequest& request);

  /// Runs one trial made of `steps`, in order, `micro_batches_per_step` micro-batches each, from
  /// the same weights and a fresh optimizer whose state lives across the steps, and with no
  /// release of the allocator's cache between them (it is emptied after the trial, as after
  /// run()): a shuffled bucketed run's mix of shapes (issue 18, docs/sweeps.md "Mixed
  /// verification"). spec.steps_per_trial is not used. Returns: as run(); request.micro_batch_size
  /// is the largest step's; on out of memory, failed_step_index names the step. It does not
  /// change what run() knows of earlier trials (the batch re-run to classify an ambiguous failure).
  /// Throws: autobatch::Error for a model whose format fixes its input shapes (a pt2 package:
  /// FormatCapabilities::varying_shapes false; "mixed trial: expected a model whose input shapes
  /// can vary from step to step, but '<path>' is a pt2 package, ..."; nothing is run), no steps,
  /// micro_batches_per_step < 1, a step with micro_batch_size < 1 or inputs of another count or
  /// dtypes than inputs(); otherwise as run().
  TrialResult runMixed(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                       const CancelHook& cancel = {});

  /// A Probe for the search that calls run(); valid while the runner lives.
  Probe probe();

  /// Makes the state evaluation trials (runEval) run beside, and holds it until
  /// releaseEvalState() (or the runner's end). EvalState::kTrainingResident: the state in the
  /// middle of training: the parameters, the optimizer state created by one real training step of
  /// `training_batch` samples per micro-batch (microBatchesPerTrial() micro-batches, one optimizer
  /// step), then zero_grad as spec.zero_grad says (zeros: the gradients stay allocated; none:
  /// freed), and DDP's gradient buckets with spec.ddp. EvalState::kParametersOnly: an evaluation
  /// job on its own; nothing is run, `training_batch` unused. Returns: the training step's trial
  /// (kParametersOnly: an empty result, outcome kFits); when it did not fit (out of memory, a size
  /// limit, cancelled) nothing is held: the training state does not fit, which is no evaluation
  /// result. Throws: autobatch::Error for a format without capabilities.evaluation_forward (a pt2
  /// package: "... export the model as TorchScript"), a state already held, training_batch < 1
  /// (kTrainingResident); otherwise as run(). Side effects: from here currentBytes() stays at the
  /// held state's bytes between trials (weights restored after the step, as after every trial).
  TrialResult holdEvalState(EvalState state, std::int64_t training_batch);
  /// Drops the held state: optimizer state and gradients freed, weights restored; currentBytes()
  /// equals baselineBytes() again. Does nothing when none is held. Never throws on the CPU.
  void releaseEvalState();
  /// True between holdEvalState() (when its step fit) and releaseEvalState().
  bool holdsEvalState() const;
  /// One evaluation trial with the held state resident: request.micro_batches_per_step batches of
  /// request.micro_batch_size samples (the eval probe asks for 2: the previous batch's output is
  /// alive while the next one runs), each the model in eval mode, forward and loss under inference
  /// mode with the training precision's autocast (StepProgram::evalStep), from the same weights;
  /// no backward, no optimizer step. The peaks include the held state. Afterwards currentBytes()
  /// is the held state's again and the module's training mode is as given. A traced TorchScript
  /// graph ignores eval() (dropout and BatchNorm run as traced, in training mode).
  /// Returns: as run(). Throws: autobatch::Error for batch or batches < 1, no held state, a format
  /// that cannot evaluate; model and fatal device errors unchanged.
  TrialResult runEval(const TrialRequest& request);
  /// A Probe for the search that calls runEval(); valid while the runner lives.
  Probe evalProbe();

  /// min(spec.accumulation_steps, 2): N >= 2 micro-batches per optimizer step peak like 2,
  /// because gradients are alive from the second forward on and no graph outlives its micro-batch.
  int microBatchesPerTrial() const;

  /// Elements of the parameters that are trained (requires_grad), exact.
  std::int64_t parameterCount() const;
  /// Bytes of all parameters (after an fp16/bf16 cast), exact.
  std::int64_t parameterBytes() const;
  /// Bytes of the gradients of the trained parameters (same dtype as the parameters).
  std::int64_t gradientBytes() const;
  /// Bytes of the optimizer state once created: adam/adamw 2x, sgd-momentum 1x the trained
  /// parameters' bytes; sgd and none 0.
  std::int64_t optimizerStateBytes() const;
  /// The limit trials run under, in bytes, after SearchOptions::reserve_bytes (> 0).
  std::int64_t memoryLimitBytes() const;
  /// TrainingSpec::ddp: bytes of the gradient-sized buffer every trial allocates on the device
  /// (DDP's gradient buckets) from its start to its end; 0 without ddp.
  std::int64_t ddpBucketBytes() const;
  /// The optimizer implementation the trials run: "loop", "foreach" or "fused"
  /// (TrainingSpec::optimizer_impl with auto resolved: foreach on CUDA, loop on the CPU); "" for
  /// optimizer none.
  std::string optimizerImpl() const;
  /// Where the limit came from (e.g. "--memory-limit", "MemAvailable 123...", "cgroup v1
  /// memory.limit_in_bytes 1610612736 (/sys/fs/cgroup/memory/job) less ..."), and on the CPU what
  /// the process guard keeps the whole process under.
  std::string memoryLimitSource() const;
  /// What the user should know about the limit, as of now (call it after the trials): an explicit
  /// --memory-limit larger than what the process can use (CPU: the cgroup / system room, which the
  /// process guard keeps it under anyway) or than the device's total memory (CUDA: the memory
  /// fraction is capped at 1), a cgroup limit changed while the trials ran (trials before the
  /// change were measured against the old one). Empty when nothing.
  std::vector<std::string> memoryLimitWarnings() const;
  /// "cpu-budget" or "cuda-caching".
  std::string backendName() const;
  /// "torchscript", or "pt2" for a torch.export + AOTInductor training-step package written by
  /// scripts/autobatch_export.py --format pt2 (docs/formats.md).
  std::string modelFormat() const;
  /// What the user should know about the model's figures. For a pt2 package exported before
  /// packages ran eager's kernels (no "eager_kernels" in its metadata): that its peaks are a fused
  /// compiled step's, 0-17% under an eager loop's on the models measured (docs/formats.md), and
  /// that exporting it again fixes that. For any other pt2 package, what the export's own check
  /// of its peaks against the eager step's found (data/autobatch/memory_check.json, issue 26):
  /// nothing when it passed; the worst figure when the package was over by more than 1%; that it
  /// was not run (and why), or that the package predates it, with the 9.15% under-count of such
  /// packages (ConvNeXt-tiny) and the way out. Empty for a TorchScript archive.
  std::vector<std::string> modelWarnings() const;
  /// What the user should know about evaluation trials (runEval) of this model: that a traced
  /// TorchScript archive (its "autobatch/export.json", written by scripts/autobatch_export.py,
  /// says method "trace") ignores eval(). Empty when nothing (a scripted archive, or one that does
  /// not say).
  std::vector<std::string> evalWarnings() const;
  /// Bytes held by tensors before every trial (the model, its snapshot excluded), in bytes.
  std::int64_t baselineBytes() const;
  /// Bytes held by tensors now (CPU budget allocator; CUDA caching allocator "allocated").
  std::int64_t currentBytes() const;
  /// Bytes the device holds outside the allocator (CUDA context, kernels); 0 on the CPU.
  std::int64_t outsideBytes() const;
  /// Growth of the outside part since setup, in bytes (CUDA: lazily loaded kernels, handles
  /// created at first use; the memory fraction was lowered by it); 0 on the CPU.
  std::int64_t outsideGrowthBytes() const;
  /// The caching allocator's configuration as the trials ran under it (CUDA; defaults on the CPU).
  AllocatorInfo allocatorInfo() const;
  /// The device the trials run on, its index resolved: "cpu", "cuda:0", ... ("cuda" becomes
  /// cuda:<current device>).
  std::string device() const;
  /// The inputs and loss the trials use (explicit, else from the archive).
  const std::vector<InputSpec>& inputs() const;
  LossKind loss() const;
  /// The spec as given.
  const TrainingSpec& spec() const;

 private:
  /// The constructors' common part: the model and its format come from `source`.
  TrialRunner(const TrainingSpec& spec, const SearchOptions& options,
              const detail::StepSource& source);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace autobatch
