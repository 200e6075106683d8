// The autobatch command line. The only user of cxxopts; the only catch-all. Exit codes: see
// kExitCodes below, README.md and docs/errors.md.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <cxxopts.hpp>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "autobatch/autobatch.h"
#include "autobatch/error.h"
#include "autobatch/failure.h"
#include "autobatch/input_spec.h"
#include "autobatch/model_format.h"
#include "autobatch/rank_group.h"
#include "autobatch/ranks.h"
#include "autobatch/report.h"
#include "autobatch/result_cache.h"
#include "autobatch/trial_runner.h"
#include "autobatch/units.h"
#include "autobatch/version.h"

namespace {

using autobatch::Error;

constexpr int kExitOk = 0;
constexpr int kExitRuntimeError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitDoesNotFit = 3;
constexpr int kExitRanks = 4;
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 40;

constexpr const char* kExitCodes = R"(Exit codes:
  0    found / fits
  1    runtime error (raised inside the model's forward or backward, or a fatal device error),
       or a run that would exit 0 but could not write its report (disk full)
  2    usage or bad input detected by autobatch (flags, specs, files, model signature)
  3    does not fit (nothing fits at the minimum batch, memory limit below what the model
       itself needs, --check-batch failed)
  4    ranks could not agree (multi-rank timeout)
  130  interrupted by SIGINT, 143 by SIGTERM: the current step finishes, the best verified
       result is printed and written; a second signal exits at once without writing
)";

// The first SIGINT/SIGTERM asks the run to stop after the step in progress; a second one
// exits at once, removing a pt2 package's files extracted at that moment (async-signal-safe: an
// atomic, unlink, rmdir and _exit). Constant-initialised, so it is valid before any constructor
// runs.
std::atomic<int> g_signal{0};

extern "C" void onSignal(int sig) {
  if (g_signal.exchange(sig) != 0) {
    autobatch::removeScratchFiles();
    _exit(128 + sig);
  }
}

// The process's standard output as it was at start (a descriptor >= 3), where the report, the
// env lines and `--json -` go, and only they: main() points descriptor 1 at stderr for the whole
// run, so that nothing a model prints (TorchScript's print, LibTorch's own lines, a package's
// output, through C++ streams or C stdio alike) reaches what a launcher evaluates or parses.
// -1 when standard output was closed at start.
int g_stdout_fd = -1;

std::string writeStdout(const std::string& text) {
  return autobatch::writeReportTo(g_stdout_fd, text);
}

// SA_RESTART: a read in progress (the model file) resumes instead of failing with EINTR. The two
// signals are unblocked: a mask inherited from the launcher would hold them until the end.
void installSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigset_t both;
  sigemptyset(&both);
  sigaddset(&both, SIGINT);
  sigaddset(&both, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &both, nullptr);
}

// Installed from the executable's .preinit_array, which the dynamic loader runs before the
// initialisers of the shared libraries: LibTorch's take seconds before main, and a signal then
// ended the process with no report (issue 27, row 5). Only the loader's own mapping and
// relocation come before it (56-80 ms from execve on a loaded 2-core machine).
extern "C" void autobatchPreinit(int /*argc*/, char** /*argv*/, char** /*envp*/) {
  installSignalHandlers();
}
__attribute__((section(".preinit_array"), used)) void (*g_preinit)(int, char**,
                                                                   char**) = autobatchPreinit;

std::string flag(const cxxopts::ParseResult& args, const std::string& name) {
  return args[name].as<std::string>();
}

struct Cli {
  autobatch::ReportData report;
  /// The trial in progress, to name the batch in an error raised in the training step.
  std::optional<autobatch::TrialRequest> running;
  std::optional<std::int64_t> check_batch;
  bool cache = false;
  bool cache_trust = false;
  std::string cache_dir;
  /// --input texts as given (a sweep substitutes L in them per length).
  std::vector<std::string> input_texts;
  /// --lengths, longest first; empty without a sweep.
  std::vector<std::int64_t> lengths;
  std::int64_t target_tokens = 0;
  std::string json_path;
  bool env = false;
  autobatch::RankGroupOptions rank_options;
  /// Multi-rank preflight: connected before the search, exchanged after it.
  std::unique_ptr<autobatch::RankGroup> ranks;
};

std::optional<int> intFlag(const cxxopts::ParseResult& args, const std::string& name,
                           std::int64_t min, std::int64_t max) {
  if (args.count(name) == 0U) return std::nullopt;
  return static_cast<int>(autobatch::parseInteger(flag(args, name), "--" + name, min, max));
}

