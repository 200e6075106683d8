// The human report (autobatch/reports/report.h, humanReport): one function per section, in the
// order they are printed: header, trials, result, plans, memory, ranks, warnings, sweep, check,
// error.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "autobatch/reports/report.h"
#include "autobatch/vocabulary/units.h"
#include "reports/report_internal.h"
#include "reports/text_format.h"

namespace autobatch {
namespace {

using detail::cat;
using detail::contextOf;
using detail::failedPhase;
using detail::fixed;
using detail::join;
using detail::left;
using detail::memoryOf;
using detail::modelNeedsBytes;
using detail::right;
using detail::signedFixed;

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
  out << cat("device ", ctx.device, " (", ctx.backend, "), limit ",
             formatBytes(ctx.memory_limit_bytes), " (", ctx.memory_limit_source, ")\n");
  if (!d.step_description.empty()) {  // a step the library did not build (the Python package's)
    out << cat("model ", d.spec.model_path, ": ", d.step_description, ", ", d.spec.steps_per_trial,
               " steps per trial, ", ctx.micro_batches_per_trial, " micro-batch(es) per step\n");
    return;
  }
  out << cat("model ", d.spec.model_path, pt2 ? " (pt2 package)" : "", ": inputs ",
             inputsText(ctx.inputs), ", loss ", toString(ctx.loss), ", optimizer ",
             toString(d.spec.optimizer), optimizer_impl, ", zero_grad ", toString(d.spec.zero_grad),
             ", output ", d.spec.keep_output ? "kept through the step" : "dropped", ", ",
             toString(d.spec.precision), ", ", d.spec.steps_per_trial, " steps per trial, ",
             ctx.micro_batches_per_trial, " micro-batch(es) per step\n");
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
  out << cat("  ", right("#", 3), " ", right("batch", 7), " ", right("micro", 5), "  ",
             left("outcome", 13), " ", right("peak alloc", 12), " ", right("peak reserv", 12), " ",
             right("peak vs lim", 12), " ", right("step ms", 9), " ", right("samples/s", 10), "\n");
  int n = 0;
  for (const auto& t : trials) {
    out << cat("  ", right(++n, 3), " ", right(t.request.micro_batch_size, 7), " ",
               right(t.request.micro_batches_per_step, 5), "  ",
               left(outcomeText(t, d.options), 13), " ",
               right(formatBytes(t.peak_allocated_bytes), 12), " ",
               right(formatBytes(t.peak_reserved_bytes), 12), " ",
               right(formatBytes(t.peak_bytes), 12), " ", right(fixed(t.step_ms, 1), 9), " ",
               right(fixed(samplesPerSecond(t), 1), 10), trialNotes(t), "\n");
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
    out << cat("  cached            from ", c.stored_at, " (", c.cached_trials, " trials, ",
               fixed(c.cached_search_s, 1), " s then; ", how, "; key ", key, ")\n");
    return;
  }
  const char* what = c.outcome == "miss" ? "miss, searched and stored"
                                         : "the entry's confirming trial failed: dropped, "
                                           "searched and stored again";
  std::string not_stored;
  if (!c.store_error.empty()) not_stored = " (not stored: " + c.store_error + ")";
  out << cat("  cache             ", what, not_stored, "; key ", key, "\n");
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
  out << cat("  the model itself needs ", formatBytes(own), " (", own, " bytes: parameters ",
             formatBytes(m.parameter_bytes), " + gradients ", formatBytes(m.gradient_bytes),
             " + optimizer state ", formatBytes(m.optimizer_state_bytes),
             "), more than the limit of ", formatBytes(s.memory_limit_bytes), " (",
             s.memory_limit_bytes, " bytes): no batch can fit; use ", fix,
             ", sgd instead of adam/adamw, fp16/bf16, or a smaller model\n");
}

// Why nothing fits: the minimum batch fits only over the margin, or not at all.
void nothingFitsLines(std::ostream& out, const ReportData& d, const SearchResult& s) {
  const std::string headroom = formatBytes(s.memory_limit_bytes - s.margin_bytes);
  if (s.max_micro_batch > 0) {
    out << cat("  nothing fits under the margin: the minimum batch ", d.options.min_batch,
               " fits (raw maximum ", s.max_micro_batch, "), but its peak ",
               formatBytes(s.min_batch_needs_at_least_bytes),
               " is above the limit less the margin ", headroom,
               "; lower --margin or give more memory\n");
    return;
  }
  out << cat("  nothing fits at the minimum batch ", d.options.min_batch, ": it needs at least ",
             formatBytes(s.min_batch_needs_at_least_bytes), " (limit less the margin ", headroom,
             ")\n");
  modelOverLimitLine(out, d, s);
}

// The search's answer: the raw maximum, what capped it, the safe batch under the margin.
void resultSection(std::ostream& out, const ReportData& d) {
  const SearchResult& s = d.result->search;
  out << cat("\nresult (", toString(s.status), ", ", s.trials.size(), " trials, ",
             fixed(s.elapsed_s, 1), " s)\n");
  if (d.cache) cacheLine(out, *d.cache);
  out << cat("  max micro-batch   ", s.max_micro_batch, "\n");
  if (s.max_micro_batch > 0) {
    out << cat("  capped by         ", s.capped_by, cappedByNote(s.capped_by), "\n");
  }
  out << cat("  safe micro-batch  ", s.safe_micro_batch,
             "  (peak under limit - margin = ", formatBytes(s.memory_limit_bytes), " - ",
             formatBytes(s.margin_bytes), " = ", formatBytes(s.memory_limit_bytes - s.margin_bytes),
             ")\n");
  if (s.status == SearchStatus::kNothingFits) nothingFitsLines(out, d, s);
  if (s.size_limit_batch > 0) {
    out << cat("  size limit at ", s.size_limit_batch, ": ", s.size_limit_reason, "\n");
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
    sizes += cat(sizes.empty() ? "" : " + ", g.count, " x ", g.micro_batch_size);
  }
  std::string speed = "  (no speed prediction: no trial near its micro-batch)";
  if (plan.predicted_samples_per_second > 0.0) {
    speed =
        cat("  (predicted ", fixed(plan.predicted_samples_per_second, 1), " samples/s per rank)");
  }
  return cat("  ", plan.kind == primary_kind ? "*" : " ", " ", left(toString(plan.kind), 9), " ",
             right(plan.accumulation_steps, 3), " accumulation steps: ", sizes, " = ",
             plan.per_rank_batch, " per rank, x ", plan.world_size,
             " rank(s) = ", plan.effective_batch, speed, "\n");
}

// Both plans for the target batch (--target-batch), the primary one starred.
void plansSection(std::ostream& out, const ReportData& d) {
  const SearchResult& s = d.result->search;
  if (!s.plan) return;
  const AccumulationPlans& p = *s.plan;
  out << cat("\nplans for target batch ", p.target_batch, " (world size ", p.uniform.world_size,
             ", max micro-batch ", p.max_micro_batch, plansVerifiedNote(p, s.plan_verified),
             "; steps x micro-batch, * primary by rule ", toString(d.options.plan), ")\n");
  for (const AccumulationPlan* plan : {&p.uniform, &p.balanced}) {
    out << planLine(*plan, p.primary_kind);
  }
}

// ---- memory -------------------------------------------------------------------------------

// The affine fit of the peaks, and its prediction against the measure at the maximum.
void fitLines(std::ostream& out, const SearchResult& s) {
  if (s.fit.points < 2) return;
  out << cat("  affine fit       fixed ", formatBytes(static_cast<std::int64_t>(s.fit.fixed_bytes)),
             " + ", formatBytes(static_cast<std::int64_t>(s.fit.per_sample_bytes)), " per sample (",
             s.fit.points, " points)\n");
  if (s.measured_peak_bytes <= 0) return;
  const double err = 100.0 * (s.predicted_peak_bytes - static_cast<double>(s.measured_peak_bytes)) /
                     static_cast<double>(s.measured_peak_bytes);
  out << cat("  at batch ", s.max_micro_batch, ":  predicted ",
             formatBytes(static_cast<std::int64_t>(s.predicted_peak_bytes)), ", measured ",
             formatBytes(s.measured_peak_bytes), " (", signedFixed(err, 1), "%)\n");
}

// What the model holds whatever the batch, memory outside the allocator, DDP's buckets, the fit.
void memorySection(std::ostream& out, const ReportData& d) {
  const MemoryBreakdown& m = d.result->memory;
  out << "\nmemory\n";
  out << cat("  parameters       ", fixed(static_cast<double>(m.parameter_count) / 1e6, 2), "M, ",
             formatBytes(m.parameter_bytes), "\n");
  out << cat("  gradients        ", formatBytes(m.gradient_bytes), "\n");
  out << cat("  optimizer state  ", formatBytes(m.optimizer_state_bytes), "\n");
  if (m.outside_growth_bytes > 0) {
    out << cat("  outside allocator ", formatBytes(m.outside_bytes), " (grew by ",
               formatBytes(m.outside_growth_bytes),
               " after setup: lazily loaded kernels, handles)\n");
  }
  if (m.ddp_bucket_bytes > 0) {
    out << cat("  DDP buckets      ", formatBytes(m.ddp_bucket_bytes),
               " (--ddp: one gradient-sized copy, held by every trial)\n");
  }
  fitLines(out, d.result->search);
}

// ---- ranks and warnings -------------------------------------------------------------------

// What each rank found and which ranks set the agreed minimum (multi-rank preflight).
void ranksSection(std::ostream& out, const ReportData& d) {
  if (!d.agreement) return;
  out << cat("\nranks (", d.agreement->reports.size(),
             " ranks agreed on the minimum; limited by rank(s) ",
             join(d.agreement->limiting_ranks, ", "), ")\n");
  for (const auto& rep : d.agreement->reports) {
    out << cat("  rank ", right(rep.rank, 3), "  ", left(rep.device, 8), " safe micro-batch ",
               right(rep.safe_micro_batch, 6), "  limit ", formatBytes(rep.memory_limit_bytes),
               rep.rank == d.rank->rank ? "  (this rank)" : "", "\n");
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
    return cat("left out: batch ", r.lowered_from, " (found alone) never passed mixed");
  }
  if (r.safe_micro_batch <= 0) {
    // The search's first trial is at --min-batch: the bound is for that batch, not for 1.
    if (r.min_batch_needs_at_least_bytes <= 0) return unverifiedRowText(r.status);
    return cat("nothing fits: batch ", min_batch, " needs at least ",
               formatBytes(r.min_batch_needs_at_least_bytes));
  }
  if (r.plan) {
    const AccumulationPlan& p = r.plan->primary();
    return cat(p.accumulation_steps, " steps x ", p.largestMicroBatch(), " = ", p.effective_batch,
               " sequences (", toString(p.kind), ")");
  }
  if (sw.target_tokens > 0 && r.target_batch == 0) return "target below one sequence per rank";
  if (r.target_batch > 0) {
    return cat("no plan for ", r.target_batch,
               " sequences: none fits with 2 micro-batches per step");
  }
  return "";
}

// The buckets run mixed in one trial: the status, the last trial's peak, what was lowered.
void mixedLine(std::ostream& out, const MixVerification& v) {
  std::string what;
  for (const auto& l : v.lowered) {
    what += l.to > 0 ? cat("; length ", l.length, " lowered ", l.from, " -> ", l.to)
                     : cat("; length ", l.length, " left out (from ", l.from, ")");
  }
  std::string last_peak;
  if (!v.trials.empty() && v.trials.back().result.memory_limit_bytes > 0) {
    const MixedTrial& last = v.trials.back();
    const std::int64_t limit = last.result.memory_limit_bytes;
    last_peak = cat(", last peak ", formatBytes(last.result.peak_bytes), " of ", formatBytes(limit),
                    " (limit less the margin ", formatBytes(limit - v.margin_bytes),
                    last.over_margin ? ": over the margin" : "", ")");
  }
  out << cat(
      "  mixed verification (the buckets in one trial, the longest after each other one, "
      "the allocator's cache kept): ",
      v.status, " in ", v.trials.size(), " trial", v.trials.size() == 1 ? "" : "s", last_peak, what,
      "\n");
}

// A sweep row's evaluation columns (--eval): max, safe, trials; "-" where none ran.
std::string sweepRowEval(const SweepRow& r) {
  if (r.eval_status.empty())
    return cat(right("-", 9), " ", right("-", 9), " ", right("-", 6), "  ");
  if (r.eval_status == "state-does-not-fit") {
    return cat(right("state does not fit", 19), " ", right(0, 6), "  ");
  }
  return cat(right(r.eval_max_batch, 9), " ", right(r.eval_safe_batch, 9), " ",
             right(r.eval_trials, 6), "  ");
}

// One row per length (--lengths), the longest that trains, and the mixed verification.
void sweepSection(std::ostream& out, const ReportData& d) {
  const SweepReport& sw = *d.sweep;
  std::string target;
  if (sw.target_tokens > 0) {
    target = cat(", target ", sw.target_tokens, " tokens per optimizer step");
  }
  out << cat("\nlength sweep (", sw.rows.size(), " lengths", target, ")\n");
  // --eval: the evaluation batch beside the training answer (docs/sweeps.md).
  const bool eval = std::any_of(sw.rows.begin(), sw.rows.end(),
                                [](const SweepRow& r) { return !r.eval_status.empty(); });
  out << cat(
      "  ", right("length", 7), " ", right("max", 9), " ", right("safe", 9), " ",
      right("tokens/micro", 12), "  ", left("peak phase", 16), " ", right("trials", 6), " ",
      right("time", 8), "  ",
      eval ? cat(right("eval max", 9), " ", right("eval safe", 9), " ", right("trials", 6), "  ")
           : std::string(),
      "plan\n");
  for (const auto& r : sw.rows) {
    out << cat("  ", right(r.length, 7), " ", right(r.max_micro_batch, 9), " ",
               right(r.safe_micro_batch, 9), " ", right(r.tokens_per_micro_batch, 12), "  ",
               left(r.binding_phase.empty() ? "-" : r.binding_phase, 16), " ", right(r.trials, 6),
               " ", right(fixed(r.elapsed_s, 1), 7), "s  ", eval ? sweepRowEval(r) : std::string(),
               sweepRowPlan(r, sw, d.options.min_batch), "\n");
  }
  if (sw.longest_trainable_length > 0) {
    out << cat("  longest trainable length: ", sw.longest_trainable_length,
               " (the result above is for it)\n");
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
    return cat("nothing fits: batch ", o.min_batch, " needs at least ",
               formatBytes(r.min_batch_needs_at_least_bytes));
  }
  std::string text;
  if (r.plan) {
    const AccumulationPlan& p = r.plan->primary();
    text = cat(p.largestMicroBatch(), " x ", p.accumulation_steps, " steps x ", p.world_size,
               " ranks = ", p.effective_batch, " (", toString(p.kind), ")");
  } else if (o.target_batch > 0) {
    text = cat("no plan for ", o.target_batch, ": none fits with 2 micro-batches per step");
  }
  if (!r.note.empty()) text += (text.empty() ? "" : "; ") + r.note;
  return text;
}

// One row per memory size (--fleet), largest first, with the trials it ran and reused.
void fleetSection(std::ostream& out, const ReportData& d) {
  const FleetReport& f = *d.fleet;
  out << cat("\nfleet (", f.rows.size(), " sizes, ", f.trials_run, " trials run in all",
             d.options.target_batch > 0
                 ? cat(", target ", d.options.target_batch, " per optimizer step")
                 : std::string(),
             ")\n");
  out << cat("  ", left("size", 12), " ", right("memory", 11), " ", right("max", 9), " ",
             right("safe", 9), "  ", left("peak phase", 16), " ", right("trials (run)", 12),
             "  plan\n");
  for (const auto& r : f.rows) {
    const bool measured = r.status != "not-measurable";
    out << cat(
        "  ", left(r.name, 12), " ", right(formatBytes(r.bytes), 11), " ",
        right(measured ? std::to_string(r.max_micro_batch) : "-", 9), " ",
        right(measured ? std::to_string(r.safe_micro_batch) : "-", 9), "  ",
        left(r.binding_phase.empty() ? "-" : r.binding_phase, 16), " ",
        right(measured ? cat(r.trials_run + r.trials_reused, " (", r.trials_run, ")") : "-", 12),
        "  ", fleetRowPlan(r, d.options), "\n");
  }
  if (f.largest_measurable_bytes > 0) {
    out << cat("  the result above is for the largest measurable size (",
               formatBytes(f.largest_measurable_bytes), ")\n");
  }
  if (!f.note.empty()) out << "  note: " << f.note << "\n";
}

// ---- check --------------------------------------------------------------------------------

// --check-batch: whether the one trial fit, raw and with the margin.
void checkSection(std::ostream& out, const CheckResult& c) {
  out << cat("\ncheck micro-batch ", c.trial.request.micro_batch_size, ": ",
             c.fits ? "fits" : "does not fit", " raw, ",
             c.fits_with_margin ? "fits" : "does not fit", " with the margin (",
             formatBytes(c.margin_bytes), ")\n");
}

// ---- evaluation ---------------------------------------------------------------------------

std::string evalStateText(const EvalResult& e) {
  if (e.state == EvalState::kParametersOnly) return "parameters only (an evaluation job alone)";
  return cat(
      "training state resident: parameters, optimizer state and gradients as left by one "
      "training step at micro-batch ",
      e.training_batch, ", ", formatBytes(e.resident_bytes), " held");
}

// The training state that did not fit: no evaluation result.
void stateDoesNotFit(std::ostream& out, const ReportData& d, const EvalResult& e) {
  out << cat("\nevaluation: the training state does not fit: the training step at micro-batch ",
             e.training_batch, " that creates the optimizer state ended ",
             outcomeText(e.training_step, d.options), " (", e.training_step.reason,
             "); no evaluation batch was tried\n");
}

// --eval / --eval-only: the evaluation trials and the evaluation batch.
void evalSection(std::ostream& out, const ReportData& d, const EvalResult& e) {
  if (!e.state_fits) return stateDoesNotFit(out, d, e);
  if (e.state == EvalState::kTrainingResident) {
    trialsTable(out, d, "evaluation trials (2 batches each, the previous output alive)",
                e.search.trials);
  }
  const SearchResult& s = e.search;
  out << cat("\nevaluation batch: max ", s.max_micro_batch, ", safe ", s.safe_micro_batch,
             " (capped by ", s.capped_by, "; ", evalStateText(e), ")\n");
  warningsSection(out, s.warnings);
}

// --check-eval-batch: the trial, and whether it fit.
void evalCheckSection(std::ostream& out, const ReportData& d, const CheckResult& c) {
  const EvalResult& e = *c.eval;
  if (!e.state_fits) return stateDoesNotFit(out, d, e);
  trialsTable(out, d, "evaluation trial (2 batches, the previous output alive)", {c.trial});
  out << cat("\ncheck evaluation batch ", c.trial.request.micro_batch_size, ": ",
             c.fits ? "fits" : "does not fit", " raw, ",
             c.fits_with_margin ? "fits" : "does not fit", " with the margin (",
             formatBytes(c.margin_bytes), "; ", evalStateText(e), ")\n");
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
