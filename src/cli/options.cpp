// The command line's options: the flag table and readOptions (src/cli/options.h).
#include "cli/options.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "autobatch/autobatch.h"
#include "autobatch/probes/model_format.h"
#include "autobatch/run/ranks.h"
#include "autobatch/run/result_cache.h"
#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/units.h"

namespace autobatch::cli {
namespace {

std::optional<int> intFlag(const cxxopts::ParseResult& args, const std::string& name,
                           std::int64_t min, std::int64_t max) {
  if (args.count(name) == 0U) return std::nullopt;
  return static_cast<int>(autobatch::parseInteger(flag(args, name), "--" + name, min, max));
}

// Flags first, then torchrun's or Slurm's environment (autobatch/run/ranks.h).
autobatch::RankInfo readRanks(const cxxopts::ParseResult& args) {
  autobatch::RankFlags f;
  f.rank = intFlag(args, "rank", 0, 1 << 20);
  f.world_size = intFlag(args, "world-size", 1, 1 << 20);
  f.local_rank = intFlag(args, "local-rank", 0, 1 << 20);
  f.master_port = intFlag(args, "master-port", 1, 65535);
  if (args.count("master-addr") != 0U) f.master_addr = flag(args, "master-addr");
  return autobatch::resolveRankInfo(f, autobatch::processEnvironment());
}

// --target-tokens must be one sequence per rank at some length, as --target-batch must be at
// least the world size: the shortest length has the fewest tokens per sequence. A length whose
// sequence is above the target still gets a row, without a plan (docs/sweeps.md).
void checkTargetTokens(const CliConfig& cli, int world) {
  const std::int64_t shortest = cli.lengths.back();
  const std::int64_t per_sequence = autobatch::tokensPerSample(cli.input_texts, shortest);
  if (cli.target_tokens / per_sequence >= world) return;
  const bool representable = per_sequence <= std::numeric_limits<std::int64_t>::max() / world;
  throw Error(fmt::format(
      "--target-tokens: expected at least one sequence per rank at some length, but got {} "
      "tokens: a sequence of the shortest length {} is {} tokens, times {} rank(s) {}; give "
      "--target-tokens {} or more, or shorter --lengths",
      cli.target_tokens, shortest, per_sequence, world,
      representable ? "is " + std::to_string(per_sequence * world) : std::string("overflows int64"),
      representable ? std::to_string(per_sequence * world) : std::string("(none fits int64)")));
}

// --check-batch N within the search's bounds, its effective batch N x --accumulation-steps x
// world size within int64 and equal to --target-batch when one is given (the env lines' effective
// batch is always the target, docs/report.md).
void checkCheckBatch(std::int64_t batch, const autobatch::TrainingSpec& spec,
                     const autobatch::SearchOptions& o) {
  if (batch < o.min_batch || (o.max_batch > 0 && batch > o.max_batch)) {
    throw Error(fmt::format(
        "--check-batch: expected a micro-batch within --min-batch {} and --max-batch {}, but got "
        "{}; check a batch between them, or change the bounds",
        o.min_batch, o.max_batch > 0 ? std::to_string(o.max_batch) : "0 (no bound)", batch));
  }
  if (o.dataset_size > 0 && batch > o.dataset_size) {
    throw Error(
        fmt::format("--check-batch: expected a micro-batch <= --dataset-size {}, but got {}",
                    o.dataset_size, batch));
  }
  const std::int64_t per_micro_batch = std::int64_t{spec.accumulation_steps} * o.world_size;
  const std::int64_t largest = std::numeric_limits<std::int64_t>::max() / per_micro_batch;
  if (batch > largest) {
    throw Error(fmt::format(
        "--check-batch: expected an effective batch (micro-batch x --accumulation-steps {} x "
        "world size {}) that fits in 64 bits, but got {}; the largest accepted here is {}",
        spec.accumulation_steps, o.world_size, batch, largest));
  }
  const std::int64_t effective = batch * per_micro_batch;
  if (o.target_batch > 0 && effective != o.target_batch) {
    const std::int64_t per_step = batch * o.world_size;
    throw Error(fmt::format(
        "--target-batch: expected the checked effective batch, --check-batch {} x "
        "--accumulation-steps {} x world size {} = {}, but got {}; {}",
        batch, spec.accumulation_steps, o.world_size, effective, o.target_batch,
        o.target_batch % per_step == 0
            ? fmt::format("give --accumulation-steps {}, or leave --target-batch out",
                          o.target_batch / per_step)
            : std::string("leave --target-batch out, or search for a plan without --check-batch")));
  }
}

// The rank (flags, then the launcher's environment) and how long the ranks wait for each other.
void readRankOptions(const cxxopts::ParseResult& args, CliConfig& cli) {
  cli.report.rank = readRanks(args);
  cli.rank_options.timeout_s =
      autobatch::parseDecimal(flag(args, "rank-timeout"), "--rank-timeout", 0.1, 1e6);
  cli.rank_options.heartbeat_interval_s = std::min(1.0, cli.rank_options.timeout_s / 5.0);
  if (auto restart = autobatch::processEnvironment()("TORCHELASTIC_RESTART_COUNT")) {
    cli.rank_options.prefix += "/" + *restart;
  }
}

// --model and --lengths; returns the model's format (autobatch/probes/model_format.h: a pt2
// package's input shapes are fixed, it holds no output, it runs on the CPU only).
const autobatch::ModelFormat& readModel(const cxxopts::ParseResult& args, CliConfig& cli) {
  autobatch::TrainingSpec& spec = cli.report.spec;
  spec.model_path = args.count("model") != 0U ? flag(args, "model") : "";
  if (spec.model_path.empty()) {
    throw Error(
        "--model: expected the path of a TorchScript archive (torch.jit.save) or a pt2 package "
        "(scripts/autobatch_export.py --format pt2), but got none");
  }
  const autobatch::ModelFormat& model_format = autobatch::modelFormatAt(spec.model_path);
  if (args.count("lengths") != 0U) {
    if (!model_format.capabilities.varying_shapes) {
      throw Error("--lengths: expected a TorchScript model, but '" + spec.model_path +
                  "' is a pt2 package, whose input shapes are fixed at export (length sweeps on "
                  "packages are not supported yet)");
    }
    cli.lengths = autobatch::parseLengths(flag(args, "lengths"));
  }
  return model_format;
}

// --input, each checked at every length of a sweep.
void readInputs(const cxxopts::ParseResult& args, CliConfig& cli) {
  bool placeholder = false;
  if (args.count("input") != 0U) {
    for (const auto& text : args["input"].as<std::vector<std::string>>()) {
      cli.input_texts.push_back(text);
      placeholder = placeholder || autobatch::hasLengthPlaceholder(text);
      if (autobatch::hasLengthPlaceholder(text) && cli.lengths.empty()) {
        throw Error("--input '" + text +
                    "': the length placeholder L needs --lengths (a list like 128,512,1536 or a "
                    "range like 128..2048), or write the length itself");
      }
      try {
        // With a sweep, checked at every length here (a shape too large at the longest is a usage
        // error before any trial) and parsed per length later.
        for (const std::int64_t length : cli.lengths) {
          (void)autobatch::parseInputSpecsAtLength(text, length);
        }
        for (auto& s : autobatch::parseInputSpecsAtLength(text, 1)) {
          cli.report.spec.inputs.push_back(std::move(s));
        }
      } catch (const Error& e) {
        throw Error(std::string("--input: ") + e.what());
      }
    }
  }
  if (!cli.lengths.empty() && !placeholder) {
    throw Error(
        "--lengths: expected an --input with the length placeholder L (e.g. --input "
        "'int64:L:<32000'), but no --input names L");
  }
}

// --loss, --optimizer, --optimizer-impl, --zero-grad and --keep-output.
void readLossAndOptimizer(const cxxopts::ParseResult& args, autobatch::TrainingSpec& spec,
                          const autobatch::ModelFormat& model_format) {
  if (args.count("loss") != 0U) spec.loss = autobatch::parseLossKind(flag(args, "loss"));
  spec.optimizer = autobatch::parseOptimizerKind(flag(args, "optimizer"));
  spec.optimizer_impl = autobatch::parseOptimizerImpl(flag(args, "optimizer-impl"));
  if (spec.optimizer == autobatch::OptimizerKind::kNone &&
      spec.optimizer_impl != autobatch::OptimizerImpl::kAuto) {
    throw Error(
        "--optimizer-impl: expected auto with --optimizer none (there is no optimizer "
        "step to implement), but got " +
        std::string(autobatch::toString(spec.optimizer_impl)));
  }
  spec.zero_grad = autobatch::parseZeroGrad(flag(args, "zero-grad"));
  const std::string keep = flag(args, "keep-output");
  if (keep != "yes" && keep != "no") {
    throw Error("--keep-output: expected yes or no, but got '" + keep +
                "' (yes: the job keeps the model's output in a variable through backward and the "
                "optimizer step; no: it drops it before backward)");
  }
  spec.keep_output = keep == "yes";
  if (!model_format.returns_output) {
    // A package returns only the loss and the gradients: its output is never held.
    if (args.count("keep-output") != 0U && spec.keep_output) {
      throw Error(
          "--keep-output yes: a pt2 package returns only the loss and the gradients, so "
          "its output is never held; leave --keep-output out for '" +
          spec.model_path + "'");
    }
    spec.keep_output = false;
  }
}

// The rest of the training step: --lr .. --seed.
void readStep(const cxxopts::ParseResult& args, autobatch::TrainingSpec& spec) {
  using autobatch::parseInteger;
  spec.learning_rate = autobatch::parseDecimal(flag(args, "lr"), "--lr", 0.0, 1e6);
  spec.precision = autobatch::parsePrecision(flag(args, "precision"));
  spec.steps_per_trial =
      static_cast<int>(parseInteger(flag(args, "steps-per-trial"), "--steps-per-trial", 1, 100));
  spec.accumulation_steps = static_cast<int>(
      parseInteger(flag(args, "accumulation-steps"), "--accumulation-steps", 1, 1 << 20));
  spec.cudnn_benchmark = args["cudnn-benchmark"].as<bool>();
  spec.optimize_graph = args["optimize-graph"].as<bool>();
  spec.seed = static_cast<std::uint64_t>(
      parseInteger(flag(args, "seed"), "--seed", 0, std::numeric_limits<std::int64_t>::max()));
}

// --device: auto is a GPU when one is seen (the CPU for a package); each rank on its own GPU.
void readDevice(const cxxopts::ParseResult& args, CliConfig& cli,
                const autobatch::ModelFormat& model_format) {
  autobatch::TrainingSpec& spec = cli.report.spec;
  std::string device = flag(args, "device");
  const auto& gpus = cli.report.build.cuda_devices;
  if (device == "auto") {
    // Packages run on the CPU only for now (docs/formats.md): auto is the CPU for them.
    device = gpus.empty() || model_format.cpu_only ? "cpu" : "cuda";
    if (model_format.cpu_only && !gpus.empty()) {
      spdlog::info("--device auto: cpu, since '{}' is a pt2 package (CPU only for now)",
                   spec.model_path);
    }
  }
  if (device.rfind("cuda", 0) == 0 && gpus.empty()) {
    throw Error("--device " + device + ": expected a visible GPU, but found none (" +
                (cli.report.build.cuda_build
                     ? std::string("CUDA build, ") + (cli.report.build.cuda_driver_version == 0
                                                          ? "no CUDA driver"
                                                          : "driver but no device")
                     : std::string("LibTorch built without CUDA")) +
                "); use --device cpu with --memory-limit to search under a RAM budget");
  }
  spec.device = autobatch::rankDevice(device, cli.report.rank->local_rank);
}

// --memory-limit, --reserve and --margin.
void readMemory(const cxxopts::ParseResult& args, autobatch::SearchOptions& o) {
  if (args.count("memory-limit") != 0U) {
    o.memory_limit_bytes = autobatch::parseBytes(flag(args, "memory-limit"), "--memory-limit");
    if (o.memory_limit_bytes <= 0) throw Error("--memory-limit: expected a size > 0, but got 0");
  }
  o.reserve_bytes = autobatch::parseBytes(flag(args, "reserve"), "--reserve");
  const std::string margin = flag(args, "margin");
  if (!margin.empty() && margin.back() == '%') {
    o.margin_fraction =
        autobatch::parseDecimal(margin.substr(0, margin.size() - 1), "--margin", 0.0, 99.0) / 100.0;
    o.margin_bytes = -1;
  } else {
    // A bare number is a percentage to some and bytes to others (issue 27, row 18): ask.
    if (!margin.empty() && margin.find_first_not_of("0123456789.") == std::string::npos &&
        margin.find_first_not_of("0.") != std::string::npos) {
      throw Error("--margin: expected a percentage such as " + margin + "% or a size such as " +
                  margin + "MiB, but got '" + margin +
                  "' (a number without a unit is ambiguous: add % or the unit)");
    }
    o.margin_bytes = autobatch::parseBytes(margin, "--margin (a percentage such as 5%, or a size)");
  }
}

// --strategy .. --time-limit.
void readSearch(const cxxopts::ParseResult& args, autobatch::SearchOptions& o) {
  using autobatch::parseInteger;
  o.strategy = autobatch::parseStrategy(flag(args, "strategy"));
  o.min_batch = parseInteger(flag(args, "min-batch"), "--min-batch", 1, kMaxBatch);
  o.max_batch = parseInteger(flag(args, "max-batch"), "--max-batch", 0, kMaxBatch);
  if (o.max_batch != 0 && o.max_batch < o.min_batch) {
    throw Error("--max-batch: expected a value >= --min-batch (" + std::to_string(o.min_batch) +
                "), but got " + std::to_string(o.max_batch));
  }
  o.dataset_size = parseInteger(flag(args, "dataset-size"), "--dataset-size", 0, kMaxBatch);
  o.initial_batch = parseInteger(flag(args, "initial-batch"), "--initial-batch", 1, kMaxBatch);
  o.relative_tolerance = autobatch::parseDecimal(flag(args, "tolerance"), "--tolerance", 0.0, 1.0);
  o.max_trials = static_cast<int>(parseInteger(flag(args, "max-trials"), "--max-trials", 0, 10000));
  o.time_limit_s = autobatch::parseDecimal(flag(args, "time-limit"), "--time-limit", 0.0, 1e7);
}

// --target-batch, --target-tokens, the world size, --plan and --check-batch.
void readTargets(const cxxopts::ParseResult& args, CliConfig& cli) {
  using autobatch::parseInteger;
  autobatch::SearchOptions& o = cli.report.options;
  if (args.count("target-batch") != 0U) {
    o.target_batch = parseInteger(flag(args, "target-batch"), "--target-batch", 1, kMaxBatch);
  }
  if (args.count("target-tokens") != 0U) {
    cli.target_tokens =
        parseInteger(flag(args, "target-tokens"), "--target-tokens", 1, kMaxBatch * 1024);
    if (cli.lengths.empty()) {
      throw Error(
          "--target-tokens: expected --lengths as well (tokens per step become sequences per "
          "length); without a sweep give --target-batch in sequences");
    }
    if (o.target_batch > 0) {
      throw Error("--target-tokens: expected either it or --target-batch, but got both");
    }
  }
  o.world_size = cli.report.rank->world_size;
  if (cli.target_tokens > 0) checkTargetTokens(cli, o.world_size);
  o.plan = autobatch::parsePlanKind(flag(args, "plan"));
  if (o.target_batch > 0) {
    // Fail before any trial runs: an impossible target costs no device time.
    (void)autobatch::planAccumulation(1, o.target_batch, o.world_size, o.plan);
  }
  if (args.count("check-batch") != 0U) {
    cli.check_batch = parseInteger(flag(args, "check-batch"), "--check-batch", 1, kMaxBatch);
    checkCheckBatch(*cli.check_batch, cli.report.spec, o);
  }
}

// --cache and --cache-trust, and the modes that exclude each other.
void readModes(const cxxopts::ParseResult& args, CliConfig& cli) {
  cli.cache = args.count("cache") != 0U;
  cli.cache_trust = args.count("cache-trust") != 0U;
  if (cli.cache_trust && !cli.cache) {
    throw Error("--cache-trust: expected --cache as well (it changes how a cache hit is answered)");
  }
  if (!cli.lengths.empty() && cli.check_batch) {
    throw Error(
        "--lengths: expected a search, but got --check-batch (check one length with "
        "--input and --check-batch)");
  }
  if (cli.cache && cli.check_batch) {
    throw Error(
        "--cache: expected a search, but got --check-batch (a check is one trial; there is "
        "nothing to reuse)");
  }
  if (cli.cache) cli.cache_dir = autobatch::defaultCacheDir(autobatch::processEnvironment());
}

// --fleet, and the modes a fleet table does not combine with (each has one answer per run).
void readFleet(const cxxopts::ParseResult& args, CliConfig& cli) {
  if (args.count("fleet") == 0U) return;
  cli.fleet = autobatch::parseFleet(flag(args, "fleet"));
  auto refuse = [](const std::string& what, const std::string& fix) {
    throw Error("--fleet: expected a search of its own, but got " + what + "; " + fix);
  };
  if (args.count("memory-limit") != 0U) {
    refuse("--memory-limit", "each size of the list is a limit: add the size to --fleet");
  }
  // Each size is a limit less the reserve: one at or under it leaves the trials nothing, and the
  // runner's words named --memory-limit, which was never given.
  const std::int64_t reserve = cli.report.options.reserve_bytes;
  for (const auto& size : cli.fleet) {
    if (reserve > 0 && size.bytes <= reserve) {
      throw Error("--fleet: expected sizes above --reserve (" + autobatch::formatBytes(reserve) +
                  "), but size '" + size.name + "' is " + autobatch::formatBytes(size.bytes) +
                  ", which leaves the trials nothing; drop that size or lower --reserve");
    }
  }
  if (cli.check_batch) refuse("--check-batch", "check one size with --memory-limit SIZE");
  if (!cli.lengths.empty()) refuse("--lengths", "sweep the lengths with --memory-limit SIZE");
  if (cli.cache) refuse("--cache", "leave --cache out (the sizes share their trials already)");
  if (cli.report.rank->agrees()) {
    refuse("a world of " + std::to_string(cli.report.rank->world_size) + " ranks",
           "run the table on one process (--world-size N still plans for N ranks)");
  }
  if (args.count("env") != 0U) {
    refuse("--env",
           "the table has one answer per size; read the JSON's fleet rows (--json), or "
           "run --memory-limit SIZE --env on the card itself");
  }
  if (cli.eval || cli.eval_only || cli.check_eval_batch) {
    refuse("an evaluation flag",
           "size the evaluation batch per size with --memory-limit SIZE --eval (the table has no "
           "evaluation column yet)");
  }
}

}  // namespace

std::string flag(const cxxopts::ParseResult& args, const std::string& name) {
  return args[name].as<std::string>();
}

std::string flagBeforeParsing(int argc, char** argv, const std::string& name,
                              const std::string& short_name) {
  std::string value;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if ((arg == name || (!short_name.empty() && arg == short_name)) && i + 1 < argc) {
      value = argv[++i];
    } else if (arg.starts_with(name + "=")) {
      value = std::string(arg.substr(name.size() + 1));
    } else if (!short_name.empty() && arg.starts_with(short_name) && arg.size() > 2 &&
               !arg.starts_with("--")) {
      value = std::string(arg.substr(short_name.size()));
    }
  }
  return value;
}

