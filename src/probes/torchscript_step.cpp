// The TorchScript format's step program (step_program.h): a torch::jit::Module, loaded from an
// archive or borrowed from the caller, trained through its forward, a loss computed here and
// autograd's backward. Also the TrialRunner constructor that borrows a module, so that the runner
// itself never names the module type.
#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/model_metadata.h"
#include "memory/storage_bytes.h"
#include "probes/eval_lifetimes.h"
#include "probes/pt2_package.h"
#include "probes/step_program.h"

namespace autobatch {
namespace detail {
namespace {

// {"version": 1, "method": "script" | "trace"}, written by scripts/autobatch_export.py.
constexpr std::string_view kExportFile = "autobatch/export.json";

/// Autocast on `device_type` to `dtype` for its lifetime (enabled = false: does nothing).
/// Restores the thread's previous autocast flag and dtype, and clears the autocast cache of
/// low-precision weight copies when the outermost autocast region ends.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, at::ScalarType dtype, bool enabled)
      : device_type_(device_type), enabled_(enabled) {
    if (!enabled_) return;
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::set_autocast_dtype(device_type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool enabled_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

// AUTOBATCH_EVAL_LIFETIMES=interpreter runs the evaluation forward as the interpreter frees its
// values (at their last use), without Python's lifetimes: a diagnostic, to measure what they add.
bool pythonLifetimesWanted() {
  const char* value = std::getenv("AUTOBATCH_EVAL_LIFETIMES");
  return value == nullptr || std::string_view(value) != "interpreter";
}

// The tensor the loss is computed from: the output, a tuple's / list's first tensor, a dict's
// "logits" (Hugging Face) or first tensor value.
std::optional<at::Tensor> firstTensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) {
      if (auto t = firstTensor(element)) return t;
    }
  }
  if (value.isList()) {
    for (const auto& element : value.toListRef()) {
      if (auto t = firstTensor(element)) return t;
    }
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    for (const auto& entry : dict) {
      if (entry.key().isString() && entry.key().toStringRef() == "logits") {
        return firstTensor(entry.value());
      }
    }
    for (const auto& entry : dict) {
      if (auto t = firstTensor(entry.value())) return t;
    }
  }
  return std::nullopt;
}

at::Tensor modelLoss(const c10::IValue& output) {
  std::optional<at::Tensor> loss;
  if (output.isTensor()) {
    loss = output.toTensor();
  } else if (output.isTuple() && !output.toTupleRef().elements().empty() &&
             output.toTupleRef().elements()[0].isTensor()) {
    loss = output.toTupleRef().elements()[0].toTensor();
  } else if (output.isGenericDict()) {
    for (const auto& entry : output.toGenericDict()) {
      if (entry.key().isString() && entry.key().toStringRef() == "loss" &&
          entry.value().isTensor()) {
        loss = entry.value().toTensor();
      }
    }
  }
  if (!loss || loss->numel() != 1) {
    throw Error(
        "loss 'model': expected forward to return the scalar loss, a tuple whose first element "
        "is it, or a dict with a \"loss\" entry, but got " +
        (loss ? "a tensor of " + std::to_string(loss->numel()) + " elements"
              : std::string("a ") + output.tagKind()) +
        "; use --loss mean, cross-entropy or mse for models that return predictions");
  }
  return loss->reshape({});
}

// Adds the storages `value` references (a tensor, or the tensors of a tuple, list or dict,
// nested) to `storages`: what keeping it alive costs.
void collectStorages(const c10::IValue& value, DistinctStorages& storages) {
  if (value.isTensor()) {
    storages.add(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) collectStorages(e, storages);
  } else if (value.isList()) {
    for (const auto& e : value.toListRef()) collectStorages(e, storages);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) collectStorages(entry.value(), storages);
  }
}

std::int64_t storageBytes(const c10::IValue& value) {
  DistinctStorages storages;
  collectStorages(value, storages);
  return storages.bytes();
}

class TorchScriptStep final : public StepProgram {
 public:
  // `metadata`: the archive's autobatch/inputs.json, when it has one.
  TorchScriptStep(torch::jit::Module module, bool borrowed,
                  const std::optional<ModelMetadata>& metadata, const StepSetup& setup)
      : spec_(setup.spec),
        device_(setup.device),
        module_(std::move(module)),
        borrowed_(borrowed),
        was_training_(module_.is_training()) {
    auto resolved = resolveInputs(spec_.inputs, spec_.loss, metadata,
                                  spec_.model_path.empty() ? "<module>" : spec_.model_path);
    inputs_ = std::move(resolved.first);
    loss_ = resolved.second;
    checkForwardArity();
  }

