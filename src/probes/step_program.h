// step_program.h (internal) — what differs between the model formats the trial runner replays.
//
// A StepProgram is one loaded model in one format (TorchScriptStep:
// src/probes/torchscript_step.cpp; Pt2Step: src/probes/pt2_step.cpp): its parameters and buffers,
// the description of its inputs and loss, one micro-step at batch B with the phase marks the
// runner's memory backend needs, what its output holds, the sizes it cannot run, the warnings about
// its figures and, through format(), what the format can do (autobatch/probes/model_format.h). The
// trial runner owns one and never asks which format it is: it keeps the memory backend, the
// optimizer, the step loop, the classification of failures and the re-run, the weight snapshot and
// the trial guards. Room left for what comes next: an evaluation forward would be a method beside
// microStep, asked only where format().capabilities.evaluation_forward; a probe that is not this
// runner (the user's own step, driven from Python) implements the search's Probe, not this
// interface. Thread safety: one thread at a time (the runner's).
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/probes/model_format.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/training_spec.h"
#include "memory/memory_backend.h"

namespace autobatch::detail {

/// The memory backend's record of allocations and refusals (the CPU budget allocator's:
/// memory_backend.h), lent by the runner to a step whose call hides both: a pt2 package's loader
/// turns the budget allocator's OutOfMemoryError into a plain error, and the call's intermediate
/// tensors are invisible outside it.
class AllocationLog {
 public:
  /// Refusals counted so far in this process and the last one's message (budgetRefusals()).
  virtual std::pair<std::uint64_t, std::string> refusals() const = 0;
  /// Starts recording every tracked allocation and release (startAllocationLog()); returns the
  /// bytes held now.
  virtual std::int64_t start() = 0;
  /// Stops the recording and returns it, in order; empty when not the budget allocator.
  virtual std::vector<AllocationEvent> stop() = 0;
  /// Adds `bytes` as the peak of `phase` of micro-batch `micro` in the trial in progress.
  virtual void recordPhasePeak(TrialPhase phase, int micro, std::int64_t bytes) = 0;

 protected:
  AllocationLog() = default;
  ~AllocationLog() = default;
  AllocationLog(const AllocationLog&) = default;
  AllocationLog& operator=(const AllocationLog&) = default;
};

/// What the runner lends a step program during one micro-step.
class StepHost {
 public:
  /// The micro-step enters `phase` (the backend's per-phase peaks; fault injection in tests).
  virtual void enter(TrialPhase phase) = 0;
  /// 0-based index of the micro-batch within its optimizer step.
  virtual int microBatchIndex() const = 0;
  /// The memory backend's allocation log and refusal count.
  virtual AllocationLog& allocationLog() = 0;

 protected:
  StepHost() = default;
  ~StepHost() = default;
  StepHost(const StepHost&) = default;
  StepHost& operator=(const StepHost&) = default;
};

/// What a step program is loaded for: the runner's spec (it outlives the program) and its
/// device, the index resolved.
struct StepSetup {
  const TrainingSpec& spec;
  at::Device device;
};

/// One model in one format, ready to run training micro-steps (see the file comment).
class StepProgram {
 public:
  StepProgram() = default;
  virtual ~StepProgram() = default;
  StepProgram(const StepProgram&) = delete;
  StepProgram& operator=(const StepProgram&) = delete;