// Flags first, then torchrun's or Slurm's environment (autobatch/ranks.h).
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
void checkTargetTokens(const Cli& cli, int world) {
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

// Every flag is read as text and parsed by autobatch's own parsers, so that an error names the
// flag and says what was expected.
void readOptions(const cxxopts::ParseResult& args, Cli& cli) {
  autobatch::TrainingSpec& spec = cli.report.spec;
  autobatch::SearchOptions& o = cli.report.options;
  const autobatch::RankInfo rank = readRanks(args);
  cli.report.rank = rank;
  cli.rank_options.timeout_s =
      autobatch::parseDecimal(flag(args, "rank-timeout"), "--rank-timeout", 0.1, 1e6);
  cli.rank_options.heartbeat_interval_s = std::min(1.0, cli.rank_options.timeout_s / 5.0);
  if (auto restart = autobatch::processEnvironment()("TORCHELASTIC_RESTART_COUNT")) {
    cli.rank_options.prefix += "/" + *restart;
  }
  spec.ddp = args["ddp"].as<bool>();
  using autobatch::parseInteger;
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
          spec.inputs.push_back(std::move(s));
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
  spec.device = autobatch::rankDevice(device, rank.local_rank);  // each rank on its own GPU

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
  o.world_size = rank.world_size;
  if (cli.target_tokens > 0) checkTargetTokens(cli, o.world_size);
  o.plan = autobatch::parsePlanKind(flag(args, "plan"));
  if (o.target_batch > 0) {
    // Fail before any trial runs: an impossible target costs no device time.
    (void)autobatch::planAccumulation(1, o.target_batch, o.world_size, o.plan);
  }
  if (args.count("check-batch") != 0U) {
    cli.check_batch = parseInteger(flag(args, "check-batch"), "--check-batch", 1, kMaxBatch);
    checkCheckBatch(*cli.check_batch, spec, o);
  }
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
  o.cancel = [] { return g_signal.load() != 0; };
  o.before_trial = [&cli](const autobatch::TrialRequest& r) { cli.running = r; };
  o.on_trial = [&cli](const autobatch::TrialResult& t) {
    cli.running.reset();
    spdlog::info("trial batch {} x {}: {}, peak {}{}", t.request.micro_batch_size,
                 t.request.micro_batches_per_step,
                 t.cancelled ? "cancelled" : std::string(autobatch::toString(t.outcome)),
                 autobatch::formatBytes(t.peak_bytes),
                 t.step_ms > 0 ? fmt::format(", {:.0f} ms/step", t.step_ms) : "");
  };
}

cxxopts::Options makeOptions() {
  cxxopts::Options options(
      "autobatch",
      "Finds the largest micro-batch a model (TorchScript archive or pt2 training-step package) "
      "can train with on this device, by "
      "running real training steps, and plans gradient accumulation for a target batch.\n"
      "Example: autobatch --model net.pt --target-batch 512");
  auto text = [] { return cxxopts::value<std::string>(); };
  // clang-format off
  options.add_options("Model")
    ("m,model", "TorchScript archive (torch.jit.save) or pt2 package (--format pt2); see "
                "scripts/autobatch_export.py and docs/formats.md", text(), "PATH")
    ("i,input", "One sample of a forward argument, e.g. 3x224x224 or int64:256:<32000 (repeat or "
                "comma-separate, one per argument; see docs/inputs.md). Default: the archive's",
     cxxopts::value<std::vector<std::string>>(), "SPEC")
    ("loss", "mean, cross-entropy, mse or model. Default: the archive's, else mean", text(), "NAME");
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
  options.add_options("Memory")
    ("memory-limit", "Limit, e.g. 24GiB (2^30) or 24GB (10^9); a size needs its unit (B, KB .. TB, "
                     "KiB .. TiB), only 0 goes without. CUDA: emulates a smaller card. Default: "
                     "the device's", text(), "SIZE")
    ("reserve", "Memory kept free for what a trial does not show, e.g. 512MiB",
     text()->default_value("0"), "SIZE")
    ("margin", "Headroom under the limit: a percentage (5%) or a size (64MiB)",
     text()->default_value("5%"), "M");
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
  options.add_options("Plan")
    ("t,target-batch", "Target effective (global) batch for the accumulation plan", text(), "N")
    ("world-size", "Data-parallel ranks sharing the target. Default: WORLD_SIZE or SLURM_NTASKS, "
                   "else 1", text(), "N")
    ("plan", "Primary plan: fastest (by the step times measured), auto, uniform, balanced",
     text()->default_value("fastest"), "NAME");
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
  return options;
}

int exitCodeFor(const autobatch::ReportData& report) {
  if (g_signal.load() != 0) return 128 + g_signal.load();
  if (report.check) return report.check->fits_with_margin ? kExitOk : kExitDoesNotFit;
  if (report.result) return report.result->search.safe_micro_batch > 0 ? kExitOk : kExitDoesNotFit;
  return kExitRuntimeError;
}

std::string statusFor(const autobatch::ReportData& report) {
  if (g_signal.load() != 0) return "interrupted";
  if (report.check) return report.check->fits_with_margin ? "fits" : "does-not-fit";
  return std::string(autobatch::toString(report.result->search.status));
}

// A report that could not be written: said on stderr; exit 0 becomes 1 (status runtime-error,
// docs/errors.md), since a launcher would read nothing or half of it. Other codes are kept.
void reportLost(Cli& cli, const std::string& what, const std::string& why) {
  std::cerr << "autobatch: could not write " << what << ": " << why << "\n";
  if (cli.report.exit_code != kExitOk) return;
  cli.report.exit_code = kExitRuntimeError;
  cli.report.status = "runtime-error";
  cli.report.error = "could not write " + what + ": " + why;
}

void writeOutputs(Cli& cli) {
  const bool machine_on_stdout = cli.env || cli.json_path == "-";
  const std::string human = autobatch::humanReport(cli.report);
  if (machine_on_stdout) {
    std::cerr << human;
  } else if (const std::string why = writeStdout(human); !why.empty()) {
    reportLost(cli, "the report to standard output", why);
  }
  if (cli.env) {
    if (const std::string why = writeStdout(autobatch::envLines(cli.report)); !why.empty()) {
      reportLost(cli, "the env lines to standard output", why);
    }
  }
  if (cli.json_path.empty()) return;
  const std::string json = autobatch::toJson(cli.report);
  const std::string why =
      cli.json_path == "-" ? writeStdout(json) : autobatch::writeReportFile(cli.json_path, json);
  if (!why.empty()) reportLost(cli, "the JSON report to '" + cli.json_path + "'", why);
}

// Every rank publishes its result; all take the minimum, and the plan is made again for it.
void agreeAcrossRanks(Cli& cli) {
  autobatch::SearchResult& s = cli.report.result->search;
  autobatch::RankReport mine;
  mine.rank = cli.report.rank->rank;
  mine.device = cli.report.spec.device;
  mine.safe_micro_batch = s.safe_micro_batch;
  mine.plan_max_micro_batch = s.plan ? s.plan_max_micro_batch : s.safe_micro_batch;
  mine.plan_verified = s.plan_verified;
  mine.memory_limit_bytes = s.memory_limit_bytes;
  const autobatch::Agreement agreement = cli.ranks->exchange(mine);
  cli.report.agreement = agreement;
  if (agreement.safe_micro_batch < s.safe_micro_batch) {
    s.warnings.push_back("this rank's safe micro-batch " + std::to_string(s.safe_micro_batch) +
                         " lowered to " + std::to_string(agreement.safe_micro_batch) +
                         ", the minimum over the ranks");
  }
  s.safe_micro_batch = agreement.safe_micro_batch;
  const auto& o = cli.report.options;
  if (agreement.safe_micro_batch == 0) {
    s.status = autobatch::SearchStatus::kNothingFits;
    s.plan.reset();
    s.plan_max_micro_batch = 0;
  } else if (o.target_batch > 0) {
    s.plan = autobatch::planAccumulation(agreement.plan_max_micro_batch, o.target_batch,
                                         o.world_size, o.plan);
    s.plan_max_micro_batch = agreement.plan_max_micro_batch;
    s.plan_verified = agreement.plan_verified;
  }
}

std::string utcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::array<char, 32> text{};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text.data();
}

