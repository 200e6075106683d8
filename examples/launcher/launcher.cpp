// An example training launcher: loads a TorchScript model, asks autobatch for the largest
// micro-batch that trains on this device (findMaxBatch on the loaded module; with --cache DIR,
// findMaxBatchCached on the file: a repeat run answers from the folder with one confirming
// trial), then trains a few optimizer steps with the planned micro-batches and gradient
// accumulation.
//
// Usage: launcher MODEL.pt [--device cpu|cuda:N] [--memory-limit SIZE] [--target-batch N]
//                          [--steps N] [--cache DIR]
// The model must carry its input description (scripts/autobatch_export.py writes it).
// Exit codes: 0 trained, 2 bad arguments, 3 the plan does not fit, 1 anything else.
#include <torch/script.h>
#include <torch/torch.h>

#include <autobatch/autobatch.h>
#include <autobatch/vocabulary/error.h>
#include <autobatch/vocabulary/model_metadata.h>
#include <autobatch/vocabulary/units.h>
#include <autobatch/workflows/cached_search.h>

#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model;
  std::string device = "cpu";
  std::int64_t memory_limit_bytes = 0;
  std::int64_t target_batch = 0;
  int steps = 3;
  std::string cache_dir;  ///< --cache: the result cache's folder; "" searches every time
};

Args parseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw autobatch::Error(a + ": expected a value, but got none");
      return argv[++i];
    };
    if (a == "--device") {
      args.device = value();
    } else if (a == "--memory-limit") {
      args.memory_limit_bytes = autobatch::parseBytes(value(), a);
    } else if (a == "--target-batch") {
      args.target_batch = autobatch::parseInteger(value(), a, 1, std::int64_t{1} << 40);
    } else if (a == "--cache") {
      args.cache_dir = value();
    } else if (a == "--steps") {
      args.steps = static_cast<int>(autobatch::parseInteger(value(), a, 1, 1000));
    } else if (args.model.empty() && a.rfind("--", 0) != 0) {
      args.model = a;
    } else {
      throw autobatch::Error("unexpected argument '" + a + "'");
    }
  }
  if (args.model.empty()) throw autobatch::Error("expected a model path, but got none");
  return args;
}

torch::Tensor syntheticInput(const autobatch::InputSpec& spec, std::int64_t batch,
                             const torch::Device& device) {
  std::vector<std::int64_t> shape{batch};
  shape.insert(shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  const auto on = torch::TensorOptions().device(device);
  if (autobatch::isIntegral(spec.dtype)) {
    return torch::randint(spec.low, spec.high, shape, on.dtype(torch::kInt64));
  }
  return torch::randn(shape, on);
}

torch::Tensor lossOf(const torch::Tensor& out, autobatch::LossKind kind) {
  if (kind == autobatch::LossKind::kCrossEntropy) {
    const auto classes = out.size(-1);
    const auto logits = out.reshape({-1, classes});
    return torch::nn::functional::cross_entropy(
        logits, torch::randint(classes, {logits.size(0)}, torch::kLong).to(out.device()));
  }
  if (kind == autobatch::LossKind::kMse) {
    return torch::mse_loss(out, torch::randn_like(out));
  }
  return out.mean();
}

// Parameters, buffers and training mode, to show that findMaxBatch gives the module back as it was.
struct Snapshot {
  std::vector<torch::Tensor> tensors;
  bool training = true;
};

Snapshot snapshot(const torch::jit::Module& m) {
  Snapshot s;
  for (const auto& p : m.parameters()) s.tensors.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) s.tensors.push_back(b.detach().clone());
  s.training = m.is_training();
  return s;
}

bool sameAs(const Snapshot& a, const Snapshot& b) {
  if (a.training != b.training || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    if (!torch::equal(a.tensors[i], b.tensors[i])) return false;
  }
  return true;
}