void readOptions(const cxxopts::ParseResult& args, CliConfig& cli) {
  readRankOptions(args, cli);
  cli.report.spec.ddp = args["ddp"].as<bool>();
  const autobatch::ModelFormat& model_format = readModel(args, cli);
  checkEvalFormat(args, cli.report.spec.model_path, model_format);
  readInputs(args, cli);
  readLossAndOptimizer(args, cli.report.spec, model_format);
  readStep(args, cli.report.spec);
  readDevice(args, cli, model_format);
  readMemory(args, cli.report.options);
  readSearch(args, cli.report.options);
  readTargets(args, cli);
  readModes(args, cli);
  readEval(args, cli);
  readFleet(args, cli);
}

namespace {

// A flag that takes a value (parsed and checked by the read* functions above, in our words).
std::shared_ptr<cxxopts::Value> text() { return cxxopts::value<std::string>(); }

// The help's groups, in the order --help prints them.
void addModelOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Model")
    ("m,model", "TorchScript archive (torch.jit.save) or pt2 package (written by "
                "scripts/autobatch_export.py --format pt2); see docs/formats.md", text(), "PATH")
    ("i,input", "One sample of a forward argument, e.g. 3x224x224 or int64:256:<32000 (repeat or "
                "comma-separate, one per argument; see docs/inputs.md). Default: the archive's",
     cxxopts::value<std::vector<std::string>>(), "SPEC")
    ("loss", "mean, cross-entropy, mse or model. Default: the archive's, else mean", text(), "NAME");
  // clang-format on
}

void addStepOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Training step")
    ("optimizer", "none, sgd, sgd-momentum, adam, adamw", text()->default_value("adamw"), "NAME")
    ("optimizer-impl", "auto (PyTorch's default: foreach on CUDA, loop on the CPU), loop, foreach, "
                       "fused", text()->default_value("auto"), "NAME")
    ("zero-grad", "none (set_to_none=True, PyTorch's default) or zeros (set_to_none=False: "
                  "gradients stay allocated through the next forward)",
     text()->default_value("none"), "MODE")
    ("keep-output", "yes: your loop keeps the model's output (logits = model(x)) through backward "
                    "and the step; no: it drops it before backward (Lightning, HF Trainer)",
     text()->default_value("yes"), "yes|no")
    ("lr", "Learning rate (memory does not depend on it)", text()->default_value("0.001"), "X")
    ("precision", "fp32, amp-fp16, amp-bf16, fp16, bf16", text()->default_value("fp32"), "NAME")
    ("device", "auto (cuda:0 when a GPU is seen, else cpu), cpu, cuda, cuda:N",
     text()->default_value("auto"), "NAME")
    ("steps-per-trial", "Optimizer steps per trial; 1 only with sgd or none and --zero-grad "
     "none (optimizer state and kept gradients are there from step 2 on)",
     text()->default_value("2"), "N")
    ("accumulation-steps", "Micro-batches per optimizer step in your job (>= 2 runs 2 per trial)",
     text()->default_value("1"), "N")
    ("cudnn-benchmark", "cuDNN benchmark mode (its workspace is part of the trial)")
    ("optimize-graph", "TorchScript graph-executor optimisation (default off: deterministic memory)")
    ("seed", "Seed of the synthetic inputs", text()->default_value("0"), "N");
  // clang-format on
}

void addMemoryOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Memory")
    ("memory-limit", "Limit, e.g. 24GiB (2^30) or 24GB (10^9); a size needs its unit (B, KB .. TB, "
                     "KiB .. TiB), only 0 goes without. CUDA: emulates a smaller card. Default: "
                     "the device's", text(), "SIZE")
    ("reserve", "Memory kept free for what a trial does not show, e.g. 512MiB",
     text()->default_value("0"), "SIZE")
    ("margin", "Headroom under the limit: a percentage (5%) or a size (64MiB)",
     text()->default_value("5%"), "M")
    ("fleet", "Fleet table: one answer per memory size, sizes (24GiB) or GPU names (t4, l4, a10g, "
              "rtx4090, a100-40gb, l40s, a100-80gb, h100-80gb, h200; docs/fleet.md), searched "
              "largest first with trials shared", text(), "LIST");
  // clang-format on
}

void addSearchOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Search")
    ("strategy", "guided, binsearch (Lightning), power", text()->default_value("guided"), "NAME")
    ("min-batch", "Smallest micro-batch tried", text()->default_value("1"), "N")
    ("max-batch", "Largest micro-batch tried (0: no bound)", text()->default_value("0"), "N")
    ("dataset-size", "Samples in the dataset, a bound (0: unknown)", text()->default_value("0"), "N")
    ("initial-batch", "First size of binsearch and power", text()->default_value("2"), "N")
    ("tolerance", "Relative tolerance of the bracket (0: exact)", text()->default_value("0"), "X")
    ("max-trials", "Trial budget (0: none)", text()->default_value("0"), "N")
    ("time-limit", "Wall-clock budget in seconds (0: none)", text()->default_value("0"), "S")
    ("check-batch", "Preflight: only check that micro-batch N (within --min-batch and --max-batch) "
                    "fits (exit 0) or not (exit 3)", text(), "N")
    ("eval", "After the training search, find the largest evaluation batch with the training "
             "state resident (parameters, optimizer state, gradients with --zero-grad zeros; "
             "docs/evaluation.md)")
    ("eval-only", "Find the largest evaluation batch of an evaluation job alone (parameters only)")
    ("check-eval-batch", "Preflight: only check that evaluation batch E fits with the training "
                         "state resident (exit 0) or not (exit 3)", text(), "E")
    ("cache", "Reuse a past search's answer for the same model, inputs, options, device and "
              "versions, confirmed by one trial (folder: AUTOBATCH_CACHE_DIR, else "
              "XDG_CACHE_HOME/autobatch/results, else ~/.cache/autobatch/results)")
    ("cache-trust", "With --cache: answer a hit without the confirming trial")
    ("lengths", "Sequence-length sweep: the values of L in --input, a list 128,512,1536 or a "
                "range 128..2048 (powers of two in it plus both ends)", text(), "LIST")
    ("target-tokens", "With --lengths: tokens per optimizer step; each length's target is "
                      "floor(N / tokens per sequence) sequences, a multiple of the world size "
                      "(a sequence: the elements of the first input naming L, e.g. 2L for 2xL); "
                      "it must give one sequence per rank at some length", text(), "N");
  // clang-format on
}

void addPlanOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Plan")
    ("t,target-batch", "Target effective (global) batch for the accumulation plan", text(), "N")
    ("world-size", "Data-parallel ranks sharing the target. Default: WORLD_SIZE or SLURM_NTASKS, "
                   "else 1", text(), "N")
    ("plan", "Primary plan: fastest (by the step times measured), auto, uniform, balanced",
     text()->default_value("fastest"), "NAME");
  // clang-format on
}

void addRankOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Ranks (multi-rank preflight; default: torchrun's or Slurm's environment)")
    ("rank", "This rank (RANK, SLURM_PROCID); with a world size > 1 the ranks agree on the "
             "smallest micro-batch through a c10d TCPStore", text(), "N")
    ("local-rank", "GPU of this rank on its node: --device cuda means cuda:N (LOCAL_RANK, "
                   "SLURM_LOCALID)", text(), "N")
    ("master-addr", "Store host (MASTER_ADDR, else Slurm's first node, else 127.0.0.1)", text(),
     "HOST")
    ("master-port", "Store port (MASTER_PORT, else 15000 + SLURM_JOB_ID mod 10000, else 29500)",
     text(), "N")
    ("rank-timeout", "Seconds to reach the store, and a rank may stay silent (no result, no "
                     "heartbeat) before the others exit 4", text()->default_value("300"), "S")
    ("ddp", "The job uses DistributedDataParallel: every trial also holds one gradient-sized "
            "copy (DDP's gradient buckets)");
  // clang-format on
}