// --cache: set the runner up, key the run by what the answer depends on, answer a hit with one
// confirming trial (none with --cache-trust), else search on the same runner and store.
void searchWithCache(const Cli& cli, autobatch::ReportData& report) {
  const auto start = std::chrono::steady_clock::now();
  const autobatch::SearchOptions& options = report.options;
  autobatch::TrialRunner runner(report.spec, options);
  report.result = autobatch::runnerFacts(runner);
  autobatch::CacheReport cache;
  cache.dir = cli.cache_dir;
  cache.key = autobatch::cacheKeyFields(report);
  cache.key.hash = autobatch::sha1Hex(cache.key.canonicalText());
  std::vector<std::string> warnings;
  std::optional<autobatch::TrialResult> failed_confirm;
  if (auto entry = autobatch::loadCachedResult(cache.dir, cache.key, warnings)) {
    autobatch::SearchOptions o = options;
    o.micro_batches_per_step = runner.microBatchesPerTrial();
    std::optional<autobatch::TrialResult> confirm;
    if (!cli.cache_trust) {
      const autobatch::TrialRequest request =
          autobatch::confirmRequest(*entry, o, runner.microBatchesPerTrial());
      if (o.before_trial) o.before_trial(request);
      confirm = runner.run(request);
      if (o.on_trial) o.on_trial(*confirm);
    }
    if (cli.cache_trust || autobatch::confirms(*entry, *confirm)) {
      cache.outcome = "hit";
      cache.trusted = cli.cache_trust;
      cache.stored_at = entry->stored_at;
      cache.cached_trials = entry->trials;
      cache.cached_search_s = entry->search_s;
      autobatch::MaxBatchResult result = autobatch::runnerFacts(runner);
      result.search = autobatch::searchResultFromCache(*entry, o, confirm);
      result.search.elapsed_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      result.search.warnings = warnings;
      report.result = std::move(result);
      report.cache = std::move(cache);
      return;
    }
    if (confirm->cancelled) {
      // Interrupted (the signal may have come while the model loaded): the trial neither
      // confirms nor refutes the entry, so it stays; the search below stops at once.
      warnings.push_back("result cache: the confirming trial was interrupted; the entry of " +
                         entry->stored_at + " is kept");
      cache.outcome = "miss";
    } else {
      autobatch::dropCachedResult(cache.dir, cache.key);
      warnings.push_back(
          "result cache: the entry of " + entry->stored_at + " did not confirm (batch " +
          std::to_string(confirm->request.micro_batch_size) + " x " +
          std::to_string(confirm->request.micro_batches_per_step) + ": " +
          std::string(autobatch::toString(confirm->outcome)) + "); dropped it and searched again");
      cache.outcome = "confirm-failed";
    }
    failed_confirm = confirm;
  } else {
    cache.outcome = "miss";
  }
  autobatch::MaxBatchResult result = autobatch::findMaxBatch(runner, options);
  if (failed_confirm) result.search.trials.insert(result.search.trials.begin(), *failed_confirm);
  result.search.warnings.insert(result.search.warnings.begin(), warnings.begin(), warnings.end());
  if (g_signal.load() == 0) {
    if (auto stored = autobatch::cachedResultOf(result.search, utcNow())) {
      cache.store_error = autobatch::storeCachedResult(cache.dir, cache.key, *stored);
      if (!cache.store_error.empty()) {
        result.search.warnings.push_back("result cache: not stored: " + cache.store_error);
      }
    }
  }
  report.result = std::move(result);
  report.cache = std::move(cache);
}