int run(const Args& args) {
  torch::set_num_threads(1);
  const torch::Device device(args.device);
  torch::jit::ExtraFilesMap extra{{std::string(autobatch::kModelMetadataFile), ""}};
  torch::jit::Module module = torch::jit::load(args.model, device, extra);
  const auto metadata =
      autobatch::parseModelMetadata(extra[std::string(autobatch::kModelMetadataFile)], args.model);

  autobatch::TrainingSpec spec;
  spec.model_path = args.model;
  spec.inputs = metadata.inputs;
  spec.loss = metadata.loss;
  spec.device = args.device;
  spec.optimizer = autobatch::OptimizerKind::kAdamW;
  autobatch::SearchOptions options;
  options.memory_limit_bytes = args.memory_limit_bytes;
  options.target_batch = args.target_batch;
  std::cout << "launcher: model " << args.model << " on " << args.device << ", "
            << module.parameters().size() << " parameter tensors\n";

  const Snapshot before = snapshot(module);
  autobatch::MaxBatchResult found;
  std::string call = "findMaxBatch";
  if (args.cache_dir.empty()) {
    found = autobatch::findMaxBatch(module, spec, options);
  } else {
    // Keyed by the model file's SHA-1, the inputs, the options, the device and the versions.
    autobatch::ResultCacheOptions cache;
    cache.dir = args.cache_dir;
    autobatch::CachedSearchResult cached = autobatch::findMaxBatchCached(spec, options, cache);
    found = std::move(cached.result);
    call = "findMaxBatchCached (cache " + cached.cache.outcome + ")";
  }
  const auto& search = found.search;
  std::cout << call << ": " << autobatch::toString(search.status) << ", max micro-batch "
            << search.max_micro_batch << ", safe micro-batch " << search.safe_micro_batch << " ("
            << search.trials.size() << " trials, limit "
            << autobatch::formatBytes(search.memory_limit_bytes) << ")\n";
  const bool unchanged = sameAs(before, snapshot(module));
  std::cout << "module after " << call.substr(0, call.find(' '))
            << ": weights, buffers and training mode " << (unchanged ? "unchanged" : "CHANGED")
            << "\n";
  if (!unchanged) return 1;
  if (search.safe_micro_batch == 0) {
    std::cerr << "launcher: nothing fits under the limit; not training\n";
    return 3;
  }

  // The plan: the primary accumulation plan for the target, else one micro-batch of the safe size.
  std::vector<std::int64_t> micro_batches{search.safe_micro_batch};
  std::string plan_text = "no target: one micro-batch per step";
  const autobatch::AccumulationPlan* plan = nullptr;
  if (search.plan) {
    plan = &search.plan->primary();
    micro_batches = plan->microBatchSizes();
    plan_text = std::string(autobatch::toString(plan->kind)) + ", " +
                std::to_string(plan->accumulation_steps) + " accumulation steps, effective batch " +
                std::to_string(plan->effective_batch);
  }
  std::int64_t per_step = 0;
  std::string sizes;
  for (auto b : micro_batches) {
    per_step += b;
    sizes += (sizes.empty() ? "" : "+") + std::to_string(b);
  }
  std::cout << "plan: " << sizes << " = " << per_step << " samples per step (" << plan_text
            << ")\n";

  std::vector<torch::Tensor> params;
  for (const auto& p : module.parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
  const auto loss_kind = metadata.loss.value_or(autobatch::LossKind::kMean);
  module.train();
  for (int step = 1; step <= args.steps; ++step) {
    optimizer.zero_grad();
    double step_loss = 0.0;
    for (auto b : micro_batches) {
      std::vector<torch::jit::IValue> inputs;
      for (const auto& in : spec.inputs) inputs.emplace_back(syntheticInput(in, b, device));
      const auto out = module.forward(inputs).toTensor();
      // Each micro-batch's mean loss weighted by its share of the step's samples: the
      // accumulated gradient is then the mean over the whole step (balanced plans included).
      const double weight =
          plan != nullptr ? plan->lossWeight(b) : 1.0 / static_cast<double>(micro_batches.size());
      const auto loss = lossOf(out, loss_kind) * weight;
      loss.backward();
      step_loss += loss.item<double>();
    }
    optimizer.step();
    std::cout << "step " << step << ": " << micro_batches.size() << " micro-batches, " << per_step
              << " samples, loss " << step_loss << "\n";
  }
  std::cout << "trained " << args.steps << " optimizer steps of " << per_step
            << " samples per rank\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parseArgs(argc, argv));
  } catch (const autobatch::Error& e) {
    std::cerr << "launcher: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "launcher: error: " << e.what() << "\n";
    return 1;
  }
}
