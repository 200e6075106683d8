#include "autobatch/trial_runner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ScopeExit.h>
#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autobatch/error.h"
#include "autobatch/failure.h"
#include "autobatch/model_metadata.h"
#include "cuda_api.h"
#include "cuda_device.h"
#include "memory_backend.h"
#include "optimizers.h"
#include "pt2_package.h"

namespace autobatch {
namespace {

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

/// Saves the default generators' states (dropout draws from them) and restores them: the CPU's,
/// and the device's own when the trial runs on CUDA (through at::globalContext(), so this file
/// needs no CUDA header; a CUDA generator's state is a small CPU tensor of seed and offset).
class RngStateGuard {
 public:
  explicit RngStateGuard(const at::Device& device) {
    const detail::UntrackedCpuScope untracked;
    save(at::globalContext().defaultGenerator(at::Device(at::kCPU)));
    if (device.is_cuda()) save(at::globalContext().defaultGenerator(device));
  }
  ~RngStateGuard() {
    for (auto& [gen, state] : saved_) {
      const std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  void save(at::Generator gen) {
    const std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor state = gen.get_state();
    saved_.emplace_back(std::move(gen), std::move(state));
  }
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

/// Logs while a trial runs, so that a long one never looks like a hang: each step's end (info
/// when the step took a second or more, else debug) and, during a step longer than 10 s, a line
/// every 10 s with the elapsed time, from a thread of its own (spdlog loggers used with it must be
/// thread-safe: the CLI's is). The thread has a 256 KiB stack (a default 8 MiB one counts against
/// RLIMIT_DATA, under which trials may run); when it cannot be created (a process limit), only the
/// step ends are logged. The thread ends with the object.
class StepProgress {
 public:
  StepProgress(std::int64_t batch, int micro_batches, int steps)
      : batch_(batch), micro_batches_(micro_batches), steps_(steps) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return;
    pthread_attr_setstacksize(&attr, std::size_t{256} << 10);
    started_ = pthread_create(&thread_, &attr, &StepProgress::run, this) == 0;
    pthread_attr_destroy(&attr);
    if (!started_) spdlog::debug("no progress thread for this trial: pthread_create failed");
  }
  ~StepProgress() {
    if (!started_) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    pthread_join(thread_, nullptr);
  }
  StepProgress(const StepProgress&) = delete;
  StepProgress& operator=(const StepProgress&) = delete;

  void beginStep(int step) {
    const std::lock_guard<std::mutex> lock(mutex_);
    step_ = step;
    step_start_ = Clock::now();
    in_step_ = true;
  }
  void endStep(double step_ms) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      in_step_ = false;
    }
    const auto level = step_ms >= 1000.0 ? spdlog::level::info : spdlog::level::debug;
    spdlog::log(level, "trial of micro-batch {} x {}: step {}/{} done in {:.1f} s", batch_,
                micro_batches_, step_ + 1, steps_, step_ms / 1000.0);
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kEvery{10};

  static void* run(void* self) {
    static_cast<StepProgress*>(self)->watch();
    return nullptr;
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, kEvery, [this] { return stop_; });
      if (stop_ || !in_step_) continue;
      const double elapsed_s = std::chrono::duration<double>(Clock::now() - step_start_).count();
      if (elapsed_s >= static_cast<double>(kEvery.count())) {
        spdlog::info("trial of micro-batch {} x {}: step {}/{} running for {:.0f} s", batch_,
                     micro_batches_, step_ + 1, steps_, elapsed_s);
      }
    }
  }

  std::int64_t batch_;
  int micro_batches_;
  int steps_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool in_step_ = false;
  int step_ = 0;
  Clock::time_point step_start_;
  pthread_t thread_{};
  bool started_ = false;
};

std::string formatInputSpecs(const std::vector<InputSpec>& specs) {
  std::string out;
  for (const auto& spec : specs) out += (out.empty() ? "" : ",") + toString(spec);
  return "'" + out + "'";
}

at::ScalarType toScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kInt64:
      return at::kLong;
    case DType::kInt32:
      return at::kInt;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

// "cuda" becomes cuda:<current device> here, once: every later use (the device check of the
// model's tensors, the limit, statistics, fraction, guards, RNG and the report) sees one index.
torch::Device parseDevice(const std::string& text) {
  if (text != "cpu" && text != "cuda" && text.rfind("cuda:", 0) != 0) {
    throw Error("device: expected cpu, cuda or cuda:N, but got '" + text + "'");
  }
  const std::string resolved =
      detail::resolveDeviceName(text, text == "cuda" ? detail::cudaCurrentDevice() : 0);
  try {
    return {resolved};
  } catch (const c10::Error&) {
    throw Error("device: expected cpu, cuda or cuda:N, but got '" + text + "'");
  }
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

std::int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

// Bytes of the distinct storages `value` references (a tensor, or the tensors of a tuple, list or
// dict, nested): what keeping it alive costs.
void collectStorages(const c10::IValue& value, std::unordered_set<const void*>& seen,
                     std::int64_t& bytes) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || !t.has_storage()) return;
    const void* data = t.storage().data();
    if (data != nullptr && seen.insert(data).second) {
      bytes += static_cast<std::int64_t>(t.storage().nbytes());
    }
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) collectStorages(e, seen, bytes);
  } else if (value.isList()) {
    for (const auto& e : value.toListRef()) collectStorages(e, seen, bytes);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) collectStorages(entry.value(), seen, bytes);
  }
}

std::int64_t storageBytes(const c10::IValue& value) {
  std::unordered_set<const void*> seen;
  std::int64_t bytes = 0;
  collectStorages(value, seen, bytes);
  return bytes;
}

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