  const ModelFormat& format() const override { return torchScriptFormat(); }
  std::vector<at::Tensor> parameters() const override {
    std::vector<at::Tensor> out;
    for (const auto& p : module_.parameters(/*recurse=*/true)) out.push_back(p);
    return out;
  }
  std::vector<at::Tensor> buffers() const override {
    std::vector<at::Tensor> out;
    for (const auto& b : module_.buffers(/*recurse=*/true)) out.push_back(b);
    return out;
  }
  const std::vector<InputSpec>& inputs() const override { return inputs_; }
  const std::vector<InputSpec>& targets() const override { return no_targets_; }
  LossKind loss() const override { return loss_; }
  std::string batchOutOfRange(std::int64_t /*batch*/) const override { return ""; }
  std::vector<std::string> warnings() const override { return {}; }
  std::vector<std::string> evalWarnings() const override {
    if (!traced_) return {};
    return {"'" + spec_.model_path +
            "' is a traced TorchScript archive (torch.jit.trace, as its autobatch/export.json "
            "says): a traced graph ignores eval(), so its evaluation trials ran the model as "
            "traced, in training mode (dropout on, BatchNorm updating its statistics); export it "
            "with torch.jit.script (autobatch.export(..., method=\"script\")) where it scripts, "
            "for eval()'s behaviour"};
  }
  /// The archive's autobatch/export.json said method "trace".
  void setTraced(bool traced) { traced_ = traced; }
  bool borrowed() const override { return borrowed_; }
  void castTo(at::ScalarType dtype) override { module_.to(dtype); }
  void beginTrial() override {
    module_.train(true);
    output_bytes_ = 0;
  }
  void endTrial() override { module_.train(was_training_); }
  void microStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& gen,
                 StepHost& host) override;
  void evalStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& gen,
                StepHost& host) override;
  std::int64_t outputBytes() const override { return output_bytes_; }
  void releaseHeld() override {
    held_targets_ = at::Tensor();
    held_output_ = c10::IValue();
  }

 private:
  void checkForwardArity() const;
  at::Tensor computeLoss(const c10::IValue& output, at::Generator& gen);
  at::Tensor crossEntropy(const at::Tensor& out, at::Generator& gen);
  c10::IValue evalForward(std::vector<c10::IValue> values);

  TrainingSpec spec_;
  at::Device device_;
  torch::jit::Module module_;
  bool borrowed_;
  bool was_training_;
  std::vector<InputSpec> inputs_;
  std::vector<InputSpec> no_targets_;
  LossKind loss_ = LossKind::kMean;
  // A training loop's variables between micro-batches: the loss's targets, the kept output.
  at::Tensor held_targets_;
  c10::IValue held_output_;
  std::int64_t output_bytes_ = 0;  // the trial's largest output, in bytes
  bool traced_ = false;
  // The evaluation forward with Python's lifetimes (eval_lifetimes.h), made at the first
  // evaluation batch; null: run module_.forward.
  std::unique_ptr<torch::jit::GraphFunction> eval_forward_;
  bool eval_forward_made_ = false;
};

// A forward that takes another number of inputs than were given is a usage error (exit 2), told
// from its schema before any step runs; the interpreter's own message would name neither.
void TorchScriptStep::checkForwardArity() const {
  const auto method = module_.find_method("forward");
  if (!method) {
    throw Error("model '" + spec_.model_path + "': expected a forward method, but it has none");
  }
  const auto& arguments = method->function().getSchema().arguments();
  std::size_t required = 0;
  std::string names;
  for (std::size_t i = 1; i < arguments.size(); ++i) {  // argument 0 is self
    if (!arguments[i].default_value()) ++required;
    names += (names.empty() ? "" : ", ") + arguments[i].name();
  }
  const std::size_t total = arguments.empty() ? 0 : arguments.size() - 1;
  if (inputs_.size() < required || inputs_.size() > total) {
    throw Error("model '" + spec_.model_path + "': forward(" + names + ") expects " +
                (required == total ? std::to_string(total)
                                   : std::to_string(required) + " to " + std::to_string(total)) +
                " input(s), but got " + std::to_string(inputs_.size()) +
                " input spec(s); give one --input per forward argument (comma-separated)");
  }
  // Every input is a tensor passed by position: an argument that is not a tensor, or that is
  // keyword-only, cannot be fed (`forward(self, x, *, scale: float)` counted 2 inputs and failed
  // at micro-batch 1 with "Expected a value of type 'float'", exit 1); one left to its default is
  // not fed at all.
  for (std::size_t i = 1; i < arguments.size(); ++i) {
    const c10::Argument& a = arguments[i];
    const bool fed = i <= inputs_.size();
    if (!fed && a.default_value()) continue;
    const auto& type = a.type();
    const auto tensor = c10::TensorType::get();
    const auto optional = type->cast<c10::OptionalType>();
    const bool takes_tensor =
        type->isSubtypeOf(*tensor) ||
        (optional != nullptr && optional->getElementType()->isSubtypeOf(*tensor));
    if (takes_tensor && !a.kwarg_only()) continue;
    throw Error("model '" + spec_.model_path + "': forward argument '" + a.name() + "' is " +
                (a.kwarg_only() ? "keyword-only, of type " : "of type ") + type->annotation_str() +
                ", but autobatch passes forward tensors only, by position (one --input each); "
                "give '" +
                a.name() +
                "' a default value in the model, or export a wrapper whose "
                "forward takes tensors only and passes it");
  }
}

