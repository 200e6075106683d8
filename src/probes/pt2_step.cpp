// The pt2 format's step program (step_program.h): an AOTInductor package of one training step
// (pt2_package.h, docs/formats.md "How a package runs"). One call per micro-batch runs forward,
// loss and backward; the step owns its gradient accumulation inside the call, and reads the memory
// backend's allocation log and refusal count to measure the call and to tell its out of memory.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "autobatch/vocabulary/error.h"
#include "probes/pt2_package.h"
#include "probes/step_program.h"

namespace autobatch::detail {
namespace {

std::string formatInputSpecs(const std::vector<InputSpec>& specs) {
  std::string out;
  for (const auto& spec : specs) out += (out.empty() ? "" : ",") + toString(spec);
  return "'" + out + "'";
}

class Pt2Step final : public StepProgram {
 public:
  // Loaded outside the budget and counted as baseline by the runner, as a TorchScript model is.
  // Inputs, loss and precision are fixed at export; flags that contradict them are usage errors
  // naming the package's value.
  explicit Pt2Step(const StepSetup& setup) : path_(setup.spec.model_path) {
    {
      const UntrackedCpuScope untracked;
      package_ = std::make_unique<Pt2Package>(path_);
    }
    const Pt2Metadata& m = package_->metadata();
    const TrainingSpec& spec = setup.spec;
    const std::string where = "model package '" + path_ + "': ";
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
  }

  const ModelFormat& format() const override { return pt2Format(); }
  std::vector<at::Tensor> parameters() const override { return package_->parameters(); }
  std::vector<at::Tensor> buffers() const override { return package_->buffers(); }
  const std::vector<InputSpec>& inputs() const override { return package_->metadata().inputs; }
  const std::vector<InputSpec>& targets() const override { return package_->metadata().targets; }
  LossKind loss() const override { return package_->metadata().loss; }
  // Outside the compiled batch range: a hard limit of the package, like a kernel's.
  std::string batchOutOfRange(std::int64_t batch) const override {
    return package_->batchOutOfRange(batch);
  }
  std::vector<std::string> warnings() const override;
  bool borrowed() const override { return false; }
  // Never asked: the constructor refuses every precision but fp32.
  void castTo(at::ScalarType /*dtype*/) override {}
  void beginTrial() override {}
  void endTrial() override {}
  void microStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& gen,
                 StepHost& host) override;
  // The call returns only the loss and the gradients: no output is ever held.
  std::int64_t outputBytes() const override { return 0; }
  void releaseHeld() override {}

 private:
  void addReturnedGradients(std::vector<at::Tensor>& outputs) const;
  static void recordCallActivations(std::int64_t held_at_call,
                                    const std::vector<AllocationEvent>& log,
                                    const std::vector<at::Tensor>& returned, StepHost& host);

  std::string path_;
  std::unique_ptr<Pt2Package> package_;
};

// One micro-batch is one call. Without gradients yet, the call returns the loss and the
// gradients, which become the parameters' (addReturnedGradients). With gradients there, the
// package's accumulating model adds into them inside the call.
// An allocation refused inside the call comes back as a plain error from the loader: the
// allocation log's count of refusals tells it was out of memory, and its message is rethrown as
// the OutOfMemoryError it was.
void Pt2Step::microStep(std::int64_t batch, std::vector<at::Tensor> args, at::Generator& /*gen*/,
                        StepHost& host) {
  host.enter(TrialPhase::kForwardBackward);
  // A batch the eager step refuses (BatchNorm at batch 1): the error the eager job would raise,
  // a model error like TorchScript's, never out of memory.
  const std::string eager_error = package_->eagerStepError(batch);
  TORCH_CHECK(eager_error.empty(), eager_error);
  AllocationLog& log = host.allocationLog();
  std::vector<at::Tensor> outputs;
  const std::uint64_t refusals_before = log.refusals().first;
  // Gradients already there (a later micro-batch, or zero_grad to zeros): the accumulating
  // model adds into them inside the call, as an eager backward does.
  const bool accumulate = package_->canAccumulate();
  // The call's allocations, to measure it less the gradients it returns (kCallActivations).
  const std::int64_t held_at_call = log.start();
  bool logging = true;
  const auto stop_log = c10::make_scope_exit([&] {
    if (logging) log.stop();
  });
  try {
    if (accumulate) {
      package_->runAccumulating(args);
    } else {
      outputs = package_->run(args);
    }
    logging = false;
    recordCallActivations(held_at_call, log.stop(), outputs, host);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& e) {
    const auto [refusals, message] = log.refusals();
    if (refusals != refusals_before) {
      spdlog::debug("package call failed after a refused allocation: {}", e.what());
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    }
    throw;
  }
  args.clear();
  if (!accumulate) addReturnedGradients(outputs);
}

// The call's gradients become the parameters' (no copy, as autograd's first accumulation); a
// tied copy's, or any gradient of a package without an accumulating model, is added in and freed
// at once.
void Pt2Step::addReturnedGradients(std::vector<at::Tensor>& outputs) const {
  const auto& owners = package_->gradientOwners();
  if (outputs.size() != owners.size() + 1) {
    throw Error("model package '" + path_ + "': expected the loss and " +
                std::to_string(owners.size()) + " gradients from its call, but got " +
                std::to_string(outputs.size()) + " outputs");
  }
  const at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < owners.size(); ++i) {
    at::Tensor& grad = package_->parameters()[owners[i]].mutable_grad();
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
// allocation log of the call. At small batches forward-backward peaks at the end of the backward
// with every gradient held and reads flat from batch 1 to 2 (ResNet-18 at 3x64x64: 0.43 MiB per
// sample where 12 to 22 gives 1.6); this measure grows with the activations, as eager's forward
// phase does, and the search bounds forward-backward's slope by it.
void Pt2Step::recordCallActivations(std::int64_t held_at_call,
                                    const std::vector<AllocationEvent>& log,
                                    const std::vector<at::Tensor>& returned, StepHost& host) {
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
  host.allocationLog().recordPhasePeak(TrialPhase::kCallActivations, host.microBatchIndex(),
                                       held_at_call + top);
}

// A package exported before eager kernels, or whose export's check of its peaks against the eager
// step's did not pass (docs/formats.md).
std::vector<std::string> Pt2Step::warnings() const {
  const Pt2Metadata& meta = package_->metadata();
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
    const auto ratio = [](const Pt2Metadata::MemoryCheckRow& row) {
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

}  // namespace

std::unique_ptr<StepProgram> loadPt2Step(const StepSetup& setup) {
  return std::make_unique<Pt2Step>(setup);
}

}  // namespace autobatch::detail