struct TrialRunner::Impl {
  TrainingSpec spec;
  std::int64_t reserve_bytes = 0;
  torch::Device device{torch::kCPU};
  bool saved_rethrow = false;
  bool saved_cudnn_benchmark = false;
  // Destroyed after the module and the snapshot (declared first).
  std::unique_ptr<detail::MemoryBackend> backend;
  torch::jit::Module module;  // a handle: owned (loaded) or the caller's; unused for a package
  bool borrowed = false;
  // The pt2 format (pt2_package.h): set instead of `module` when the model file is a package.
  std::unique_ptr<detail::Pt2Package> package;
  std::vector<InputSpec> package_targets;  // the package's loss targets (inputs after the model's)
  bool was_training = true;
  struct Saved {
    at::Tensor live;  // the module's tensor (same TensorImpl)
    at::Tensor host;  // its value at setup, on the CPU, not counted by the budget
  };
  std::vector<Saved> saved;
  std::vector<at::Tensor> trained;
  std::int64_t parameter_bytes = 0;
  std::vector<InputSpec> inputs;
  LossKind loss = LossKind::kMean;
  std::int64_t baseline_bytes = 0;
  std::int64_t last_oom_batch = 0;
  // The largest micro-batch seen to fit (with its micro-batches per step): where an ambiguous
  // failure is re-run to classify it.
  std::int64_t largest_fit_batch = 0;
  int largest_fit_micro_batches = 1;
  bool classifying = false;  // inside a re-run to classify: no nested re-run
  // A fatal device error (sticky CUDA error) was seen: no device work any more, not even in the
  // destructor (a weight restore on a dead context throws, and from a destructor that terminates).
  bool poisoned = false;
  std::int64_t ddp_bucket_bytes = 0;
  OptimizerImpl optimizer_impl = OptimizerImpl::kLoop;  // spec.optimizer_impl, auto resolved
  // A training loop's variables between micro-batches (inputs, targets, kept output).
  std::vector<c10::IValue> held_inputs;
  at::Tensor held_targets;
  c10::IValue held_output;
  std::int64_t output_bytes = 0;  // the trial's largest output, in bytes
  int trials_run = 0;
  detail::TrialPoint point;  // where the trial in progress is (fault injection in tests)

  void enter(detail::TrialPhase phase) {
    point.phase = phase;
    detail::setTrialPoint(point);
    if (!poisoned) backend->enterPhase(phase, point.micro_batch_index);
  }

  Impl(TrainingSpec given_spec, const SearchOptions& options, torch::jit::Module* given)
      : spec(std::move(given_spec)) {
    if (spec.steps_per_trial < 1) {
      throw Error("steps per trial: expected >= 1, but got " +
                  std::to_string(spec.steps_per_trial));
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
    reserve_bytes = options.reserve_bytes;
    device = parseDevice(spec.device);
    const bool is_package = given == nullptr && !spec.model_path.empty() &&
                            std::filesystem::is_regular_file(spec.model_path) &&
                            detail::isAotiPackage(spec.model_path);
    if (is_package && !device.is_cpu()) {
      throw Error("model package '" + spec.model_path + "': expected --device cpu, but got " +
                  spec.device +
                  "; pt2 packages run on the CPU only until a GPU has run one (export the "
                  "TorchScript format for CUDA)");
    }
    optimizer_impl = detail::resolveOptimizerImpl(spec.optimizer_impl, device.is_cuda());
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
    saved_rethrow = FLAGS_torch_jit_enable_rethrow_caught_exception;
    FLAGS_torch_jit_enable_rethrow_caught_exception = true;  // keeps c10::OutOfMemoryError's type
    saved_cudnn_benchmark = at::globalContext().benchmarkCuDNN();
    at::globalContext().setBenchmarkCuDNN(spec.cudnn_benchmark);

    std::optional<ModelMetadata> metadata;
    if (is_package) {
      loadPackage();
    } else if (given != nullptr) {
      module = *given;
      borrowed = true;
    } else {
      torch::jit::ExtraFilesMap extra{{std::string(kModelMetadataFile), ""}};
      checkModelFile(spec.model_path);
      if (detail::isExportProgram(spec.model_path)) {
        throw Error("model file '" + spec.model_path +
                    "': expected a TorchScript archive or a compiled training-step package, but "
                    "it is a torch.export program (torch.export.save), which holds no code to "
                    "run; export the model with scripts/autobatch_export.py --format pt2 (a "
                    "compiled package of one training step) or as TorchScript");
      }
      try {
        // Loaded outside the budget, then counted as baseline by finishSetup(): a model larger
        // than the limit is then a search that finds nothing fits (exit 3, with the need), not
        // an allocator error in the middle of unpickling.
        const detail::UntrackedCpuScope untracked;
        module = torch::jit::load(spec.model_path, device, extra);
      } catch (const c10::OutOfMemoryError&) {
        throw;
      } catch (const c10::Error& e) {
        const std::string message = e.what_without_backtrace();
        // The reader's own text blames the file; say which of the common cases it is.
        std::string found = "torch::jit::load failed";
        if (message.find("constants.pkl") != std::string::npos) {
          found =
              "it holds no TorchScript code: it was written by torch.save (a pickled module "
              "or a state_dict), not torch.jit.save";
        } else if (message.find("central directory") != std::string::npos) {
          found = "the zip archive is truncated or corrupt";
        }
        throw Error("model file '" + spec.model_path + "': expected a TorchScript archive, but " +
                    found + " (" + message.substr(0, message.find(". This is an internal")) +
                    "); " + std::string(kExportAdvice));
      }
      const std::string& text = extra[std::string(kModelMetadataFile)];
      if (!text.empty()) metadata = parseModelMetadata(text, spec.model_path);
    }
    if (!package) {
      auto resolved = resolveInputs(spec.inputs, spec.loss, metadata,
                                    spec.model_path.empty() ? "<module>" : spec.model_path);
      inputs = std::move(resolved.first);
      loss = resolved.second;
      was_training = module.is_training();
      checkForwardArity();
    }

    // Host-side snapshot of every parameter and buffer (deduplicated), not counted by the budget.
    std::unordered_set<const c10::TensorImpl*> seen;
    auto remember = [&](const at::Tensor& t) {
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) return;
      const detail::UntrackedCpuScope untracked;
      saved.push_back({t, t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true)});
    };
    for (const auto& p : modelParameters()) remember(p);
    for (const auto& b : modelBuffers()) remember(b);
    for (const auto& s : saved) {
      if (s.live.device() != device) {
        throw Error("model: expected its tensors on " + device.str() + ", but got one on " +
                    s.live.device().str() + "; load it onto the device of --device");
      }
    }
    if (spec.precision == Precision::kFp16) module.to(at::kHalf);
    if (spec.precision == Precision::kBf16) module.to(at::kBFloat16);

