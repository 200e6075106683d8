// The autobatch command line: options (src/cli/options.cpp) -> one library call (a search, a
// check, a cached search, a length sweep; then the agreement across ranks) -> the report, plus
// logging, signals and exit codes. The only catch-all. Exit codes:
// autobatch/vocabulary/exit_codes.h, kExitCodesHelp below, README.md and docs/errors.md.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <cxxopts.hpp>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "autobatch/autobatch.h"
#include "autobatch/reports/report.h"
#include "autobatch/run/rank_agreement.h"
#include "autobatch/run/rank_group.h"
#include "autobatch/run/ranks.h"
#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/exit_codes.h"
#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/units.h"
#include "autobatch/vocabulary/version.h"
#include "autobatch/workflows/cached_search.h"
#include "autobatch/workflows/fleet.h"
#include "autobatch/workflows/length_sweep.h"
#include "cli/options.h"

namespace {

using autobatch::Error;
using autobatch::cli::CliConfig;
using autobatch::cli::flag;

constexpr int kExitOk = autobatch::kExitCodes.ok;
constexpr int kExitRuntimeError = autobatch::kExitCodes.runtime_error;
constexpr int kExitUsage = autobatch::kExitCodes.usage;
constexpr int kExitDoesNotFit = autobatch::kExitCodes.does_not_fit;
constexpr int kExitRanks = autobatch::kExitCodes.ranks;

// The statuses of autobatch/vocabulary/exit_codes.h, as --help prints them.
constexpr const char* kExitCodesHelp = R"(Exit codes:
  0    found / fits
  1    runtime error (raised inside the model's forward or backward, or a fatal device error),
       or a run that would exit 0 but could not write its report (disk full)
  2    usage or bad input detected by autobatch (flags, specs, files, model signature)
  3    does not fit (nothing fits at the minimum batch, memory limit below what the model
       itself needs, --check-batch failed)
  4    ranks could not agree (a rank died, failed or timed out) or run different jobs
       (another model, a flag the plan depends on, other inputs or autobatch version)
  130  interrupted by SIGINT, 143 by SIGTERM: the trial stops (on the CPU at its next op, on
       CUDA after the current step), the best verified result is printed and written; more
       signals within 2 s of the first are the same request; one after that exits at once
       without writing
)";

// The first SIGINT/SIGTERM asks the run to stop (inside a CPU step, at its next allocation; on
// CUDA after the step in progress). Signals within kSignalGraceMs of it are the same request:
// one request often arrives as two signals (coreutils `timeout` signals the child and then its
// process group; Ctrl-C reaches both torchrun's agent, which forwards it, and the worker), and
// taking the second for "exit at once" lost the report of a run that had a verified batch (two
// SIGTERMs 50 ms apart always did; `timeout` 3 times in 30). A signal after the grace period
// exits at once, removing a pt2 package's files extracted at that moment (async-signal-safe: an
// atomic, clock_gettime, unlink, rmdir and _exit). Constant-initialised, so it is valid before
// any constructor runs.
std::atomic<int> g_signal{0};
std::atomic<std::int64_t> g_first_signal_ns{0};
constexpr std::int64_t kSignalGraceMs = 2000;
// AUTOBATCH_SIGNAL_GRACE_MS overrides it (read before main: tests set 0 to check the exit at once).
std::int64_t g_signal_grace_ns = kSignalGraceMs * 1'000'000;

std::int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

extern "C" void onSignal(int sig) {
  const std::int64_t now = monotonicNs();
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    g_first_signal_ns.store(now);
    return;
  }
  // 0: the first signal's handler has not stored its time yet (another thread): the same request.
  const std::int64_t first = g_first_signal_ns.load();
  if (first == 0 || now - first < g_signal_grace_ns) return;
  autobatch::removeScratchFiles();
  _exit(128 + sig);
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
extern "C" void autobatchPreinit(int /*argc*/, char** /*argv*/, char** envp) {
  constexpr std::string_view kGrace = "AUTOBATCH_SIGNAL_GRACE_MS=";
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    const std::string_view var(*e);
    if (var.starts_with(kGrace) && var.size() > kGrace.size()) {
      char* end = nullptr;
      const long long ms = std::strtoll(*e + kGrace.size(), &end, 10);
      if (end != nullptr && *end == '\0' && ms >= 0 && ms <= 3'600'000) {
        g_signal_grace_ns = static_cast<std::int64_t>(ms) * 1'000'000;
      }
    }
  }
  installSignalHandlers();
}
__attribute__((section(".preinit_array"), used)) void (*g_preinit)(int, char**,
                                                                   char**) = autobatchPreinit;

