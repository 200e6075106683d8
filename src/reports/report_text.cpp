// The human report (autobatch/reports/report.h, humanReport): one function per section, in the
// order they are printed: header, trials, result, plans, memory, ranks, warnings, sweep, check,
// error.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "autobatch/reports/report.h"
#include "autobatch/vocabulary/units.h"
#include "reports/report_internal.h"

namespace autobatch {
namespace {

using detail::contextOf;
using detail::failedPhase;
using detail::memoryOf;
using detail::modelNeedsBytes;

std::string inputsText(const std::vector<InputSpec>& inputs) {
  std::string text;
  for (const auto& spec : inputs) {
    if (!text.empty()) text += ",";
    text += toString(spec);
  }
  return text;
}

// ---- header -------------------------------------------------------------------------------

// The device, its limit and the training step a trial runs.
void headerSection(std::ostream& out, const ReportData& d, const RunContext& ctx) {
  const MemoryBreakdown* m = memoryOf(d);
  const bool pt2 = m != nullptr && m->model_format == "pt2";
  std::string optimizer_impl;
  if (m != nullptr && !m->optimizer_impl.empty()) optimizer_impl = " (" + m->optimizer_impl + ")";
  out << fmt::format("device {} ({}), limit {} ({})\n", ctx.device, ctx.backend,
                     formatBytes(ctx.memory_limit_bytes), ctx.memory_limit_source);
  if (!d.step_description.empty()) {  // a step the library did not build (the Python package's)
    out << fmt::format("model {}: {}, {} steps per trial, {} micro-batch(es) per step\n",
                       d.spec.model_path, d.step_description, d.spec.steps_per_trial,
                       ctx.micro_batches_per_trial);
    return;
  }
  out << fmt::format(
      "model {}{}: inputs {}, loss {}, optimizer {}{}, zero_grad {}, output {}, {}, {} steps "
      "per trial, {} micro-batch(es) per step\n",
      d.spec.model_path, pt2 ? " (pt2 package)" : "", inputsText(ctx.inputs), toString(ctx.loss),
      toString(d.spec.optimizer), optimizer_impl, toString(d.spec.zero_grad),
      d.spec.keep_output ? "kept through the step" : "dropped", toString(d.spec.precision),
      d.spec.steps_per_trial, ctx.micro_batches_per_trial);
}

// ---- trials -------------------------------------------------------------------------------

// A trial's outcome in the human report: a fit whose peak is above the limit less the margin is
// not an answer, and says so ("fits, >margin"; the JSON's outcome stays "fits").
std::string outcomeText(const TrialResult& t, const SearchOptions& o) {
  if (t.cancelled) return "cancelled";
  if (t.outcome == TrialOutcome::kFits && t.memory_limit_bytes > 0 &&
      t.peak_bytes > t.memory_limit_bytes - marginBytes(o, t.memory_limit_bytes)) {
    return "fits, >margin";
  }
  return std::string(toString(t.outcome));
}

// The failed phase of an out-of-memory trial, with the lower bound it gives on that phase's peak
// ("failed in backward, needs >= 1.2 GiB"); else the phase that set the trial's peak.
std::string phaseNote(const TrialResult& t) {
  const std::string failed = failedPhase(t);
  if (t.outcome != TrialOutcome::kFits && !failed.empty()) {
    std::string note = "  failed in " + failed;
    if (t.failed_in_use_bytes > 0) {
      note += ", needs >= " + formatBytes(t.failed_in_use_bytes + t.failed_request_bytes);
    }
    return note;
  }
  const std::string peak = peakPhase(t);
  return peak.empty() ? std::string() : "  peak in " + peak;
}

// What follows a trial's numbers: its phase, memory grown outside the allocator, its reason.
std::string trialNotes(const TrialResult& t) {
  std::string notes = phaseNote(t);
  if (t.outside_growth_bytes > 0) {
    notes += "  outside allocator +" + formatBytes(t.outside_growth_bytes);
  }
  if (t.shortened) notes += "  measuring (shortened: 1 step after the optimizer's state)";
  if (t.stands_for_full) notes += ", stands for the full trial";
  if (!t.replayed_peak.empty()) notes += ", peak replayed";
  if (!t.reason.empty()) notes += "  " + t.reason.substr(0, 80);
  return notes;
}

// A table of trials under `title` ("trials"); nothing when there are none.
void trialsTable(std::ostream& out, const ReportData& d, const std::string& title,
                 const std::vector<TrialResult>& trials) {
  if (trials.empty()) return;
  out << "\n" << title << "\n";
  out << fmt::format("  {:>3} {:>7} {:>5}  {:<13} {:>12} {:>12} {:>12} {:>9} {:>10}\n", "#",
                     "batch", "micro", "outcome", "peak alloc", "peak reserv", "peak vs lim",
                     "step ms", "samples/s");
  int n = 0;
  for (const auto& t : trials) {
    out << fmt::format("  {:>3} {:>7} {:>5}  {:<13} {:>12} {:>12} {:>12} {:>9.1f} {:>10.1f}{}\n",
                       ++n, t.request.micro_batch_size, t.request.micro_batches_per_step,
                       outcomeText(t, d.options), formatBytes(t.peak_allocated_bytes),
                       formatBytes(t.peak_reserved_bytes), formatBytes(t.peak_bytes), t.step_ms,
                       samplesPerSecond(t), trialNotes(t));
  }
}

// The search's trials, then the check's (a check of an evaluation batch: evalSection's).
void trialsSection(std::ostream& out, const ReportData& d) {
  std::vector<TrialResult> trials;
  if (d.result) trials = d.result->search.trials;
  if (d.check && !d.check->eval) trials.push_back(d.check->trial);
  trialsTable(out, d, "trials", trials);
}

// ---- result -------------------------------------------------------------------------------

// What the result cache did: answered from an entry, or searched and stored.
void cacheLine(std::ostream& out, const CacheReport& c) {
  const std::string key = c.key.hash.substr(0, 12);
  if (c.outcome == "hit") {
    const char* how =
        c.trusted ? "trusted without a trial (--cache-trust)" : "confirmed by the trial above";
    out << fmt::format("  cached            from {} ({} trials, {:.1f} s then; {}; key {})\n",
                       c.stored_at, c.cached_trials, c.cached_search_s, how, key);
    return;
  }
  const char* what = c.outcome == "miss" ? "miss, searched and stored"
                                         : "the entry's confirming trial failed: dropped, "
                                           "searched and stored again";
  std::string not_stored;
  if (!c.store_error.empty()) not_stored = " (not stored: " + c.store_error + ")";
  out << fmt::format("  cache             {}{}; key {}\n", what, not_stored, key);
}

// What a bound other than memory means for the answer ("" for memory).
std::string cappedByNote(const std::string& capped_by) {
  if (capped_by == "memory") return "";
  if (capped_by == "max-batch" || capped_by == "dataset-size") {
    return ": memory may allow more; larger batches were not tried";
  }
  if (capped_by == "size-limit") return ": the next batch hits a kernel's size limit, not memory";
  return ": the search stopped before larger batches were ruled out";
}

// The model alone is over the limit: what it holds, and what could make room.
void modelOverLimitLine(std::ostream& out, const ReportData& d, const SearchResult& s) {
  const MemoryBreakdown& m = d.result->memory;
  const std::int64_t own = modelNeedsBytes(m);
  if (own <= s.memory_limit_bytes) return;
  // The limit came from the flag, or from the device / the process's own limits, which a larger
  // --memory-limit cannot raise.
  const char* fix = d.options.memory_limit_bytes > 0
                        ? "a larger --memory-limit (if the device has it)"
                        : "a device or a job with more memory";
  out << fmt::format(
      "  the model itself needs {} ({} bytes: parameters {} + gradients {} + optimizer state "
      "{}), more than the limit of {} ({} bytes): no batch can fit; use {}, sgd instead "
      "of adam/adamw, fp16/bf16, or a smaller model\n",
      formatBytes(own), own, formatBytes(m.parameter_bytes), formatBytes(m.gradient_bytes),
      formatBytes(m.optimizer_state_bytes), formatBytes(s.memory_limit_bytes), s.memory_limit_bytes,
      fix);
}

// Why nothing fits: the minimum batch fits only over the margin, or not at all.
void nothingFitsLines(std::ostream& out, const ReportData& d, const SearchResult& s) {
  const std::string headroom = formatBytes(s.memory_limit_bytes - s.margin_bytes);
  if (s.max_micro_batch > 0) {
    out << fmt::format(
        "  nothing fits under the margin: the minimum batch {} fits (raw maximum {}), but its "
        "peak {} is above the limit less the margin {}; lower --margin or give more memory\n",
        d.options.min_batch, s.max_micro_batch, formatBytes(s.min_batch_needs_at_least_bytes),
        headroom);
    return;
  }
  out << fmt::format(
      "  nothing fits at the minimum batch {}: it needs at least {} (limit less the margin "
      "{})\n",
      d.options.min_batch, formatBytes(s.min_batch_needs_at_least_bytes), headroom);
  modelOverLimitLine(out, d, s);
}

// The search's answer: the raw maximum, what capped it, the safe batch under the margin.
void resultSection(std::ostream& out, const ReportData& d) {
  const SearchResult& s = d.result->search;
  out << fmt::format("\nresult ({}, {} trials, {:.1f} s)\n", toString(s.status), s.trials.size(),
                     s.elapsed_s);
  if (d.cache) cacheLine(out, *d.cache);
  out << fmt::format("  max micro-batch   {}\n", s.max_micro_batch);
  if (s.max_micro_batch > 0) {
    out << fmt::format("  capped by         {}{}\n", s.capped_by, cappedByNote(s.capped_by));
  }
  out << fmt::format("  safe micro-batch  {}  (peak under limit - margin = {} - {} = {})\n",
                     s.safe_micro_batch, formatBytes(s.memory_limit_bytes),
                     formatBytes(s.margin_bytes),
                     formatBytes(s.memory_limit_bytes - s.margin_bytes));
  if (s.status == SearchStatus::kNothingFits) nothingFitsLines(out, d, s);
  if (s.size_limit_batch > 0) {
    out << fmt::format("  size limit at {}: {}\n", s.size_limit_batch, s.size_limit_reason);
  }
}

// ---- plans --------------------------------------------------------------------------------

// Whether the primary plan needed accumulation and, if so, whether it was verified.
std::string plansVerifiedNote(const AccumulationPlans& p, bool verified) {
  if (p.primary().accumulation_steps == 1) return ", no accumulation needed";
  if (verified) return ", verified with 2 micro-batches per step";
  return ", NOT verified with 2 micro-batches per step";
}

// One plan: its steps, micro-batches, per-rank and effective batch, predicted speed.
std::string planLine(const AccumulationPlan& plan, PlanKind primary_kind) {
  std::string sizes;
  for (const auto& g : plan.groups) {
    sizes += fmt::format("{}{} x {}", sizes.empty() ? "" : " + ", g.count, g.micro_batch_size);
  }
  std::string speed = "  (no speed prediction: no trial near its micro-batch)";
  if (plan.predicted_samples_per_second > 0.0) {
    speed =
        fmt::format("  (predicted {:.1f} samples/s per rank)", plan.predicted_samples_per_second);
  }
  return fmt::format("  {} {:<9} {:>3} accumulation steps: {} = {} per rank, x {} rank(s) = {}{}\n",
                     plan.kind == primary_kind ? "*" : " ", toString(plan.kind),
                     plan.accumulation_steps, sizes, plan.per_rank_batch, plan.world_size,
                     plan.effective_batch, speed);
}

// Both plans for the target batch (--target-batch), the primary one starred.
void plansSection(std::ostream& out, const ReportData& d) {
  const SearchResult& s = d.result->search;
  if (!s.plan) return;
  const AccumulationPlans& p = *s.plan;
  out << fmt::format(
      "\nplans for target batch {} (world size {}, max micro-batch {}{}; steps x "
      "micro-batch, * primary by rule {})\n",
      p.target_batch, p.uniform.world_size, p.max_micro_batch,
      plansVerifiedNote(p, s.plan_verified), toString(d.options.plan));
  for (const AccumulationPlan* plan : {&p.uniform, &p.balanced}) {
    out << planLine(*plan, p.primary_kind);
  }
}

// ---- memory -------------------------------------------------------------------------------

// The affine fit of the peaks, and its prediction against the measure at the maximum.
void fitLines(std::ostream& out, const SearchResult& s) {
  if (s.fit.points < 2) return;
  out << fmt::format("  affine fit       fixed {} + {} per sample ({} points)\n",
                     formatBytes(static_cast<std::int64_t>(s.fit.fixed_bytes)),
                     formatBytes(static_cast<std::int64_t>(s.fit.per_sample_bytes)), s.fit.points);
  if (s.measured_peak_bytes <= 0) return;
  const double err = 100.0 * (s.predicted_peak_bytes - static_cast<double>(s.measured_peak_bytes)) /
                     static_cast<double>(s.measured_peak_bytes);
  out << fmt::format("  at batch {}:  predicted {}, measured {} ({:+.1f}%)\n", s.max_micro_batch,
                     formatBytes(static_cast<std::int64_t>(s.predicted_peak_bytes)),
                     formatBytes(s.measured_peak_bytes), err);
}

// What the model holds whatever the batch, memory outside the allocator, DDP's buckets, the fit.
void memorySection(std::ostream& out, const ReportData& d) {
  const MemoryBreakdown& m = d.result->memory;
  out << "\nmemory\n";
  out << fmt::format("  parameters       {:.2f}M, {}\n",
                     static_cast<double>(m.parameter_count) / 1e6, formatBytes(m.parameter_bytes));
  out << fmt::format("  gradients        {}\n", formatBytes(m.gradient_bytes));
  out << fmt::format("  optimizer state  {}\n", formatBytes(m.optimizer_state_bytes));
  if (m.outside_growth_bytes > 0) {
    out << fmt::format(
        "  outside allocator {} (grew by {} after setup: lazily loaded kernels, handles)\n",
        formatBytes(m.outside_bytes), formatBytes(m.outside_growth_bytes));
  }
  if (m.ddp_bucket_bytes > 0) {
    out << fmt::format(
        "  DDP buckets      {} (--ddp: one gradient-sized copy, held by every trial)\n",
        formatBytes(m.ddp_bucket_bytes));
  }
  fitLines(out, d.result->search);
}

// ---- ranks and warnings -------------------------------------------------------------------

// What each rank found and which ranks set the agreed minimum (multi-rank preflight).
void ranksSection(std::ostream& out, const ReportData& d) {
  if (!d.agreement) return;
  out << fmt::format("\nranks ({} ranks agreed on the minimum; limited by rank(s) {})\n",
                     d.agreement->reports.size(), fmt::join(d.agreement->limiting_ranks, ", "));
  for (const auto& rep : d.agreement->reports) {
    out << fmt::format("  rank {:>3}  {:<8} safe micro-batch {:>6}  limit {}{}\n", rep.rank,
                       rep.device, rep.safe_micro_batch, formatBytes(rep.memory_limit_bytes),
                       rep.rank == d.rank->rank ? "  (this rank)" : "");
  }
}

void warningsSection(std::ostream& out, const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) out << "warning: " << w << "\n";
}

// ---- sweep --------------------------------------------------------------------------------

/// A sweep row with no verified batch whose search did not find that nothing fits: what stopped
/// it. "nothing fits (cancelled)" blamed memory for an interrupt (issue 27, row 21).
std::string unverifiedRowText(const std::string& status) {
  if (status == "cancelled") return "interrupted before a batch was verified";
  if (status == "time-budget") return "the time budget ran out before a batch was verified";
  if (status == "trial-budget") return "the trial budget ran out before a batch was verified";
  return "nothing fits (" + status + ")";
}

// The last column of a sweep row: its plan, or why it has none.
std::string sweepRowPlan(const SweepRow& r, const SweepReport& sw, std::int64_t min_batch) {
  if (r.status == "error") return "error: " + r.error;
  if (r.status == "fails-mixed") {
    return fmt::format("left out: batch {} (found alone) never passed mixed", r.lowered_from);
  }
  if (r.safe_micro_batch <= 0) {
    // The search's first trial is at --min-batch: the bound is for that batch, not for 1.
    if (r.min_batch_needs_at_least_bytes <= 0) return unverifiedRowText(r.status);
    return fmt::format("nothing fits: batch {} needs at least {}", min_batch,
                       formatBytes(r.min_batch_needs_at_least_bytes));
  }
  if (r.plan) {
    const AccumulationPlan& p = r.plan->primary();
    return fmt::format("{} steps x {} = {} sequences ({})", p.accumulation_steps,
                       p.largestMicroBatch(), p.effective_batch, toString(p.kind));
  }
  if (sw.target_tokens > 0 && r.target_batch == 0) return "target below one sequence per rank";
  if (r.target_batch > 0) {
    return fmt::format("no plan for {} sequences: none fits with 2 micro-batches per step",
                       r.target_batch);
  }
  return "";
}

// The buckets run mixed in one trial: the status, the last trial's peak, what was lowered.
void mixedLine(std::ostream& out, const MixVerification& v) {
  std::string what;
  for (const auto& l : v.lowered) {
    what += l.to > 0 ? fmt::format("; length {} lowered {} -> {}", l.length, l.from, l.to)
                     : fmt::format("; length {} left out (from {})", l.length, l.from);
  }
  std::string last_peak;
  if (!v.trials.empty() && v.trials.back().result.memory_limit_bytes > 0) {
    const MixedTrial& last = v.trials.back();
    const std::int64_t limit = last.result.memory_limit_bytes;
    last_peak = fmt::format(", last peak {} of {} (limit less the margin {}{})",
                            formatBytes(last.result.peak_bytes), formatBytes(limit),
                            formatBytes(limit - v.margin_bytes),
                            last.over_margin ? ": over the margin" : "");
  }
  out << fmt::format(
      "  mixed verification (the buckets in one trial, the longest after each other one, "
      "the allocator's cache kept): {} in {} trial{}{}{}\n",
      v.status, v.trials.size(), v.trials.size() == 1 ? "" : "s", last_peak, what);
}

// A sweep row's evaluation columns (--eval): max, safe, trials; "-" where none ran.
std::string sweepRowEval(const SweepRow& r) {
  if (r.eval_status.empty()) return fmt::format("{:>9} {:>9} {:>6}  ", "-", "-", "-");
  if (r.eval_status == "state-does-not-fit") {
    return fmt::format("{:>19} {:>6}  ", "state does not fit", 0);
  }
  return fmt::format("{:>9} {:>9} {:>6}  ", r.eval_max_batch, r.eval_safe_batch, r.eval_trials);
}

// One row per length (--lengths), the longest that trains, and the mixed verification.
void sweepSection(std::ostream& out, const ReportData& d) {
  const SweepReport& sw = *d.sweep;
  std::string target;
  if (sw.target_tokens > 0) {
    target = fmt::format(", target {} tokens per optimizer step", sw.target_tokens);
  }
  out << fmt::format("\nlength sweep ({} lengths{})\n", sw.rows.size(), target);
  // --eval: the evaluation batch beside the training answer (docs/sweeps.md).
  const bool eval = std::any_of(sw.rows.begin(), sw.rows.end(),
                                [](const SweepRow& r) { return !r.eval_status.empty(); });
  out << fmt::format(
      "  {:>7} {:>9} {:>9} {:>12}  {:<16} {:>6} {:>8}  {}{}\n", "length", "max", "safe",
      "tokens/micro", "peak phase", "trials", "time",
      eval ? fmt::format("{:>9} {:>9} {:>6}  ", "eval max", "eval safe", "trials") : std::string(),
      "plan");
  for (const auto& r : sw.rows) {
    out << fmt::format("  {:>7} {:>9} {:>9} {:>12}  {:<16} {:>6} {:>7.1f}s  {}{}\n", r.length,
                       r.max_micro_batch, r.safe_micro_batch, r.tokens_per_micro_batch,
                       r.binding_phase.empty() ? "-" : r.binding_phase, r.trials, r.elapsed_s,
                       eval ? sweepRowEval(r) : std::string(),
                       sweepRowPlan(r, sw, d.options.min_batch));
  }
  if (sw.longest_trainable_length > 0) {
    out << fmt::format("  longest trainable length: {} (the result above is for it)\n",
                       sw.longest_trainable_length);
  } else {
    out << "  no length fits\n";
  }
  if (sw.mixed && sw.mixed->status != "skipped") mixedLine(out, *sw.mixed);
}

// ---- fleet --------------------------------------------------------------------------------

// The last column of a fleet row: its plan, or why it has none.
std::string fleetRowPlan(const FleetRow& r, const SearchOptions& o) {
  if (r.status == "not-measurable") return r.note;
  if (r.safe_micro_batch <= 0) {
    if (!r.note.empty()) return r.note;
    if (r.min_batch_needs_at_least_bytes <= 0) return unverifiedRowText(r.status);
    return fmt::format("nothing fits: batch {} needs at least {}", o.min_batch,
                       formatBytes(r.min_batch_needs_at_least_bytes));
  }
  std::string text;
  if (r.plan) {
    const AccumulationPlan& p = r.plan->primary();
    text = fmt::format("{} x {} steps x {} ranks = {} ({})", p.largestMicroBatch(),
                       p.accumulation_steps, p.world_size, p.effective_batch, toString(p.kind));
  } else if (o.target_batch > 0) {
    text = fmt::format("no plan for {}: none fits with 2 micro-batches per step", o.target_batch);
  }
  if (!r.note.empty()) text += (text.empty() ? "" : "; ") + r.note;
  return text;
}

// One row per memory size (--fleet), largest first, with the trials it ran and reused.
void fleetSection(std::ostream& out, const ReportData& d) {
  const FleetReport& f = *d.fleet;
  out << fmt::format("\nfleet ({} sizes, {} trials run in all{})\n", f.rows.size(), f.trials_run,
                     d.options.target_batch > 0
                         ? fmt::format(", target {} per optimizer step", d.options.target_batch)
                         : "");
  out << fmt::format("  {:<12} {:>11} {:>9} {:>9}  {:<16} {:>12}  {}\n", "size", "memory", "max",
                     "safe", "peak phase", "trials (run)", "plan");
  for (const auto& r : f.rows) {
    const bool measured = r.status != "not-measurable";
    out << fmt::format(
        "  {:<12} {:>11} {:>9} {:>9}  {:<16} {:>12}  {}\n", r.name, formatBytes(r.bytes),
        measured ? std::to_string(r.max_micro_batch) : "-",
        measured ? std::to_string(r.safe_micro_batch) : "-",
        r.binding_phase.empty() ? "-" : r.binding_phase,
        measured ? fmt::format("{} ({})", r.trials_run + r.trials_reused, r.trials_run) : "-",
        fleetRowPlan(r, d.options));
  }
  if (f.largest_measurable_bytes > 0) {
    out << fmt::format("  the result above is for the largest measurable size ({})\n",
                       formatBytes(f.largest_measurable_bytes));
  }
  if (!f.note.empty()) out << "  note: " << f.note << "\n";
}

// ---- check --------------------------------------------------------------------------------

// --check-batch: whether the one trial fit, raw and with the margin.
void checkSection(std::ostream& out, const CheckResult& c) {
  out << fmt::format("\ncheck micro-batch {}: {} raw, {} with the margin ({})\n",
                     c.trial.request.micro_batch_size, c.fits ? "fits" : "does not fit",
                     c.fits_with_margin ? "fits" : "does not fit", formatBytes(c.margin_bytes));
}

// ---- evaluation ---------------------------------------------------------------------------

std::string evalStateText(const EvalResult& e) {
  if (e.state == EvalState::kParametersOnly) return "parameters only (an evaluation job alone)";
  return fmt::format(
      "training state resident: parameters, optimizer state and gradients as left by one "
      "training step at micro-batch {}, {} held",
      e.training_batch, formatBytes(e.resident_bytes));
}

// The training state that did not fit: no evaluation result.
void stateDoesNotFit(std::ostream& out, const ReportData& d, const EvalResult& e) {
  out << fmt::format(
      "\nevaluation: the training state does not fit: the training step at micro-batch {} that "
      "creates the optimizer state ended {} ({}); no evaluation batch was tried\n",
      e.training_batch, outcomeText(e.training_step, d.options), e.training_step.reason);
}

// --eval / --eval-only: the evaluation trials and the evaluation batch.
void evalSection(std::ostream& out, const ReportData& d, const EvalResult& e) {
  if (!e.state_fits) return stateDoesNotFit(out, d, e);
  if (e.state == EvalState::kTrainingResident) {
    trialsTable(out, d, "evaluation trials (2 batches each, the previous output alive)",
                e.search.trials);
  }
  const SearchResult& s = e.search;
  out << fmt::format("\nevaluation batch: max {}, safe {} (capped by {}; {})\n", s.max_micro_batch,
                     s.safe_micro_batch, s.capped_by, evalStateText(e));
  warningsSection(out, s.warnings);
}

// --check-eval-batch: the trial, and whether it fit.
void evalCheckSection(std::ostream& out, const ReportData& d, const CheckResult& c) {
  const EvalResult& e = *c.eval;
  if (!e.state_fits) return stateDoesNotFit(out, d, e);
  trialsTable(out, d, "evaluation trial (2 batches, the previous output alive)", {c.trial});
  out << fmt::format("\ncheck evaluation batch {}: {} raw, {} with the margin ({}; {})\n",
                     c.trial.request.micro_batch_size, c.fits ? "fits" : "does not fit",
                     c.fits_with_margin ? "fits" : "does not fit", formatBytes(c.margin_bytes),
                     evalStateText(e));
}

}  // namespace

std::string humanReport(const ReportData& d) {
  std::ostringstream out;
  const RunContext* ctx = contextOf(d);
  if (ctx) headerSection(out, d, *ctx);
  trialsSection(out, d);
  if (d.result) {
    resultSection(out, d);
    plansSection(out, d);
    memorySection(out, d);
    ranksSection(out, d);
    warningsSection(out, ctx->warnings);
    warningsSection(out, d.result->search.warnings);
  }
  if (d.sweep) sweepSection(out, d);
  if (d.fleet) fleetSection(out, d);
  if (d.result && d.result->eval) evalSection(out, d, *d.result->eval);
  if (d.check && d.check->eval) {
    evalCheckSection(out, d, *d.check);
  } else if (d.check) {
    checkSection(out, *d.check);
  }
  if (ctx && !d.result) warningsSection(out, ctx->warnings);
  if (!d.error.empty()) out << "error: " << d.error << "\n";
  return out.str();
}

}  // namespace autobatch
