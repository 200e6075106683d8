// The evaluation flags (issue 31, docs/evaluation.md): --eval, --eval-only, --check-eval-batch,
// and the combinations they exclude. Part of readOptions (options.cpp).
#include <string>

#include "autobatch/probes/model_format.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "cli/options.h"

namespace autobatch::cli {

// --eval, --eval-only or --check-eval-batch on a format that cannot evaluate (pt2), said before
// the format's other checks.
void checkEvalFormat(const cxxopts::ParseResult& args, const std::string& model_path,
                     const autobatch::ModelFormat& model_format) {
  for (const char* name : {"eval", "eval-only", "check-eval-batch"}) {
    if (args.count(name) == 0U || model_format.capabilities.evaluation_forward) continue;
    throw Error("--" + std::string(name) + ": expected a TorchScript model, but '" + model_path +
                "' is a " + std::string(model_format.name) + " " +
                std::string(model_format.file_kind) +
                ", which holds the training step only; export the model as TorchScript "
                "(scripts/autobatch_export.py --format torchscript) to size its evaluation");
  }
}

// --eval, --eval-only and --check-eval-batch (docs/evaluation.md), and what they exclude.
void readEval(const cxxopts::ParseResult& args, CliConfig& cli) {
  cli.eval = args.count("eval") != 0U;
  cli.eval_only = args.count("eval-only") != 0U;
  if (args.count("check-eval-batch") != 0U) {
    cli.check_eval_batch =
        autobatch::parseInteger(flag(args, "check-eval-batch"), "--check-eval-batch", 1, kMaxBatch);
  }
  const char* used = cli.check_eval_batch ? "--check-eval-batch"
                     : cli.eval_only      ? "--eval-only"
                     : cli.eval           ? "--eval"
                                          : nullptr;
  if (used == nullptr) return;
  if (cli.check_eval_batch && cli.check_batch) {
    throw Error(
        "--check-eval-batch: expected no --check-batch (one check per run), but got both; run "
        "autobatch once with --check-batch and once with --check-eval-batch");
  }
  if (cli.check_eval_batch && (cli.eval || cli.eval_only)) {
    throw Error(
        "--check-eval-batch: expected no --eval or --eval-only (a check is one trial with the "
        "training state resident, not a search), but got " +
        std::string(cli.eval ? "--eval" : "--eval-only") + "; leave it out");
  }
  if (cli.eval && cli.eval_only) {
    throw Error(
        "--eval-only: expected no --eval (--eval sizes evaluation after the training search, "
        "--eval-only an evaluation job alone), but got both; keep one");
  }
  if (cli.eval_only && cli.check_batch) {
    throw Error(
        "--eval-only: expected no --check-batch (a training check), but got both; check an "
        "evaluation batch with --check-eval-batch");
  }
  if (cli.eval_only && cli.report.options.target_batch > 0) {
    throw Error(
        "--eval-only: expected no --target-batch (an evaluation batch needs no accumulation "
        "plan), but got --target-batch " +
        std::to_string(cli.report.options.target_batch) +
        "; leave it out, or plan training with --eval");
  }
  if (!cli.lengths.empty() && !cli.eval) {
    // --eval sweeps (an evaluation column per length); a check or an evaluation job alone does
    // not.
    throw Error(std::string(used) +
                ": expected no --lengths (a length sweep sizes evaluation with --eval, beside "
                "each length's training answer), but got --lengths; size one length with "
                "--input and " +
                used + ", or sweep with --eval");
  }
  if (cli.cache) {
    throw Error(std::string(used) +
                ": expected no --cache (the result cache holds training answers only), but got "
                "--cache; leave it out");
  }
  if (cli.eval && cli.check_batch) {
    throw Error(
        "--eval: expected a search, but got --check-batch; check an evaluation batch with "
        "--check-eval-batch");
  }
}

}  // namespace autobatch::cli