struct Cli : CliConfig {
  /// The trial in progress, to name the batch in an error raised in the training step.
  std::optional<autobatch::TrialRequest> running;
  /// Multi-rank preflight: connected before the search, exchanged after it.
  std::unique_ptr<autobatch::RankGroup> ranks;
};

// The search's hooks: a signal cancels; each trial is logged and, while it runs, remembered.
void installHooks(Cli& cli) {
  autobatch::SearchOptions& o = cli.report.options;
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

int exitCodeFor(const autobatch::ReportData& report) {
  if (g_signal.load() != 0) return 128 + g_signal.load();
  if (report.check) return report.check->fits_with_margin ? kExitOk : kExitDoesNotFit;
  if (report.fleet) {
    const auto& rows = report.fleet->rows;
    return std::any_of(rows.begin(), rows.end(),
                       [](const auto& r) { return r.safe_micro_batch > 0; })
               ? kExitOk
               : kExitDoesNotFit;
  }
  if (report.result && report.result->eval && report.result->eval->search.safe_micro_batch == 0) {
    return kExitDoesNotFit;  // --eval: the training state, or no evaluation batch, did not fit
  }
  if (report.result) return report.result->search.safe_micro_batch > 0 ? kExitOk : kExitDoesNotFit;
  return kExitRuntimeError;
}

std::string statusFor(const autobatch::ReportData& report) {
  if (g_signal.load() != 0) return "interrupted";
  if (report.check) return report.check->fits_with_margin ? "fits" : "does-not-fit";
  if (!report.result) return report.fleet ? "not-measurable" : "runtime-error";
  if (report.result->eval && report.result->eval->search.safe_micro_batch == 0) {
    return "nothing-fits";  // --eval: exit 3 (exitCodeFor); eval.search_status says which
  }
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
  // A JSON file first: one that cannot be written (a full disk) turns exit 0 into 1, and the
  // report and env lines printed after it say so (AUTOBATCH_STATUS=found beside exit 1 misled a
  // launcher that reads the lines).
  const bool json_file = !cli.json_path.empty() && cli.json_path != "-";
  if (json_file) {
    const std::string why =
        autobatch::writeReportFile(cli.json_path, autobatch::toJson(cli.report));
    if (!why.empty()) reportLost(cli, "the JSON report to '" + cli.json_path + "'", why);
  }
  const int written_code = cli.report.exit_code;
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
  if (json_file && cli.report.exit_code != written_code) {
    // Standard output failed after the file was written: the file says so too.
    (void)autobatch::writeReportFile(cli.json_path, autobatch::toJson(cli.report));
  }
  if (cli.json_path != "-") return;
  if (const std::string why = writeStdout(autobatch::toJson(cli.report)); !why.empty()) {
    reportLost(cli, "the JSON report to standard output", why);
  }
}

// --cache: the folder, --cache-trust, and the model's fingerprint (hashed once, before the run).
autobatch::ResultCacheOptions cacheOptions(Cli& cli) {
  autobatch::ResultCacheOptions cache;
  cache.dir = cli.cache_dir;
  cache.trust = cli.cache_trust;
  cache.model_sha1 = cli.report.model_sha1;
  cache.model_file_bytes = cli.report.model_file_bytes;
  cache.build = cli.report.build;
  return cache;
}

// --cache without a sweep; the runner's facts reach the report before any trial, so that an error
// raised in a trial still reports the device and the model's memory.
void searchWithCache(Cli& cli) {
  autobatch::ResultCacheOptions cache = cacheOptions(cli);
  cache.on_setup = [&cli](const autobatch::MaxBatchResult& facts) { cli.report.result = facts; };
  autobatch::CachedSearchResult found =
      autobatch::findMaxBatchCached(cli.report.spec, cli.report.options, cache);
  cli.report.result = std::move(found.result);
  cli.report.cache = std::move(found.cache);
}

// --lengths (autobatch/workflows/length_sweep.h). The report's result is the longest length that
// fits (else the last one searched). Exit: 0 when a length fits; else 1 when a length raised an
// error (thrown here, with the rows in the report), else 3.
void runSweep(Cli& cli) {
  autobatch::LengthSweepOptions sweep;
  sweep.input_texts = cli.input_texts;
  sweep.lengths = cli.lengths;
  sweep.target_tokens = cli.target_tokens;
  if (cli.cache) sweep.cache = cacheOptions(cli);
  if (cli.eval) sweep.eval = autobatch::EvalState::kTrainingResident;  // an eval column per length
  // A model error ends its length's trial without on_trial: nothing runs once a row is done.
  sweep.on_row = [&cli](const autobatch::SweepRow&) { cli.running.reset(); };
  autobatch::LengthSweepResult found =
      autobatch::sweepLengths(cli.report.spec, cli.report.options, sweep);
  if (found.pick) {
    cli.report.spec = std::move(found.pick->spec);
    cli.report.options = std::move(found.pick->options);
    cli.report.result = std::move(found.pick->result);
    cli.report.cache = std::move(found.pick->cache);
  }
  cli.report.sweep = std::move(found.sweep);
  if (!found.error.empty()) throw std::runtime_error(found.error);
}

// --fleet (autobatch/workflows/fleet.h). The report's result is the largest measurable size's
// search. Exit: 0 when some size fits, else 3.
void runFleet(Cli& cli) {
  autobatch::FleetResult found =
      autobatch::sizeFleet(cli.fleet, cli.report.spec, cli.report.options);
  if (found.pick) cli.report.result = std::move(found.pick);
  cli.report.fleet = std::move(found.fleet);
}

// Every rank publishes its result; all take the minimum, and the plan is made again for it.
void agreeAcrossRanks(Cli& cli) {
  std::string inputs;
  for (const auto& input : cli.report.result->context.inputs) {
    inputs += (inputs.empty() ? "" : " ") + autobatch::toString(input);
  }
  cli.report.agreement =
      autobatch::agreeAcrossRanks(*cli.ranks, cli.report.rank->rank, cli.report.spec.device,
                                  cli.report.options, cli.report.result->search, inputs);
}

// Output paths, before any trial: `--json -` never shares stdout with --env (eval would run the
// JSON), a --json file can be written and is not the model (autobatch/reports/report.h).
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

// --help, --version, the log level and every flag. Returns an exit code when the run ends here.
std::optional<int> readCommandLine(cxxopts::Options& options, const cxxopts::ParseResult& args,
                                   Cli& cli) {
  if (args.count("json") != 0U) cli.json_path = flag(args, "json");
  cli.env = args.count("env") != 0U;
  if (args.count("help") != 0U) {
    (void)writeStdout(options.help() + "\n" + kExitCodesHelp);
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
  autobatch::cli::readOptions(args, cli);
  installHooks(cli);
  checkOutputs(cli, args);
  return std::nullopt;
}

// What every rank's plan depends on, compared in the job round before any trial (docs/launchers.md
// "What the ranks compare"): the model by content (SHA-1 and size, not its path) and the flags
// that change the trials or the plan, as given (--optimizer-impl auto resolves by device, so its
// given value is compared). Never compared: the device and local rank, the memory limit, reserve,
// margin and fleet, the device's name and memory, the allocator config, the search bounds,
// paths: ranks on other devices are what the minimum over the ranks is for.
autobatch::JobFields jobFieldsOf(const Cli& cli) {
  const auto& spec = cli.report.spec;
  const auto& o = cli.report.options;
  std::string lengths;
  for (const auto l : cli.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(l);
  const auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  return {
      {"model",
       cli.report.model_sha1 + " (" + std::to_string(cli.report.model_file_bytes) + " bytes)"},
      {"loss", spec.loss ? std::string(autobatch::toString(*spec.loss)) : "(the archive's)"},
      {"optimizer", std::string(autobatch::toString(spec.optimizer))},
      {"optimizer-impl", std::string(autobatch::toString(spec.optimizer_impl))},
      {"zero-grad", std::string(autobatch::toString(spec.zero_grad))},
      {"keep-output", yes(spec.keep_output)},
      {"precision", std::string(autobatch::toString(spec.precision))},
      {"steps-per-trial", std::to_string(spec.steps_per_trial)},
      {"accumulation-steps", std::to_string(spec.accumulation_steps)},
      {"ddp", yes(spec.ddp)},
      {"target-batch", std::to_string(o.target_batch)},
      {"target-tokens", std::to_string(cli.target_tokens)},
      {"lengths", lengths.empty() ? "(none)" : lengths},
      {"world-size", std::to_string(o.world_size)},
      {"plan", std::string(autobatch::toString(o.plan))},
      {"eval", cli.eval_only ? "only" : yes(cli.eval)},
  };
}

// Before the search: the model's fingerprint, and the ranks' store. Returns an exit code when a
// signal came meanwhile.
std::optional<int> prepare(Cli& cli) {
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
    if (cli.check_batch || cli.check_eval_batch) {
      throw Error(std::string(cli.check_batch ? "--check-batch" : "--check-eval-batch") +
                  ": expected a single rank, but got rank " + std::to_string(rank.rank) + " of " +
                  std::to_string(rank.world_size) +
                  "; a multi-rank preflight searches (give --target-batch)");
    }
    if (cli.report.model_sha1.empty()) {
      // Never two empty hashes taken as the same model: the job round compares them.
      throw Error("--model: expected a model file (the ranks compare its SHA-1), but '" +
                  spec.model_path + "' is not a regular file");
    }
    cli.rank_options.version = cli.report.build.autobatch_version;
    cli.ranks = std::make_unique<autobatch::RankGroup>(rank, cli.rank_options);
    spdlog::info("{}", cli.ranks->describe());
    if (g_signal.load() != 0) return interruptedBeforeSearch(cli);
    cli.ranks->compareJob(jobFieldsOf(cli));
    if (g_signal.load() != 0) return interruptedBeforeSearch(cli);
  }
  return std::nullopt;
}

int run(int argc, char** argv, Cli& cli) {
  auto options = autobatch::cli::makeOptions();
  cli.json_path = autobatch::cli::flagBeforeParsing(argc, argv, "--json");
  cli.env = std::any_of(argv + 1, argv + argc,
                        [](const char* arg) { return std::string_view(arg) == "--env"; });
  cli.report.spec.model_path = autobatch::cli::flagBeforeParsing(argc, argv, "--model", "-m");
  const auto args = options.parse(argc, argv);
  if (const auto code = readCommandLine(options, args, cli)) return *code;
  if (const auto code = prepare(cli)) return *code;
  // From here a signal during loading or the runner's set-up stops the search before its first
  // trial (the cancel hook), and the report below has no result.
  const auto& spec = cli.report.spec;
  if (cli.check_batch) {
    cli.report.check = autobatch::checkBatch(spec, cli.report.options, *cli.check_batch);
  } else if (cli.check_eval_batch) {
    cli.report.check = autobatch::checkEvalBatch(spec, cli.report.options, *cli.check_eval_batch);
  } else if (!cli.lengths.empty()) {
    runSweep(cli);
  } else if (!cli.fleet.empty()) {
    runFleet(cli);
  } else if (cli.cache) {
    searchWithCache(cli);
  } else if (cli.eval || cli.eval_only) {
    cli.report.result =
        autobatch::findMaxBatchAndEval(spec, cli.report.options,
                                       cli.eval_only ? autobatch::EvalState::kParametersOnly
                                                     : autobatch::EvalState::kTrainingResident);
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

int fail(Cli& cli, const std::string& status, int code, const std::string& raw_message) {
  const std::string message = autobatch::withoutBacktrace(raw_message);
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
  // package's call sends descriptor 2 itself to the debug log (src/probes/pt2_package.cpp).
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
                std::string("error: ") + autobatch::withoutBacktrace(e.what()) + where);
  }
}
