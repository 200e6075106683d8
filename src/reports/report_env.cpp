// The env lines a launcher can `eval` (autobatch/reports/report.h, envLines): every value one shell
// word.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "autobatch/reports/report.h"
#include "reports/text_format.h"

namespace autobatch {

namespace {

using detail::cat;
using detail::join;

// `value` as one shell word that `eval` reads back as itself: bare when every character is one
// the shell never interprets, else single-quoted with each ' written as '\''. Env lines carry no
// text a model, a path or a flag could shape into shell code (issue 27).
std::string shellWord(const std::string& value, bool always_quote = false) {
  const bool plain = std::all_of(value.begin(), value.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_.,:/+-%@").find(c) != std::string_view::npos;
  });
  if (plain && !always_quote) return value;
  std::string quoted = "'";
  for (const char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// One uniform step of `count` micro-batches of `micro` samples on each of `world` ranks.
AccumulationPlan uniformPlan(std::int64_t micro, std::int64_t count, int world) {
  AccumulationPlan plan;
  plan.kind = PlanKind::kUniform;
  plan.groups = {{micro, count}};
  plan.accumulation_steps = count;
  plan.per_rank_batch = micro * count;
  plan.world_size = world;
  plan.effective_batch = plan.per_rank_batch * world;
  return plan;
}

// The plan a launcher runs: the primary plan for a target, one step of the safe micro-batch
// without one, the checked micro-batch x --accumulation-steps for a check; nullopt when nothing
// was verified under the margin.
std::optional<AccumulationPlan> launchPlan(const ReportData& d) {
  const int world = d.options.world_size;
  if (d.check && d.check->eval) return std::nullopt;  // an evaluation batch: no training plan
  if (d.result && d.result->search.safe_micro_batch > 0) {
    const SearchResult& s = d.result->search;
    if (s.plan) return s.plan->primary();
    return uniformPlan(s.safe_micro_batch, 1, world);
  }
  if (d.check && d.check->fits_with_margin) {
    return uniformPlan(d.check->trial.request.micro_batch_size, d.spec.accumulation_steps, world);
  }
  return std::nullopt;
}

// --eval / --eval-only / --check-eval-batch: the safe and the raw evaluation batch (0 when none
// was verified); nothing without them.
template <typename Line>
void appendEvalLines(const ReportData& d, const Line& line) {
  if (d.result && d.result->eval) {
    line("AUTOBATCH_EVAL_BATCH", std::to_string(d.result->eval->search.safe_micro_batch));
    line("AUTOBATCH_EVAL_MAX_BATCH", std::to_string(d.result->eval->search.max_micro_batch));
  } else if (d.check && d.check->eval) {
    const std::int64_t batch = d.check->trial.request.micro_batch_size;
    line("AUTOBATCH_EVAL_BATCH", std::to_string(d.check->fits_with_margin ? batch : 0));
    line("AUTOBATCH_EVAL_MAX_BATCH", std::to_string(d.check->fits ? batch : 0));
  }
}

// --lengths with --eval: each length's safe evaluation batch, "L:E" as AUTOBATCH_BUCKETS (the
// lengths where one fits).
template <typename Line>
void appendSweepEvalLine(const SweepReport& sweep, const Line& line) {
  std::string buckets;
  bool eval = false;
  for (const auto& r : sweep.rows) {
    eval = eval || !r.eval_status.empty();
    if (r.eval_safe_batch <= 0) continue;
    buckets += cat(buckets.empty() ? "" : " ", r.length, ":", r.eval_safe_batch);
  }
  if (eval) line("AUTOBATCH_EVAL_BUCKETS", shellWord(buckets, true));
}

}  // namespace

std::string envLines(const ReportData& d) {
  // The raw maximum and the safe batch, as in the JSON (result, or check.fits /
  // check.fits_with_margin): the maximum is reported even when nothing is under the margin.
  std::int64_t max_micro = 0;
  std::int64_t safe_micro = 0;
  if (d.result) {
    max_micro = d.result->search.max_micro_batch;
    safe_micro = d.result->search.safe_micro_batch;
  } else if (d.check && !d.check->eval) {
    const std::int64_t micro = d.check->trial.request.micro_batch_size;
    max_micro = d.check->fits ? micro : 0;
    safe_micro = d.check->fits_with_margin ? micro : 0;
  }
  const std::optional<AccumulationPlan> plan = launchPlan(d);
  std::string sizes;
  std::string groups;
  if (plan) {
    if (plan->listsMicroBatches()) sizes = join(plan->microBatchSizes(), " ");
    for (const auto& g : plan->groups) {
      groups += cat(groups.empty() ? "" : " ", g.micro_batch_size, ":", g.count);
    }
  }
  // What bounds the answer; "" for --check-batch (no search) and before any result.
  const std::string capped_by = d.result ? d.result->search.capped_by : "";
  std::string out;
  const auto line = [&out](const char* name, const std::string& word) {
    out += cat(name, "=", word, "\n");
  };
  line("AUTOBATCH_STATUS", shellWord(d.status));
  line("AUTOBATCH_MICRO_BATCH", std::to_string(plan ? plan->largestMicroBatch() : 0));
  line("AUTOBATCH_ACCUM_STEPS", std::to_string(plan ? plan->accumulation_steps : 0));
  line("AUTOBATCH_EFFECTIVE_BATCH", std::to_string(plan ? plan->effective_batch : 0));
  line("AUTOBATCH_WORLD_SIZE", std::to_string(d.options.world_size));
  line("AUTOBATCH_PLAN", shellWord(plan ? std::string(toString(plan->kind)) : "none"));
  line("AUTOBATCH_MICRO_BATCHES", shellWord(sizes, true));
  line("AUTOBATCH_MICRO_BATCH_GROUPS", shellWord(groups, true));
  line("AUTOBATCH_MAX_MICRO_BATCH", std::to_string(max_micro));
  line("AUTOBATCH_SAFE_MICRO_BATCH", std::to_string(safe_micro));
  line("AUTOBATCH_CAPPED_BY", shellWord(capped_by));
  if (d.sweep) {
    std::string buckets;
    for (const auto& r : d.sweep->rows) {
      if (r.safe_micro_batch <= 0) continue;
      buckets += cat(buckets.empty() ? "" : " ", r.length, ":", r.safe_micro_batch);
    }
    line("AUTOBATCH_LENGTH", std::to_string(d.sweep->longest_trainable_length));
    line("AUTOBATCH_BUCKETS", shellWord(buckets, true));
    appendSweepEvalLine(*d.sweep, line);
  }
  appendEvalLines(d, line);
  return out;
}

}  // namespace autobatch