std::vector<autobatch::InputSpec> inputsAtLength(const Cli& cli, std::int64_t length) {
  std::vector<autobatch::InputSpec> inputs;
  for (const auto& text : cli.input_texts) {
    for (auto& spec : autobatch::parseInputSpecsAtLength(text, length)) {
      inputs.push_back(std::move(spec));
    }
  }
  return inputs;
}

// The buckets of a sweep run mixed in one trial (autobatch/bucket_mix.h), on a runner made for
// the longest length (`longest`'s spec and options).
// Micro-batches per step: 2 when a bucket's plan accumulates (as the job will run it), else the
// runner's.
autobatch::MixVerification verifyMix(const Cli& cli, const std::vector<autobatch::Bucket>& buckets,
                                     const autobatch::ReportData& longest, bool accumulates) {
  autobatch::TrialRunner runner(longest.spec, longest.options);
  const int micro_batches = accumulates ? 2 : runner.microBatchesPerTrial();
  // A mixed trial passes only under the limit less the margin, as every answer of the search.
  const std::int64_t margin = autobatch::marginBytes(longest.options, runner.memoryLimitBytes());
  const autobatch::CancelHook cancel = [] { return g_signal.load() != 0; };
  const autobatch::MixedProbe probe = [&](const std::vector<autobatch::Bucket>& steps) {
    std::vector<autobatch::MixedStep> mixed;
    std::string order;
    for (const auto& b : steps) {
      mixed.push_back({b.micro_batch_size, inputsAtLength(cli, b.length)});
      order += fmt::format("{}{}:{}", order.empty() ? "" : " ", b.length, b.micro_batch_size);
    }
    spdlog::info(
        "mixed verification: one trial of {} steps (length:micro-batch {}), {} "
        "micro-batch{} per step",
        steps.size(), order, micro_batches, micro_batches == 1 ? "" : "es");
    autobatch::TrialResult r = runner.runMixed(mixed, micro_batches, cancel);
    if (r.outcome != autobatch::TrialOutcome::kFits) {
      spdlog::warn("mixed verification: step {} (length {}) failed: {}", r.failed_step_index,
                   steps.at(static_cast<std::size_t>(r.failed_step_index)).length, r.reason);
    } else if (!r.cancelled && r.peak_bytes > r.memory_limit_bytes - margin) {
      spdlog::warn(
          "mixed verification: the trial fit, but its peak {} is above the limit less "
          "the margin {}: not verified",
          autobatch::formatBytes(r.peak_bytes),
          autobatch::formatBytes(r.memory_limit_bytes - margin));
    }
    return r;
  };
  return autobatch::verifyBucketMix(buckets, probe, margin, 6, cancel);
}

// The micro-batch a length's bucket trains with: its plan's bound when it has a plan, else its
// safe micro-batch.
std::int64_t bucketBatch(const autobatch::SearchResult& search) {
  return search.plan ? search.plan_max_micro_batch : search.safe_micro_batch;
}