at::Tensor TorchScriptStep::crossEntropy(const at::Tensor& out, at::Generator& gen) {
  if (out.dim() < 1 || out.size(-1) < 1) {
    throw Error(
        "loss 'cross-entropy': expected an output whose last dimension holds the class scores, "
        "but got shape " +
        c10::str(out.sizes()));
  }
  const std::int64_t classes = out.size(-1);
  const at::Tensor logits = out.reshape({-1, classes});
  at::Tensor targets = at::empty({logits.size(0)}, at::TensorOptions().dtype(at::kLong));
  targets.random_(0, classes, gen);
  if (!device_.is_cpu()) targets = targets.to(device_);
  held_targets_ = targets;  // a loop's `y`
  return at::cross_entropy_loss(logits, targets);
}

at::Tensor TorchScriptStep::computeLoss(const c10::IValue& output, at::Generator& gen) {
  if (loss_ == LossKind::kModel) return modelLoss(output);
  const auto out = firstTensor(output);
  if (!out) {
    throw Error(std::string("loss '") + std::string(toString(loss_)) +
                "': expected forward to return a tensor (or a tuple/list/dict holding one), "
                "but got a " +
                output.tagKind());
  }
  if (!out->is_floating_point()) {
    throw Error("model '" + spec_.model_path +
                "': expected a floating-point output to train through, but forward returned " +
                std::string(c10::toString(out->scalar_type())) +
                "; no backward is possible (return logits or scores, not ids)");
  }
  switch (loss_) {
    case LossKind::kCrossEntropy:
      return crossEntropy(*out, gen);
    case LossKind::kMse: {
      at::Tensor target = at::empty(out->sizes(), out->options().device(torch::kCPU));
      target.normal_(0.0, 1.0, gen);
      if (!device_.is_cpu()) target = target.to(device_);
      held_targets_ = target;  // a loop's `y`
      return at::mse_loss(*out, target);
    }
    case LossKind::kMean:
    case LossKind::kModel:
      break;
  }
  return out->mean();
}

void TorchScriptStep::microStep(std::int64_t /*batch*/, std::vector<at::Tensor> args,
                                at::Generator& gen, StepHost& host) {
  std::vector<c10::IValue> values(args.begin(), args.end());
  args.clear();
  at::Tensor loss_value;
  {
    const bool amp =
        spec_.precision == Precision::kAmpFp16 || spec_.precision == Precision::kAmpBf16;
    const AutocastGuard autocast(
        device_.type(), spec_.precision == Precision::kAmpFp16 ? at::kHalf : at::kBFloat16, amp);
    host.enter(TrialPhase::kForward);
    const c10::IValue output = module_.forward(values);
    // `logits = model(x)` kept in a variable: the previous micro-batch's output goes only now.
    if (spec_.keep_output) held_output_ = output;
    output_bytes_ = std::max(output_bytes_, storageBytes(output));
    host.enter(TrialPhase::kLoss);
    loss_value = computeLoss(output, gen);
  }
  values.clear();
  if (!loss_value.requires_grad()) {
    throw Error("model '" + spec_.model_path +
                "': expected a loss that depends on the trained parameters, but it does not "
                "require grad (is forward detached, or run under no_grad?)");
  }
  host.enter(TrialPhase::kBackward);
  loss_value.backward();
}

// An evaluation batch: eval mode (dropout off, BatchNorm's running statistics read, not
// updated), inference mode (no graph, no gradient), the training precision's autocast; the
// previous batch's output is replaced only once this batch's forward has returned.
void TorchScriptStep::evalStep(std::int64_t /*batch*/, std::vector<at::Tensor> args,
                               at::Generator& gen, StepHost& host) {
  std::vector<c10::IValue> values(args.begin(), args.end());
  args.clear();
  module_.train(false);
  const c10::InferenceMode inference;
  const bool amp = spec_.precision == Precision::kAmpFp16 || spec_.precision == Precision::kAmpBf16;
  const AutocastGuard autocast(
      device_.type(), spec_.precision == Precision::kAmpFp16 ? at::kHalf : at::kBFloat16, amp);
  host.enter(TrialPhase::kForward);
  c10::IValue output = evalForward(values);
  values.clear();
  held_output_ = output;  // `logits = model(x)`: the previous batch's output goes only now
  output_bytes_ = std::max(output_bytes_, storageBytes(output));
  host.enter(TrialPhase::kLoss);
  const at::Tensor loss_value = computeLoss(output, gen);
}