  /// The format's description: name, CPU-only, capabilities.
  virtual const ModelFormat& format() const = 0;
  /// The model's parameters (trained ones have requires_grad) and buffers, the tensors the
  /// runner snapshots, counts and hands to the optimizer (it removes duplicates).
  virtual std::vector<at::Tensor> parameters() const = 0;
  virtual std::vector<at::Tensor> buffers() const = 0;
  /// One spec per model input, batch dimension left out (flags, else the file's).
  virtual const std::vector<InputSpec>& inputs() const = 0;
  /// Inputs fed after the model's, drawn like them: a package's loss targets. Empty where the
  /// loss draws its own targets from the output (TorchScript).
  virtual const std::vector<InputSpec>& targets() const = 0;
  virtual LossKind loss() const = 0;
  /// Why the format cannot run micro-batch `batch` (pt2: outside its compiled batch range), a
  /// size limit of the model; "" when it can.
  virtual std::string batchOutOfRange(std::int64_t batch) const = 0;
  /// What the user should know about the model's figures (TrialRunner::modelWarnings).
  virtual std::vector<std::string> warnings() const = 0;
  /// True when the model is the caller's: a dtype cast is undone when the runner ends.
  virtual bool borrowed() const = 0;
  /// Casts the model's floating tensors to `dtype` (precision fp16 / bf16), once, after the
  /// runner's snapshot of their values.
  virtual void castTo(at::ScalarType dtype) = 0;
  /// Before a trial: training mode, the largest output forgotten.
  virtual void beginTrial() = 0;
  /// After a trial, and when the runner ends: the training mode as the model came.
  virtual void endTrial() = 0;
  /// One micro-step of `batch` samples: forward, loss and backward, the gradients added into the
  /// trained parameters' .grad (created by the first micro-step), each phase announced to `host`
  /// first. `args`: the model's inputs then targets(), [batch, sample...], on the device (the
  /// runner holds them too, as a loop's variables). `gen`: the trial's generator, for values the
  /// loss draws. Every other tensor of the step dies with the call, except what releaseHeld()
  /// drops. Throws: out of memory as c10::OutOfMemoryError; autobatch::Error for an output the
  /// loss cannot use; the model's own errors unchanged.
  virtual void microStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& gen,
                         StepHost& host) = 0;
  /// One evaluation batch of `batch` samples (TrialRunner::runEval): the model in eval mode, its
  /// forward and the loss under inference mode (no autograd graph, no gradient), the training
  /// precision's autocast, each phase announced to `host`. The output is kept until the next
  /// evaluation batch's forward has returned (a loop's `logits = model(x)`), then replaced;
  /// releaseHeld() drops it. Asked only where format().capabilities.evaluation_forward.
  /// Throws: as microStep; autobatch::Error where the format cannot evaluate (the default).
  virtual void evalStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& gen,
                        StepHost& host);
  /// What the user should know about evaluation trials of this model: a traced TorchScript
  /// archive (its "autobatch/export.json" says method "trace") ignores eval(). Empty when nothing.
  virtual std::vector<std::string> evalWarnings() const { return {}; }
  /// Bytes of the largest output of this trial's micro-steps (distinct storages), also after a
  /// failed one; 0 for a format whose call returns no output.
  virtual std::int64_t outputBytes() const = 0;
  /// Drops what the step keeps between micro-batches as a loop's variables would (the output
  /// with keep_output, the loss's targets).
  virtual void releaseHeld() = 0;
};

/// Where the runner gets its step program. The format comes first (the runner checks the device
/// and installs its memory backend before anything is loaded), then the program.
class StepSource {
 public:
  virtual const ModelFormat& format() const = 0;
  /// Loads the program. Throws autobatch::Error for a file or flags the format refuses.
  virtual std::unique_ptr<StepProgram> load(const StepSetup& setup) const = 0;

 protected:
  StepSource() = default;
  ~StepSource() = default;
  StepSource(const StepSource&) = default;
  StepSource& operator=(const StepSource&) = default;
};

/// The model file at a path, in the format modelFormatAt() finds.
class FileStepSource final : public StepSource {
 public:
  explicit FileStepSource(std::string path) : path_(std::move(path)) {}
  /// Reads the archive's directory at the first call. Throws as modelFormatAt().
  const ModelFormat& format() const override;
  std::unique_ptr<StepProgram> load(const StepSetup& setup) const override;

 private:
  std::string path_;
  mutable const ModelFormat* format_ = nullptr;
};

/// Loads the TorchScript archive at setup.spec.model_path (src/probes/torchscript_step.cpp): inputs
/// and loss from the spec, else the archive's autobatch/inputs.json. Throws autobatch::Error for a
/// file that is no TorchScript archive (a torch.export program, a torch.save pickle, a truncated
/// zip), bad metadata, or a forward that takes another number of inputs.
std::unique_ptr<StepProgram> loadTorchScriptStep(const StepSetup& setup);

/// Loads the pt2 package at setup.spec.model_path (src/probes/pt2_step.cpp). Throws
/// autobatch::Error for a package Pt2Package refuses and for --input, --loss or --precision other
/// than the package's.
std::unique_ptr<StepProgram> loadPt2Step(const StepSetup& setup);

}  // namespace autobatch::detail