    std::unordered_set<const c10::TensorImpl*> counted;
    for (const auto& p : modelParameters()) {
      if (!counted.insert(p.unsafeGetTensorImpl()).second) continue;
      parameter_bytes += bytesOf(p);
      if (p.requires_grad()) trained.push_back(p);
    }
    if (spec.ddp) {
      for (const auto& p : trained) ddp_bucket_bytes += bytesOf(p);
    }
    if (trained.empty()) {
      throw Error("model '" + spec.model_path +
                  "': expected parameters that require grad, but got none; autobatch sizes "
                  "training steps");
    }
    // The caller's CPU tensors were allocated before the budget allocator: count them as baseline.
    std::int64_t untracked_bytes = 0;
    if (device.is_cpu()) {
      std::unordered_set<const void*> storages;
      auto add = [&](const at::Tensor& t) {
        if (!t.defined() || !t.has_storage()) return;
        const void* data = t.storage().data();
        if (data == nullptr || !storages.insert(data).second || detail::isBudgetTracked(data)) {
          return;
        }
        untracked_bytes += static_cast<std::int64_t>(t.storage().nbytes());
      };
      for (const auto& p : modelParameters()) add(p);
      for (const auto& b : modelBuffers()) add(b);
    }
    if (backend->needsWarmUp()) warmUp(std::max<std::int64_t>(options.min_batch, 1));
    backend->finishSetup(untracked_bytes);
    baseline_bytes = backend->currentBytes();
    // Said before the trials run, not only in the report: a --memory-limit clipped to the room.
    for (const auto& warning : backend->limitWarnings()) spdlog::warn("{}", warning);
  }

  ~Impl() {
    if (!poisoned) {
      try {
        restoreWeights();
        if (borrowed) {
          // Undo an fp16/bf16 cast on the caller's module, without counting the restored tensors.
          const detail::UntrackedCpuScope untracked;
          const at::NoGradGuard no_grad;
          for (auto& s : saved) {
            if (s.live.scalar_type() != s.host.scalar_type()) s.live.set_data(s.host.to(device));
          }
        }
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
    if (!package) module.train(was_training);
    at::globalContext().setBenchmarkCuDNN(saved_cudnn_benchmark);
    FLAGS_torch_jit_enable_rethrow_caught_exception = saved_rethrow;
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  std::vector<at::Tensor> modelParameters() const {
    if (package) return package->parameters();
    std::vector<at::Tensor> out;
    for (const auto& p : module.parameters(/*recurse=*/true)) out.push_back(p);
    return out;
  }
  std::vector<at::Tensor> modelBuffers() const {
    if (package) return package->buffers();
    std::vector<at::Tensor> out;
    for (const auto& b : module.buffers(/*recurse=*/true)) out.push_back(b);
    return out;
  }

  // A pt2 package (pt2_package.h): inputs, loss and precision are fixed at export; flags that
  // contradict them are usage errors naming the package's value. Loaded outside the budget and
  // counted as baseline, as a TorchScript model is.
  void loadPackage() {
    {
      const detail::UntrackedCpuScope untracked;
      package = std::make_unique<detail::Pt2Package>(spec.model_path);
    }
    const detail::Pt2Metadata& m = package->metadata();
    const std::string where = "model package '" + spec.model_path + "': ";
    if (!spec.inputs.empty() && spec.inputs != m.inputs) {
      throw Error(where + "its inputs are fixed at export to " + formatInputSpecs(m.inputs) +
                  ", but --input gave " + formatInputSpecs(spec.inputs) +
                  "; leave --input out (or export again with the new inputs)");
    }
    if (spec.loss && *spec.loss != m.loss) {
      throw Error(where + "its loss is fixed at export to " + std::string(toString(m.loss)) +
                  ", but --loss gave " + std::string(toString(*spec.loss)) +
                  "; leave --loss out (or export again)");
    }
    if (spec.precision != Precision::kFp32) {
      throw Error(where + "its precision is fixed at export to fp32, but --precision gave " +
                  std::string(toString(spec.precision)) + "; packages are fp32 only for now");
    }
    inputs = m.inputs;
    package_targets = m.targets;
    loss = m.loss;
    was_training = true;
  }

  // A forward that takes another number of inputs than were given is a usage error (exit 2),
  // told from its schema before any step runs; the interpreter's own message would name neither.
  void checkForwardArity() const {
    const auto method = module.find_method("forward");
    if (!method) {
      throw Error("model '" + spec.model_path + "': expected a forward method, but it has none");
    }
    const auto& arguments = method->function().getSchema().arguments();
    std::size_t required = 0;
    std::string names;
    for (std::size_t i = 1; i < arguments.size(); ++i) {  // argument 0 is self
      if (!arguments[i].default_value()) ++required;
      names += (names.empty() ? "" : ", ") + arguments[i].name();
    }
    const std::size_t total = arguments.empty() ? 0 : arguments.size() - 1;
    if (inputs.size() < required || inputs.size() > total) {
      throw Error("model '" + spec.model_path + "': forward(" + names + ") expects " +
                  (required == total ? std::to_string(total)
                                     : std::to_string(required) + " to " + std::to_string(total)) +
                  " input(s), but got " + std::to_string(inputs.size()) +
                  " input spec(s); give one --input per forward argument (comma-separated)");
    }
  }

  void restoreWeights() {
    const at::NoGradGuard no_grad;
    for (auto& s : saved) s.live.copy_(s.host);
  }

  // optimizer.zero_grad(set_to_none=...): kNone drops every gradient; kZeros keeps them
  // allocated, zero-filled and detached (torch/optim/optimizer.py, zero_grad).
  void zeroGrad(ZeroGrad mode) {
    for (auto& p : trained) {
      if (mode == ZeroGrad::kNone || !p.grad().defined()) {
        p.mutable_grad() = at::Tensor();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
  }

  // What a training loop's variables hold between its micro-batches, released at the trial's end.
  void releaseHeld() {
    held_inputs.clear();
    held_targets = at::Tensor();
    held_output = c10::IValue();
  }

  std::unique_ptr<detail::TrialOptimizer> makeOptimizer() const {
    return detail::makeTrialOptimizer(spec.optimizer, optimizer_impl, trained, spec.learning_rate);
  }

  at::ScalarType modelFloatType() const {
    if (spec.precision == Precision::kFp16) return at::kHalf;
    if (spec.precision == Precision::kBf16) return at::kBFloat16;
    return at::kFloat;
  }

  // The dtype an input is fed in: a float32 input of an fp16/bf16 model in the model's, as the
  // job would.
  at::ScalarType inputType(const InputSpec& input) const {
    const at::ScalarType type = toScalarType(input.dtype);
    return type == at::kFloat ? modelFloatType() : type;
  }

  // A micro-batch's inputs are sized before any is allocated (the one place they are): when their
  // bytes pass INT64_MAX or the room under the limit, the micro-batch is out of memory, a trial
  // result like any refused allocation. ATen would otherwise throw "Storage size calculation
  // overflowed" (exit 1 for --check-batch 1099511627776 at 3x1024x1024), and a size near 2^63
  // reached the allocator ("bool:9223372036854775807": exit 1 with a C++ backtrace; issue 27,
  // row 13). The inputs alone needing more than the limit is a sound out of memory for the batch.
  void checkInputBytes(std::int64_t batch, const std::vector<InputSpec>& step_inputs) const {
    std::int64_t total = 0;
    bool overflows = false;
    auto add = [&](const InputSpec& input) {
      const auto bytes =
          batchBytes(input, batch, static_cast<std::int64_t>(c10::elementSize(inputType(input))));
      if (!bytes || *bytes > std::numeric_limits<std::int64_t>::max() - total) {
        overflows = true;
      } else {
        total += *bytes;
      }
    };
    for (const auto& input : step_inputs) add(input);
    if (package) {
      for (const auto& target : package_targets) add(target);
    }
    const std::int64_t in_use = backend->currentBytes();
    const std::int64_t budget = backend->limitBytes() - reserve_bytes;
    if (!overflows && total <= budget - in_use) return;
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "out of memory: the inputs of micro-batch ", batch,
        " would allocate ", overflows ? std::numeric_limits<std::int64_t>::max() : total,
        " bytes with ", in_use, " bytes in use under a limit of ", budget, " bytes",
        overflows ? " (more than that: their size passes 2^63 - 1 bytes), so no allocator can "
                    "hold them"
                  : "; not allocated");
  }

  at::Tensor makeInput(const InputSpec& input, std::int64_t batch, at::Generator& gen) const {
    std::vector<std::int64_t> shape{batch};
    shape.insert(shape.end(), input.sample_shape.begin(), input.sample_shape.end());
    const at::ScalarType type = inputType(input);
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    if (isIntegral(input.dtype)) {
      t.random_(input.low, input.high, gen);
    } else {
      t.normal_(0.0, 1.0, gen);
    }
    return device.is_cpu() ? t : t.to(device);
  }

  at::Tensor computeLoss(const c10::IValue& output, at::Generator& gen) {
    if (loss == LossKind::kModel) return modelLoss(output);
    const auto out = firstTensor(output);
    if (!out) {
      throw Error(std::string("loss '") + std::string(toString(loss)) +
                  "': expected forward to return a tensor (or a tuple/list/dict holding one), "
                  "but got a " +
                  output.tagKind());
    }
    if (!out->is_floating_point()) {
      throw Error("model '" + spec.model_path +
                  "': expected a floating-point output to train through, but forward returned " +
                  std::string(c10::toString(out->scalar_type())) +
                  "; no backward is possible (return logits or scores, not ids)");
    }
    switch (loss) {
      case LossKind::kCrossEntropy: {
        if (out->dim() < 1 || out->size(-1) < 1) {
          throw Error(
              "loss 'cross-entropy': expected an output whose last dimension holds the "
              "class scores, but got shape " +
              c10::str(out->sizes()));
        }
        const std::int64_t classes = out->size(-1);
        const at::Tensor logits = out->reshape({-1, classes});
        at::Tensor targets = at::empty({logits.size(0)}, at::TensorOptions().dtype(at::kLong));
        targets.random_(0, classes, gen);
        if (!device.is_cpu()) targets = targets.to(device);
        held_targets = targets;  // a loop's `y`
        return at::cross_entropy_loss(logits, targets);
      }
      case LossKind::kMse: {
        at::Tensor target = at::empty(out->sizes(), out->options().device(torch::kCPU));
        target.normal_(0.0, 1.0, gen);
        if (!device.is_cpu()) target = target.to(device);
        held_targets = target;  // a loop's `y`
        return at::mse_loss(*out, target);
      }
      case LossKind::kMean:
      case LossKind::kModel:
        break;
    }
    return out->mean();
  }

  // One forward/loss/backward of `batch` samples; every tensor of it dies with this frame.
  void microStep(std::int64_t batch, const std::vector<InputSpec>& step_inputs,
                 at::Generator& gen) {
    if (package) {
      packageMicroStep(batch, step_inputs, gen);
      return;
    }
    enter(detail::TrialPhase::kInputs);
    checkInputBytes(batch, step_inputs);
    std::vector<c10::IValue> args;
    args.reserve(step_inputs.size());
    for (const auto& input : step_inputs) args.emplace_back(makeInput(input, batch, gen));
    held_inputs = args;  // a loop's `x` holds them until the next micro-batch's are made
    at::Tensor loss_value;
    {
      const bool amp =
          spec.precision == Precision::kAmpFp16 || spec.precision == Precision::kAmpBf16;
      const AutocastGuard autocast(
          device.type(), spec.precision == Precision::kAmpFp16 ? at::kHalf : at::kBFloat16, amp);
      enter(detail::TrialPhase::kForward);
      const c10::IValue output = module.forward(args);
      // `logits = model(x)` kept in a variable: the previous micro-batch's output goes only now.
      if (spec.keep_output) held_output = output;
      output_bytes = std::max(output_bytes, storageBytes(output));
      enter(detail::TrialPhase::kLoss);
      loss_value = computeLoss(output, gen);
    }
    args.clear();
    if (!loss_value.requires_grad()) {
      throw Error("model '" + spec.model_path +
                  "': expected a loss that depends on the trained parameters, but it does not "
                  "require grad (is forward detached, or run under no_grad?)");
    }
    enter(detail::TrialPhase::kBackward);
    loss_value.backward();
  }

  // One micro-batch of a package: its inputs and targets, then one call. Without gradients yet, the
  // call returns the loss and the gradients, which become the parameters' (no copy, as autograd's
  // first accumulation; a tied copy's is added in and freed at once). With gradients there, the
  // package's accumulating model adds into them inside the call (a package without one: the
  // returned gradients are added in and freed at once).
  // An allocation refused inside the call comes back as a plain error from the loader: the budget
  // allocator's count of refusals tells it was out of memory, and its message is rethrown as the
  // OutOfMemoryError it was.
  void packageMicroStep(std::int64_t batch, const std::vector<InputSpec>& step_inputs,
                        at::Generator& gen) {
    enter(detail::TrialPhase::kInputs);
    checkInputBytes(batch, step_inputs);
    std::vector<at::Tensor> args;
    args.reserve(step_inputs.size() + package_targets.size());
    for (const auto& input : step_inputs) args.push_back(makeInput(input, batch, gen));
    for (const auto& target : package_targets) args.push_back(makeInput(target, batch, gen));
    held_inputs.assign(args.begin(), args.end());  // a loop's `x, y`
    enter(detail::TrialPhase::kForwardBackward);
    // A batch the eager step refuses (BatchNorm at batch 1): the error the eager job would raise,
    // a model error like TorchScript's, never out of memory.
    const std::string eager_error = package->eagerStepError(batch);
    TORCH_CHECK(eager_error.empty(), eager_error);
    std::vector<at::Tensor> outputs;
    const std::uint64_t refusals_before = detail::budgetRefusals().first;
    // Gradients already there (a later micro-batch, or zero_grad to zeros): the accumulating
    // model adds into them inside the call, as an eager backward does.
    const bool accumulate = package->canAccumulate();
    // The call's allocations, to measure it less the gradients it returns (kCallActivations).
    const std::int64_t held_at_call = detail::startAllocationLog();
    bool logging = true;
    const auto stop_log = c10::make_scope_exit([&] {
      if (logging) detail::stopAllocationLog();
    });
    try {
      if (accumulate) {
        package->runAccumulating(args);
      } else {
        outputs = package->run(args);
      }
      logging = false;
      recordCallActivations(held_at_call, detail::stopAllocationLog(), outputs);
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const std::exception& e) {
      const auto [refusals, message] = detail::budgetRefusals();
      if (refusals != refusals_before) {
        spdlog::debug("package call failed after a refused allocation: {}", e.what());
        TORCH_CHECK_WITH(OutOfMemoryError, false, message);
      }
      throw;
    }
    args.clear();
    if (accumulate) return;
    const auto& owners = package->gradientOwners();
    if (outputs.size() != owners.size() + 1) {
      throw Error("model package '" + spec.model_path + "': expected the loss and " +
                  std::to_string(owners.size()) + " gradients from its call, but got " +
                  std::to_string(outputs.size()) + " outputs");
    }
    const at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < owners.size(); ++i) {
      at::Tensor& grad = package->parameters()[owners[i]].mutable_grad();
      at::Tensor& produced = outputs[i + 1];
      if (!grad.defined()) {
        grad = produced;
      } else {
        grad.add_(produced);
      }
      produced = at::Tensor();
    }
  }

  // The peak of a package's call counting none of the tensors it returned (the gradients): the
  // bytes held at its start plus the largest sum of its other allocations alive at once, from the
  // budget allocator's log of the call. At small batches forward-backward peaks at the end of the
  // backward with every gradient held and reads flat from batch 1 to 2 (ResNet-18 at 3x64x64:
  // 0.43 MiB per sample where 12 to 22 gives 1.6); this measure grows with the activations, as
  // eager's forward phase does, and the search bounds forward-backward's slope by it.
  void recordCallActivations(std::int64_t held_at_call,
                             const std::vector<detail::AllocationEvent>& log,
                             const std::vector<at::Tensor>& returned) const {
    if (log.empty()) return;  // not the budget allocator: nothing was seen
    std::unordered_set<const void*> kept;
    for (const auto& t : returned) {
      if (t.defined()) kept.insert(t.storage().data());
    }
    // A returned tensor's allocation is the last one at its address (an earlier allocation there
    // was freed inside the call and counts).
    std::unordered_map<const void*, std::size_t> last_allocation;
    for (std::size_t i = 0; i < log.size(); ++i) {
      if (log[i].bytes > 0 && kept.contains(log[i].data)) last_allocation[log[i].data] = i;
    }
    std::int64_t live = 0;
    std::int64_t top = 0;
    for (std::size_t i = 0; i < log.size(); ++i) {
      const auto it = last_allocation.find(log[i].data);
      if (it != last_allocation.end() && it->second == i) continue;
      live += log[i].bytes;
      top = std::max(top, live);
    }
    detail::recordBudgetPhasePeak(detail::TrialPhase::kCallActivations, point.micro_batch_index,
                                  held_at_call + top);
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
    last_oom_batch = 0;
    largest_fit_batch = 0;
  }

  TrialResult run(const TrialRequest& request) {
    if (request.micro_batch_size < 1 || request.micro_batches_per_step < 1) {
      throw Error(
          "trial: expected micro_batch_size >= 1 and micro_batches_per_step >= 1, but "
          "got " +
          std::to_string(request.micro_batch_size) + " and " +
          std::to_string(request.micro_batches_per_step));
    }
    if (poisoned) {
      throw Error("trial: expected a usable device, but " + device.str() +
                  " had a fatal error in an earlier trial; start a new process");
    }
    if (package) {
      // Outside the compiled batch range: a hard limit of the package, like a kernel's.
      std::string why = package->batchOutOfRange(request.micro_batch_size);
      if (!why.empty()) {
        TrialResult result;
        result.request = request;
        result.memory_limit_bytes = backend->limitBytes() - reserve_bytes;
        result.outcome = TrialOutcome::kSizeLimit;
        result.reason = std::move(why);
        return result;
      }
    }
    return runOnce(request);
  }

  TrialResult runMixed(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                       const CancelHook& cancel) {
    if (steps.empty() || micro_batches_per_step < 1) {
      throw Error(
          "mixed trial: expected at least one step and micro_batches_per_step >= 1, but got " +
          std::to_string(steps.size()) + " steps and " + std::to_string(micro_batches_per_step));
    }
    std::vector<PlannedStep> plan;
    TrialRequest request;
    request.micro_batches_per_step = micro_batches_per_step;
    request.cancel = cancel;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const MixedStep& step = steps[i];
      bool same_kinds = step.inputs.size() == inputs.size();
      for (std::size_t k = 0; same_kinds && k < inputs.size(); ++k) {
        same_kinds = step.inputs[k].dtype == inputs[k].dtype;
      }
      if (step.micro_batch_size < 1 || !same_kinds) {
        throw Error(
            "mixed trial step " + std::to_string(i) +
            ": expected micro_batch_size >= 1 and inputs of the runner's count and dtypes (" +
            std::to_string(inputs.size()) + "), but got micro-batch " +
            std::to_string(step.micro_batch_size) + " and " + std::to_string(step.inputs.size()) +
            " inputs");
      }
      plan.push_back({step.micro_batch_size, &step.inputs});
      request.micro_batch_size = std::max(request.micro_batch_size, step.micro_batch_size);
    }
    if (poisoned) {
      throw Error("trial: expected a usable device, but " + device.str() +
                  " had a fatal error in an earlier trial; start a new process");
    }
    return runSteps(request, plan, true);
  }

  // Frees what a trial left: weights back, caches emptied. Skipped once the device is poisoned;
  // an error here poisons it (the original error, if any, is the one that leaves).
  void cleanUpAfterTrial(std::exception_ptr& error) {
    if (poisoned) return;
    try {
      restoreWeights();
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

  // An ambiguous failure at `request`: empty the cache and re-run the largest batch already seen
  // to fit. It fits: the failure was out of memory. The error persists there: it is the model's or
  // the install's, and `error` leaves unchanged (exit 1). Nothing fitted yet: out of memory (the
  // failing batch is then the smallest tried; "nothing fits" names the message).
  void classifyByEvidence(const TrialRequest& request, bool process_limit_near,
                          FailureClass& failure, std::exception_ptr& error, TrialResult& result) {
    if (largest_fit_batch == 0 || classifying) {
      if (classifying) return;  // the outer trial decides; `error` leaves the re-run unchanged
      failure.kind = FailureKind::kOutOfMemory;
      failure.reason += " (taken as out of memory: nothing has fitted yet to re-run)";
      error = nullptr;
      return;
    }
    TrialRequest again;
    again.micro_batch_size = largest_fit_batch;
    again.micro_batches_per_step = largest_fit_micro_batches;
    again.cancel = request.cancel;
    classifying = true;
    TrialResult rerun;
    bool persisted = false;
    bool inconclusive = false;
    try {
      rerun = runOnce(again);
      persisted =
          rerun.outcome != TrialOutcome::kFits && rerun.outcome != TrialOutcome::kOutOfMemory;
    } catch (const std::exception&) {
      // Near a process limit (RLIMIT_DATA, a cgroup), a re-run that fails with a sign of
      // exhaustion again (oneDNN "could not create a primitive" after the process's heap grew
      // past where the batch fit before) says memory is tight, not that the model is broken:
      // that batch fit before. "Near": this trial came near the limit, or a process limit is set
      // and this runner has already run out of memory (the search is at the boundary). Otherwise
      // it persists: the model's error.
      const FailureClass again_class = classifyException(std::current_exception(), {true, true});
      const bool at_the_boundary =
          process_limit_near || (last_oom_batch > 0 && backend->processLimitNear(0, 1));
      inconclusive = at_the_boundary && (again_class.kind == FailureKind::kOutOfMemory ||
                                         again_class.kind == FailureKind::kPossibleOutOfMemory);
      persisted = !inconclusive;
    }
    classifying = false;
    if (inconclusive) {
      failure.kind = FailureKind::kOutOfMemory;
      failure.reason += " (taken as out of memory: the re-run at batch " +
                        std::to_string(largest_fit_batch) +
                        ", which fit before, failed the same way; memory is tight)";
      error = nullptr;
      return;
    }
    if (persisted) {
      spdlog::warn(
          "batch {} failed with \"{}\", and the re-run at batch {}, which fit before, failed "
          "too: a model or install error, not out of memory",
          request.micro_batch_size, failure.reason, largest_fit_batch);
      return;  // `error` is rethrown by the caller
    }
    rerun.reason = "re-run to classify: " + failure.reason;
    result.classification_rerun = std::make_shared<const TrialResult>(std::move(rerun));
    failure.kind = FailureKind::kOutOfMemory;
    failure.reason += " (out of memory: batch " + std::to_string(largest_fit_batch) +
                      " fit when re-run with the cache emptied)";
    error = nullptr;
  }

  // One optimizer step of a trial: its micro-batch and the inputs it is made of.
  struct PlannedStep {
    std::int64_t batch = 1;
    const std::vector<InputSpec>* inputs = nullptr;
  };

  TrialResult runOnce(const TrialRequest& request) {
    const std::vector<PlannedStep> plan(static_cast<std::size_t>(spec.steps_per_trial),
                                        PlannedStep{request.micro_batch_size, &inputs});
    return runSteps(request, plan, false);
  }

  // Runs `plan` as one trial: the optimizer and its state live across its steps, and the
  // allocator's cache is emptied only after the last one. A mixed trial (runMixed) leaves the
  // bookkeeping of single-batch trials (largest fit, last OOM) as it was.
  TrialResult runSteps(const TrialRequest& request, const std::vector<PlannedStep>& plan,
                       bool mixed) {
    TrialResult result;
    result.request = request;
    result.memory_limit_bytes = backend->limitBytes() - reserve_bytes;
    const std::int64_t batch = request.micro_batch_size;

    const c10::DeviceGuard device_guard(device);
    const bool saved_optimize = torch::jit::getGraphExecutorOptimize();
    torch::jit::setGraphExecutorOptimize(spec.optimize_graph);
    std::optional<RngStateGuard> rng_guard;
    rng_guard.emplace(device);
    if (!package) module.train(true);
    backend->beginTrial();
    point = {};
    output_bytes = 0;
    point.micro_batch_size = batch;
    point.trial_index = trials_run++;

    std::exception_ptr error;
    detail::TrialPoint failed_point;  // where the error was thrown
    double total_ms = 0.0;
    {
      std::unique_ptr<detail::TrialOptimizer> optimizer;
      at::Tensor ddp_buckets;  // --ddp: DDP's gradient buckets, alive for the whole trial
      at::Generator gen;
      {
        const detail::UntrackedCpuScope untracked;  // the generator's own state is not the step's
        gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed);
      }
      try {
        if (ddp_bucket_bytes > 0) {
          ddp_buckets = at::empty({ddp_bucket_bytes}, at::TensorOptions(at::kByte).device(device));
        }
        optimizer = makeOptimizer();
        const int steps = static_cast<int>(plan.size());
        StepProgress progress(batch, request.micro_batches_per_step, steps);
        for (int step = 0; step < steps; ++step) {
          if (request.cancel && request.cancel()) {
            result.cancelled = true;
            break;
          }
          progress.beginStep(step);
          const auto start = std::chrono::steady_clock::now();
          const PlannedStep& planned = plan[static_cast<std::size_t>(step)];
          point.micro_batch_size = planned.batch;
          for (int micro = 0; micro < request.micro_batches_per_step; ++micro) {
            point.step = step;
            point.micro_batch_index = micro;
            microStep(planned.batch, *planned.inputs, gen);
          }
          enter(detail::TrialPhase::kOptimizerStep);
          if (optimizer) optimizer->step();
          enter(detail::TrialPhase::kIdle);
          zeroGrad(spec.zero_grad);
          backend->synchronize();
          const double step_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
          total_ms += step_ms;
          progress.endStep(step_ms);
          ++result.steps_completed;
        }
      } catch (...) {  // classified below; whatever is not OOM or a size limit is rethrown
        error = std::current_exception();
        failed_point = point;
      }
    }  // the optimizer and its state are gone here
    enter(detail::TrialPhase::kIdle);
    zeroGrad(ZeroGrad::kNone);
    releaseHeld();
    result.output_bytes = output_bytes;
    at::autocast::clear_cache();

    // A sticky device error (device-side assert, illegal address) makes every later device call
    // throw it again: mark the device poisoned before any cleanup touches it.
    if (error && isFatalDeviceError(error)) poison();
    detail::MemoryPeaks peaks;
    if (!poisoned) {
      try {
        peaks = backend->endTrial();  // synchronizes: an asynchronous device error shows here
      } catch (const std::exception&) {
        if (!error) error = std::current_exception();
        poison();
      }
    }
    FailureClass failure;
    bool near_process_limit = false;
    if (error && !poisoned) {
      const FailureClass loose = classifyException(error, {true, true});
      FailureContext context;
      context.process_limit_near =
          backend->processLimitNear(peaks.peak_bytes, loose.failed_request_bytes);
      near_process_limit = context.process_limit_near;
      context.after_larger_oom = !mixed && last_oom_batch > batch;
      failure = classifyException(error, context);
      if (failure.kind == FailureKind::kOutOfMemory || failure.kind == FailureKind::kSizeLimit) {
        error = nullptr;  // free it before cleanup
      }
    }
    cleanUpAfterTrial(error);
    if (!package) module.train(was_training);
    rng_guard.reset();
    torch::jit::setGraphExecutorOptimize(saved_optimize);
    if (error && !poisoned && failure.kind == FailureKind::kPossibleOutOfMemory) {
      classifyByEvidence(request, near_process_limit, failure, error, result);
    }
    if (error) {
      if (!mixed) last_oom_batch = 0;
      std::rethrow_exception(error);
    }

    result.peak_allocated_bytes = peaks.peak_allocated_bytes;
    result.peak_reserved_bytes = peaks.peak_reserved_bytes;
    result.peak_bytes = peaks.peak_bytes;
    result.allocator_retries = peaks.allocator_retries;
    result.outside_growth_bytes = peaks.outside_growth_bytes;
    for (const auto& p : peaks.phase_peaks) {
      result.phase_peaks.push_back({detail::phaseKey(p.phase), p.micro_batch_index, p.peak_bytes});
    }
    result.step_ms =
        result.steps_completed > 0 ? total_ms / static_cast<double>(result.steps_completed) : 0.0;
    if (failure.kind == FailureKind::kOutOfMemory) {
      result.outcome = TrialOutcome::kOutOfMemory;
      result.reason = failure.reason;
      result.failed_in_use_bytes = failure.failed_in_use_bytes;
      // A request near 2^63 bytes (an input too large to count, issue 27 row 13): bounded so that
      // the sums made of it (in use + request, peak + request) stay within int64.
      result.failed_request_bytes =
          std::min(failure.failed_request_bytes,
                   std::numeric_limits<std::int64_t>::max() -
                       std::max({result.peak_bytes, result.failed_in_use_bytes, std::int64_t{0}}));
      if (failed_point.phase != detail::TrialPhase::kIdle) {
        result.failed_phase = detail::phaseKey(failed_point.phase);
        result.failed_micro_batch_index = failed_point.micro_batch_index;
        result.failed_step_index = failed_point.step;
      }
      if (!mixed) last_oom_batch = std::max(last_oom_batch, batch);
    } else if (failure.kind == FailureKind::kSizeLimit && !failure.reason.empty()) {
      result.outcome = TrialOutcome::kSizeLimit;
      result.reason = failure.reason;
    } else {
      if (!mixed) last_oom_batch = 0;
      if (result.cancelled) {
        result.reason = "cancelled";
      } else if (!mixed && batch >= largest_fit_batch) {
        largest_fit_batch = batch;
        largest_fit_micro_batches = request.micro_batches_per_step;
      }
    }
    return result;
  }
};

TrialRunner::TrialRunner(const TrainingSpec& spec, const SearchOptions& options)
    : impl_(std::make_unique<Impl>(spec, options, nullptr)) {}

TrialRunner::TrialRunner(torch::jit::Module& module, const TrainingSpec& spec,
                         const SearchOptions& options) {
  if (spec.inputs.empty()) {
    throw Error(
        "module: expected TrainingSpec::inputs (one spec per forward argument), but got "
        "none; a module given in memory has no archive to read autobatch/inputs.json "
        "from");
  }
  impl_ = std::make_unique<Impl>(spec, options, &module);
}

TrialRunner::~TrialRunner() = default;

TrialResult TrialRunner::run(const TrialRequest& request) { return impl_->run(request); }
TrialResult TrialRunner::runMixed(const std::vector<MixedStep>& steps, int micro_batches_per_step,
                                  const CancelHook& cancel) {
  return impl_->runMixed(steps, micro_batches_per_step, cancel);
}

Probe TrialRunner::probe() {
  return [this](const TrialRequest& request) { return run(request); };
}

int TrialRunner::microBatchesPerTrial() const {
  return std::min(impl_->spec.accumulation_steps, 2);
}

std::int64_t TrialRunner::parameterCount() const {
  std::int64_t n = 0;
  for (const auto& p : impl_->trained) n += p.numel();
  return n;
}
std::int64_t TrialRunner::parameterBytes() const { return impl_->parameter_bytes; }
std::int64_t TrialRunner::gradientBytes() const {
  std::int64_t n = 0;
  for (const auto& p : impl_->trained) n += bytesOf(p);
  return n;
}
std::int64_t TrialRunner::optimizerStateBytes() const {
  switch (impl_->spec.optimizer) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2 * gradientBytes();
    case OptimizerKind::kSgdMomentum:
      return gradientBytes();
    case OptimizerKind::kSgd:
    case OptimizerKind::kNone:
      return 0;
  }
  return 0;
}
std::int64_t TrialRunner::ddpBucketBytes() const { return impl_->ddp_bucket_bytes; }
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
std::string TrialRunner::modelFormat() const { return impl_->package ? "pt2" : "torchscript"; }
std::vector<std::string> TrialRunner::modelWarnings() const {
  if (!impl_->package) return {};
  const detail::Pt2Metadata& meta = impl_->package->metadata();
  if (!meta.eager_kernels) {
    return {
        "pt2 package exported before packages ran eager's kernels: Inductor fused its loss, "
        "normalisations and activations, so these peaks are 0-17% under an eager loop's on the "
        "models measured (docs/formats.md); export it again with scripts/autobatch_export.py "
        "--format pt2"};
  }
  // Issue 26: packages compiled with Inductor's locality pass were up to 9.15% under the eager
  // loop (ConvNeXt-tiny), the direction that makes a "safe" answer run out of memory; since then
  // the export measures both and refuses such a package (data/autobatch/memory_check.json).
  constexpr const char* kWhy =
      "packages exported without that check were up to 9.15% under an eager loop's peak "
      "(ConvNeXt-tiny, docs/formats.md), the direction that makes a \"safe\" batch run out of "
      "memory; export it again with scripts/autobatch_export.py --format pt2 (it needs the "
      "autobatch executable), or size the model with its TorchScript archive";
  if (meta.memory_check.empty()) {
    return {
        fmt::format("pt2 package exported before the export checked its peaks against the "
                    "eager step's: {}",
                    kWhy)};
  }
  if (meta.memory_check == "not-run") {
    return {fmt::format(
        "pt2 package whose peaks were not checked against the eager step's when "
        "it was exported ({}): {}",
        meta.memory_check_reason.empty() ? "no reason given" : meta.memory_check_reason, kWhy)};
  }
  if (meta.memory_check == "over" && !meta.memory_check_rows.empty()) {
    const auto ratio = [](const detail::Pt2Metadata::MemoryCheckRow& row) {
      return static_cast<double>(row.package_peak_bytes) /
             static_cast<double>(row.eager_peak_bytes);
    };
    const auto worst =
        std::max_element(meta.memory_check_rows.begin(), meta.memory_check_rows.end(),
                         [&](const auto& a, const auto& b) { return ratio(a) < ratio(b); });
    return {
        fmt::format("pt2 package: when it was exported, its peak was {:.2f}% over the eager "
                    "step's at batch {} ({} against {} bytes), so its answers are cautious "
                    "(your job may fit a larger batch); the TorchScript archive of the same "
                    "model measures the eager step's peak",
                    100.0 * (ratio(*worst) - 1.0), worst->batch, worst->package_peak_bytes,
                    worst->eager_peak_bytes)};
  }
  return {};
}
std::int64_t TrialRunner::baselineBytes() const { return impl_->baseline_bytes; }
std::int64_t TrialRunner::currentBytes() const { return impl_->backend->currentBytes(); }
std::int64_t TrialRunner::outsideBytes() const { return impl_->backend->outsideBytes(); }
std::int64_t TrialRunner::outsideGrowthBytes() const {
  return impl_->backend->outsideGrowthBytes();
}
AllocatorInfo TrialRunner::allocatorInfo() const { return impl_->backend->allocatorInfo(); }
std::string TrialRunner::device() const { return impl_->device.str(); }
const std::vector<InputSpec>& TrialRunner::inputs() const { return impl_->inputs; }
LossKind TrialRunner::loss() const { return impl_->loss; }
const TrainingSpec& TrialRunner::spec() const { return impl_->spec; }

}  // namespace autobatch