// A row (and its search) whose bucket the mixed verification lowered from `from` to `to`: the safe
// batch, the tokens and the plan are at most `to`.
void lowerRow(autobatch::SweepRow& row, autobatch::SearchResult& search, std::int64_t from,
              std::int64_t to, const autobatch::SearchOptions& o) {
  row.lowered_from = from;
  search.warnings.push_back(
      to > 0 ? fmt::format("length {}: the mixed verification lowered micro-batch {} -> {} (it "
                           "fit alone, not mixed with the other lengths)",
                           row.length, from, to)
             : fmt::format("length {}: left out (micro-batch {} fit alone, but no size of it was "
                           "seen to pass mixed with the other lengths under the margin)",
                           row.length, from));
  const std::int64_t safe = std::min(row.safe_micro_batch, to);
  row.safe_micro_batch = safe;
  row.tokens_per_micro_batch = safe * row.tokens_per_sample;
  search.safe_micro_batch = safe;
  if (safe <= 0) {
    row.status = "fails-mixed";
    row.plan.reset();
    search.status = autobatch::SearchStatus::kNothingFits;  // never "found" with nothing safe
    search.plan.reset();
    search.plan_max_micro_batch = 0;
    return;
  }
  if (o.target_batch > 0 && search.plan) {
    search.plan_max_micro_batch = std::min(search.plan_max_micro_batch, to);
    search.plan = autobatch::planAccumulation(search.plan_max_micro_batch, o.target_batch,
                                              o.world_size, o.plan);
    row.plan = search.plan;
  }
}

// A length's row from its search.
autobatch::SweepRow sweepRow(std::int64_t length, std::int64_t tokens_per_sample,
                             const autobatch::ReportData& row_report) {
  const autobatch::SearchResult& r = row_report.result->search;
  autobatch::SweepRow row;
  row.length = length;
  row.tokens_per_sample = tokens_per_sample;
  row.status = std::string(autobatch::toString(r.status));
  row.max_micro_batch = r.max_micro_batch;
  row.safe_micro_batch = r.safe_micro_batch;
  row.tokens_per_micro_batch = r.safe_micro_batch * tokens_per_sample;
  for (const auto& t : r.trials) {
    if (t.request.micro_batch_size == r.safe_micro_batch &&
        t.outcome == autobatch::TrialOutcome::kFits && !t.cancelled) {
      row.binding_phase = autobatch::peakPhase(t);
    }
  }
  row.trials = static_cast<int>(r.trials.size());
  row.elapsed_s = r.elapsed_s;
  row.target_batch = row_report.options.target_batch;
  row.plan = r.plan;
  row.min_batch_needs_at_least_bytes = r.min_batch_needs_at_least_bytes;
  if (row_report.cache) row.cache_outcome = row_report.cache->outcome;
  return row;
}

std::string withoutBacktrace(std::string message);

// Searches one length into `row_report`. A model error at this length (a position table shorter
// than the length, a reshape that needs another length) becomes the row's error, so that the
// other lengths are still searched; what no length can get past (bad input, ranks, the model not
// fitting before any trial, a fatal device error) ends the run as without a sweep.
void searchLength(Cli& cli, autobatch::ReportData& row_report, autobatch::SweepRow& row) {
  try {
    if (cli.cache) {
      searchWithCache(cli, row_report);
    } else {
      row_report.result = autobatch::findMaxBatch(row_report.spec, row_report.options);
    }
    row = sweepRow(row.length, row.tokens_per_sample, row_report);
  } catch (const Error&) {
    throw;
  } catch (const autobatch::RankError&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& e) {
    if (autobatch::isFatalDeviceError(std::current_exception())) throw;
    row.status = "error";
    row.error = withoutBacktrace(e.what());
    if (cli.running) {
      row.error += fmt::format(" (raised in the training step at micro-batch {} x {} per step)",
                               cli.running->micro_batch_size, cli.running->micro_batches_per_step);
    }
    cli.running.reset();
    row_report.result.reset();
    spdlog::error("length {}: the model raised an error; the row says so and the sweep goes on: {}",
                  row.length, row.error);
  }
}