void addOutputOptions(cxxopts::Options& options) {
  // clang-format off
  options.add_options("Output")
    ("json", "Write the JSON report to PATH (- for stdout, not with --env), on every exit; "
             "checked before the first trial, replaced whole at the end", text(), "PATH")
    ("env", "Print shell lines for eval (AUTOBATCH_MICRO_BATCH, ...) on stdout, which carries "
            "nothing else (the model's own prints go to stderr)")
    ("v,verbose", "Debug log lines")
    ("q,quiet", "Only warnings and errors in the log")
    ("h,help", "Print this help and exit")
    ("version", "Print the version, the LibTorch build and the GPUs seen, and exit");
  // clang-format on
}

}  // namespace

cxxopts::Options makeOptions() {
  cxxopts::Options options(
      "autobatch",
      "Finds the largest micro-batch a model (TorchScript archive or pt2 training-step package) "
      "can train with on this device, by "
      "running real training steps, and plans gradient accumulation for a target batch.\n"
      "Example: autobatch --model net.pt --target-batch 512");
  addModelOptions(options);
  addStepOptions(options);
  addMemoryOptions(options);
  addSearchOptions(options);
  addPlanOptions(options);
  addRankOptions(options);
  addOutputOptions(options);
  return options;
}

}  // namespace autobatch::cli
