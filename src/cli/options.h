// The command line's options (the only user of cxxopts): the flag table, and readOptions, which
// reads every flag into one CliConfig with autobatch's own parsers, so that an error names the
// flag and says what was expected (autobatch::Error: exit 2).
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/probes/model_format.h"
#include "autobatch/reports/report.h"
#include "autobatch/run/rank_group.h"
#include "autobatch/workflows/fleet.h"

namespace autobatch::cli {

/// The largest micro-batch any flag accepts (--min-batch, --max-batch, --target-batch,
/// --check-batch, --check-eval-batch, ...).
inline constexpr std::int64_t kMaxBatch = std::int64_t{1} << 40;

/// What the command line asks for.
struct CliConfig {
  /// The run's spec, options and rank, filled in place as the flags are read (so that a usage
  /// error's JSON report shows what was read before it). readOptions reads report.build (the
  /// GPUs seen, for --device) and report.spec.model_path as given before parsing.
  ReportData report;
  std::optional<std::int64_t> check_batch;
  bool cache = false;
  bool cache_trust = false;
  std::string cache_dir;
  /// --input texts as given (a sweep substitutes L in them per length).
  std::vector<std::string> input_texts;
  /// --lengths, longest first; empty without a sweep.
  std::vector<std::int64_t> lengths;
  std::int64_t target_tokens = 0;
  /// --fleet's sizes, as given; empty without a fleet table.
  std::vector<FleetSize> fleet;
  std::string json_path;
  bool env = false;
  RankGroupOptions rank_options;
  /// --eval, --eval-only, --check-eval-batch E (docs/evaluation.md).
  bool eval = false;
  bool eval_only = false;
  std::optional<std::int64_t> check_eval_batch;
};

/// The flag table (and --help's text).
cxxopts::Options makeOptions();

/// A flag's value as text.
std::string flag(const cxxopts::ParseResult& args, const std::string& name);

/// A flag's value from the raw arguments (the last one given, as cxxopts takes it; "" when
/// absent), so that a command line cxxopts cannot parse (an unknown or misspelled flag, a flag
/// missing its value) still gets its JSON report (docs/errors.md promises one on every exit), and
/// that report still never replaces the model file. `short_name` (e.g. "-m") may be empty.
std::string flagBeforeParsing(int argc, char** argv, const std::string& name,
                              const std::string& short_name = "");

/// --eval, --eval-only or --check-eval-batch on a model format that cannot run a forward alone
/// (a pt2 package). Throws: autobatch::Error naming the fix (export as TorchScript).
void checkEvalFormat(const cxxopts::ParseResult& args, const std::string& model_path,
                     const autobatch::ModelFormat& model_format);

/// Reads --eval, --eval-only and --check-eval-batch into `cli` (after every other flag: it checks
/// the combinations with --check-batch, --target-batch, --lengths and --cache). Throws:
/// autobatch::Error naming the flag and the fix.
void readEval(const cxxopts::ParseResult& args, CliConfig& cli);

/// Reads every flag but --json, --env, --help, --version, -v and -q into `cli` (in the order
/// of the flag groups; the first invalid flag throws). Throws: autobatch::Error naming the flag.
void readOptions(const cxxopts::ParseResult& args, CliConfig& cli);

}  // namespace autobatch::cli