// The buckets of the rows that fit, run mixed; a bucket the mix lowers or drops lowers its row.
void verifySweepMix(const Cli& cli, autobatch::SweepReport& sweep,
                    std::vector<autobatch::ReportData>& reports) {
  std::vector<autobatch::Bucket> buckets;
  std::vector<std::size_t> bucket_rows;
  bool accumulates = false;
  for (std::size_t i = 0; i < sweep.rows.size(); ++i) {
    if (!reports[i].result) continue;  // an error row
    const autobatch::SearchResult& search = reports[i].result->search;
    if (sweep.rows[i].safe_micro_batch > 0 && bucketBatch(search) > 0) {
      autobatch::Bucket bucket{sweep.rows[i].length, bucketBatch(search)};
      for (const auto& t : search.trials) {
        if (t.outcome == autobatch::TrialOutcome::kFits &&
            t.request.micro_batch_size == bucket.micro_batch_size) {
          bucket.alone_peak_bytes = std::max(bucket.alone_peak_bytes, t.peak_bytes);
        }
      }
      buckets.push_back(bucket);
      bucket_rows.push_back(i);
      accumulates = accumulates || (search.plan && search.plan->primary().accumulation_steps > 1);
    }
  }
  if (g_signal.load() != 0 || buckets.empty()) return;
  sweep.mixed = buckets.size() >= 2
                    ? verifyMix(cli, buckets, reports[bucket_rows.front()], accumulates)
                    : autobatch::MixVerification{};
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const std::int64_t from = buckets[k].micro_batch_size;
    const std::int64_t to =
        sweep.mixed->buckets.empty() ? from : sweep.mixed->buckets[k].micro_batch_size;
    if (to == from) continue;
    const std::size_t i = bucket_rows[k];
    lowerRow(sweep.rows[i], reports[i].result->search, from, to, reports[i].options);
  }
}

// --time-limit is the whole sweep's wall-clock budget: each length gets what is left of it (it
// was each length's: 21.6 s with --time-limit 8; issue 27, row 10). Once it is spent, a length
// stops before its first trial with status time-budget. 0: no limit.
double timeLeftS(double limit_s, std::chrono::steady_clock::time_point start) {
  if (limit_s <= 0.0) return 0.0;
  const double spent_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::max(limit_s - spent_s, 1e-9);  // 0 would mean no limit
}

// --lengths: one search per length, longest first, each seeded by the longer length's maximum
// (it fits: memory grows with the length) and that maximum at the same tokens per micro-batch;
// then the buckets mixed in one trial (lowered where the mix fails). The report's result is the
// longest length that fits (else the last one searched). Exit: 0 when a length fits; else 1 when
// a length raised an error (thrown here, with the rows in the report), else 3.
void runSweep(Cli& cli) {
  autobatch::SweepReport sweep;
  sweep.target_tokens = cli.target_tokens;
  std::vector<autobatch::ReportData> reports;
  std::int64_t prev_length = 0;
  std::int64_t prev_tokens = 0;  // tokens per sample at prev_length
  std::int64_t prev_max = 0;
  const int world = cli.report.options.world_size;
  const auto sweep_start = std::chrono::steady_clock::now();
  for (const std::int64_t length : cli.lengths) {
    if (g_signal.load() != 0) break;
    autobatch::ReportData row_report = cli.report;
    row_report.spec.inputs = inputsAtLength(cli, length);
    autobatch::SearchOptions& o = row_report.options;
    o.time_limit_s = timeLeftS(cli.report.options.time_limit_s, sweep_start);
    autobatch::SweepRow row;
    row.length = length;
    row.tokens_per_sample = autobatch::tokensPerSample(cli.input_texts, length);
    if (cli.target_tokens > 0) {
      o.target_batch = cli.target_tokens / row.tokens_per_sample / world * world;
    }
    if (prev_max > 0) o.seed_batches = {prev_max, prev_max * prev_tokens / row.tokens_per_sample};
    spdlog::info("length {}: searching{}", length,
                 prev_max > 0
                     ? fmt::format(" from batch {} (fits at length {})", prev_max, prev_length)
                     : std::string());
    row.target_batch = o.target_batch;
    searchLength(cli, row_report, row);
    sweep.rows.push_back(row);
    if (row.max_micro_batch > 0) {
      prev_length = length;
      prev_tokens = row.tokens_per_sample;
      prev_max = row.max_micro_batch;
    }
    reports.push_back(std::move(row_report));
  }
  verifySweepMix(cli, sweep, reports);
  const autobatch::ReportData* pick = nullptr;
  std::string errors;
  for (std::size_t i = 0; i < sweep.rows.size(); ++i) {
    if (sweep.rows[i].status == "error") {
      errors += fmt::format("; length {}: {}", sweep.rows[i].length, sweep.rows[i].error);
    }
    if (reports[i].result && (pick == nullptr || pick->result->search.safe_micro_batch <= 0)) {
      pick = &reports[i];  // the first that fits, else the last searched
    }
    if (sweep.longest_trainable_length == 0 && sweep.rows[i].safe_micro_batch > 0) {
      sweep.longest_trainable_length = sweep.rows[i].length;
    }
  }
  if (pick != nullptr) {
    cli.report.spec = pick->spec;
    const double time_limit_s = cli.report.options.time_limit_s;  // the flag, not what was left
    cli.report.options = pick->options;
    cli.report.options.time_limit_s = time_limit_s;
    cli.report.result = pick->result;
    cli.report.cache = pick->cache;
  }
  cli.report.sweep = std::move(sweep);
  if (cli.report.sweep->longest_trainable_length == 0 && !errors.empty()) {
    throw std::runtime_error("no length of the sweep trains, and the model raised an error at " +
                             errors.substr(2));
  }
}