// The evaluation forward as a Python frame runs it: values bound to locals live to their rebinding
// or the frame's return (eval_lifetimes.h). A traced archive's graph names few Python locals, so it
// runs as the interpreter does (docs/evaluation.md).
c10::IValue TorchScriptStep::evalForward(std::vector<c10::IValue> values) {
  if (!eval_forward_made_) {
    eval_forward_made_ = true;
    if (!traced_ && pythonLifetimesWanted()) {
      eval_forward_ = pythonLifetimeForward(module_).function;
    }
  }
  if (!eval_forward_) return module_.forward(std::move(values));
  // The schema fills in forward's default arguments, as Module::forward does.
  values.insert(values.begin(), module_._ivalue());
  module_.get_method("forward").function().getSchema().checkAndNormalizeInputs(values, {});
  eval_forward_->run(values);
  return values.front();
}

torch::jit::Module loadArchive(const std::string& path, const at::Device& device,
                               torch::jit::ExtraFilesMap& extra) {
  checkModelFile(path);
  if (isExportProgram(path)) {
    throw Error("model file '" + path +
                "': expected a TorchScript archive or a compiled training-step package, but it "
                "is a torch.export program (torch.export.save), which holds no code to run; "
                "export the model with scripts/autobatch_export.py --format pt2 (a compiled "
                "package of one training step) or as TorchScript");
  }
  try {
    // Loaded outside the budget, then counted as baseline by the runner: a model larger than the
    // limit is then a search that finds nothing fits (exit 3, with the need), not an allocator
    // error in the middle of unpickling.
    const UntrackedCpuScope untracked;
    return torch::jit::load(path, device, extra);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    // The reader's own text blames the file; say which of the common cases it is.
    std::string found = "torch::jit::load failed";
    if (message.find("constants.pkl") != std::string::npos) {
      found =
          "it holds no TorchScript code: it was written by torch.save (a pickled module or a "
          "state_dict), not torch.jit.save";
    } else if (message.find("central directory") != std::string::npos) {
      found = "the zip archive is truncated or corrupt";
    }
    throw Error("model file '" + path + "': expected a TorchScript archive, but " + found + " (" +
                message.substr(0, message.find(". This is an internal")) + "); " +
                std::string(kExportAdvice));
  }
}

// A module the caller loaded: borrowed, its inputs from the spec.
class BorrowedModuleSource final : public StepSource {
 public:
  explicit BorrowedModuleSource(torch::jit::Module& module) : module_(module) {}
  const ModelFormat& format() const override { return torchScriptFormat(); }
  std::unique_ptr<StepProgram> load(const StepSetup& setup) const override {
    return std::make_unique<TorchScriptStep>(module_, /*borrowed=*/true, std::nullopt, setup);
  }

 private:
  torch::jit::Module& module_;
};

}  // namespace

std::unique_ptr<StepProgram> loadTorchScriptStep(const StepSetup& setup) {
  const std::string& path = setup.spec.model_path;
  torch::jit::ExtraFilesMap extra{{std::string(kModelMetadataFile), ""},
                                  {std::string(kExportFile), ""}};
  torch::jit::Module module = loadArchive(path, setup.device, extra);
  std::optional<ModelMetadata> metadata;
  const std::string& text = extra[std::string(kModelMetadataFile)];
  if (!text.empty()) metadata = parseModelMetadata(text, path);
  auto step =
      std::make_unique<TorchScriptStep>(std::move(module), /*borrowed=*/false, metadata, setup);
  // How the archive was made (scripts/autobatch_export.py); read loosely: any other text, or
  // none, is a scripted or unknown archive.
  step->setTraced(extra[std::string(kExportFile)].find("\"trace\"") != std::string::npos);
  return step;
}

}  // namespace detail

TrialRunner::TrialRunner(torch::jit::Module& module, const TrainingSpec& spec,
                         const SearchOptions& options)
    : TrialRunner(spec, options, [&]() -> detail::BorrowedModuleSource {
        if (spec.inputs.empty()) {
          throw Error(
              "module: expected TrainingSpec::inputs (one spec per forward argument), but got "
              "none; a module given in memory has no archive to read autobatch/inputs.json "
              "from");
        }
        return detail::BorrowedModuleSource(module);
      }()) {}

}  // namespace autobatch