// A flag's value from the raw arguments (the last one given, as cxxopts takes it; "" when
// absent), so that a command line cxxopts cannot parse (an unknown or misspelled flag, a flag
// missing its value) still gets its JSON report (docs/errors.md promises one on every exit), and
// that report still never replaces the model file. `short_name` (e.g. "-m") may be empty.
std::string flagBeforeParsing(int argc, char** argv, const std::string& name,
                              const std::string& short_name = "") {
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

// Output paths, before any trial: `--json -` never shares stdout with --env (eval would run the
// JSON), a --json file can be written and is not the model (autobatch/report.h).
void checkOutputs(Cli& cli, const cxxopts::ParseResult& args) {
  if (cli.env && cli.json_path == "-") {
    cli.json_path.clear();  // the refusal itself must not put the JSON on stdout either
    throw Error(
        "--json -: expected a file path with --env, but got - (standard output, where the env "
        "lines go: eval would run the JSON as shell code); write the JSON to a file with --json "
        "PATH");
  }
  if (args.count("json") != 0U) {
    try {
      autobatch::checkReportPath("--json", cli.json_path, {cli.report.spec.model_path});
    } catch (const Error&) {
      cli.json_path.clear();
      throw;
    }
  }
  if ((cli.env || cli.json_path == "-") && g_stdout_fd < 0) {
    throw Error(std::string(cli.env ? "--env" : "--json -") +
                ": expected an open standard output, but it was closed when autobatch started");
  }
}

// A signal before the search (parsing, hashing the model, connecting the ranks): the report with
// no result, once that step has returned (docs/errors.md).
int interruptedBeforeSearch(Cli& cli) {
  spdlog::warn("interrupted by signal {} before the search", g_signal.load());
  if (cli.ranks) cli.ranks->abandon("interrupted");
  cli.report.status = "interrupted";
  cli.report.exit_code = 128 + g_signal.load();
  writeOutputs(cli);
  return cli.report.exit_code;
}

int run(int argc, char** argv, Cli& cli) {
  auto options = makeOptions();
  cli.json_path = flagBeforeParsing(argc, argv, "--json");
  cli.env = std::any_of(argv + 1, argv + argc,
                        [](const char* arg) { return std::string_view(arg) == "--env"; });
  cli.report.spec.model_path = flagBeforeParsing(argc, argv, "--model", "-m");
  const auto args = options.parse(argc, argv);
  if (args.count("json") != 0U) cli.json_path = flag(args, "json");
  cli.env = args.count("env") != 0U;
  if (args.count("help") != 0U) {
    (void)writeStdout(options.help() + "\n" + kExitCodes);
    return kExitOk;
  }
  if (!args.unmatched().empty()) {
    throw Error("unexpected argument '" + args.unmatched().front() +
                "': expected only flags (see autobatch --help)");
  }
  if (args.count("quiet") != 0U) spdlog::set_level(spdlog::level::warn);
  if (args.count("verbose") != 0U) spdlog::set_level(spdlog::level::debug);
  cli.report.build = autobatch::buildInfo();
  if (args.count("version") != 0U) {
    (void)writeStdout(autobatch::versionText(cli.report.build));
    return kExitOk;
  }
  readOptions(args, cli);
  checkOutputs(cli, args);
  if (g_signal.load() != 0) return interruptedBeforeSearch(cli);
  const auto& spec = cli.report.spec;
  if (std::filesystem::is_regular_file(spec.model_path)) {
    cli.report.model_file_bytes =
        static_cast<std::int64_t>(std::filesystem::file_size(spec.model_path));
    cli.report.model_sha1 = autobatch::fileSha1(spec.model_path);
    if (g_signal.load() != 0) return interruptedBeforeSearch(cli);
  }
  const autobatch::RankInfo& rank = *cli.report.rank;
  if (rank.agrees()) {
    if (cli.check_batch) {
      throw Error("--check-batch: expected a single rank, but got rank " +
                  std::to_string(rank.rank) + " of " + std::to_string(rank.world_size) +
                  "; a multi-rank preflight searches (give --target-batch)");
    }
    cli.ranks = std::make_unique<autobatch::RankGroup>(rank, cli.rank_options);
    spdlog::info("{}", cli.ranks->describe());
    if (g_signal.load() != 0) return interruptedBeforeSearch(cli);
  }
  // From here a signal during loading or the runner's set-up stops the search before its first
  // trial (the cancel hook), and the report below has no result.
  if (cli.check_batch) {
    cli.report.check = autobatch::checkBatch(spec, cli.report.options, *cli.check_batch);
  } else if (!cli.lengths.empty()) {
    runSweep(cli);
  } else if (cli.cache) {
    searchWithCache(cli, cli.report);
  } else {
    cli.report.result = autobatch::findMaxBatch(spec, cli.report.options);
  }
  if (cli.ranks && g_signal.load() == 0) agreeAcrossRanks(cli);
  if (cli.ranks && g_signal.load() != 0) cli.ranks->abandon("interrupted");
  cli.report.status = statusFor(cli.report);
  cli.report.exit_code = exitCodeFor(cli.report);
  writeOutputs(cli);
  return cli.report.exit_code;
}

// LibTorch appends a C++ backtrace to its messages ("Exception raised from ...", or straight
// "frame #0: ..." lines after an "[enforce fail at ...]" one): users need the message, not the
// frames (issue 27, row 13: 27 frames in stderr and the JSON).
std::string withoutBacktrace(std::string message) {
  for (const char* start : {"\nException raised from ", "\nframe #"}) {
    if (const auto at = message.find(start); at != std::string::npos) message.erase(at);
  }
  return message;
}

int fail(Cli& cli, const std::string& status, int code, const std::string& raw_message) {
  const std::string message = withoutBacktrace(raw_message);
  std::cerr << "autobatch: " << message << "\n";
  // The other ranks stop waiting for this one at once (they exit 4 naming it).
  if (cli.ranks && code != kExitRanks) cli.ranks->abandon(status);
  cli.report.status = status;
  cli.report.exit_code = code;
  cli.report.error = message;
  // Never on stdout beside --env lines; never over the model (or a path not checked yet).
  if (cli.json_path.empty() || (cli.json_path == "-" && cli.env)) return code;
  try {
    autobatch::checkReportPath("--json", cli.json_path, {cli.report.spec.model_path});
  } catch (const Error& e) {
    std::cerr << "autobatch: the JSON report was not written: " << e.what() << "\n";
    return code;
  }
  const std::string json = autobatch::toJson(cli.report);
  const std::string why =
      cli.json_path == "-" ? writeStdout(json) : autobatch::writeReportFile(cli.json_path, json);
  if (!why.empty()) {
    std::cerr << "autobatch: could not write the JSON report to '" << cli.json_path << "': " << why
              << "\n";
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Standard output is kept for the report alone (g_stdout_fd); descriptor 1 becomes stderr.
  g_stdout_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    // No stderr either: what the model prints goes nowhere rather than to the report.
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd > STDOUT_FILENO) {
      (void)dup2(null_fd, STDOUT_FILENO);
      close(null_fd);
    }
  }
  // A file-size limit (ulimit -f) fails a report's write with EFBIG, as a full disk does, instead
  // of killing the process halfway through it.
  std::signal(SIGXFSZ, SIG_IGN);
  installSignalHandlers();  // again, should a loader have skipped .preinit_array
  // Thread-safe: the trial runner logs a long step's progress from a thread of its own.
  // The log writes to a copy of descriptor 2, so that its lines reach the terminal while a pt2
  // package's call sends descriptor 2 itself to the debug log (src/pt2_package.cpp).
  const int log_fd = dup(STDERR_FILENO);
  std::FILE* log_file = log_fd >= 0 ? fdopen(log_fd, "w") : nullptr;
  if (log_file != nullptr) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(
        "autobatch",
        std::make_shared<spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>>(
            log_file, spdlog::color_mode::automatic)));
  } else {
    spdlog::set_default_logger(spdlog::stderr_color_mt("autobatch"));
  }
  spdlog::set_pattern("[%H:%M:%S] %^%l%$: %v");
  Cli cli;
  try {
    return run(argc, argv, cli);
  } catch (const cxxopts::exceptions::exception& e) {
    return fail(cli, "usage-error", kExitUsage, std::string(e.what()) + " (see autobatch --help)");
  } catch (const autobatch::RankError& e) {
    return fail(cli, "ranks-disagree", kExitRanks, e.what());
  } catch (const Error& e) {
    return fail(cli, "usage-error", kExitUsage, e.what());
  } catch (const c10::OutOfMemoryError& e) {
    // Out of memory outside any trial: setting up (loading the model, copying its weights) did
    // not fit, so no micro-batch can.
    return fail(cli, "nothing-fits", kExitDoesNotFit,
                std::string("the model does not fit before any trial: ") + e.what());
  } catch (const std::exception& e) {
    std::string where;
    if (cli.running) {
      where = " (raised in the training step at micro-batch " +
              std::to_string(cli.running->micro_batch_size) + " x " +
              std::to_string(cli.running->micro_batches_per_step) + " per step; not counted as " +
              "out of memory)";
    }
    return fail(cli, "runtime-error", kExitRuntimeError,
                std::string("error: ") + withoutBacktrace(e.what()) + where);
  }
}
