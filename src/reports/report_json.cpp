// The JSON report (autobatch/reports/report.h's schema; docs/report.md lists every field). Keys
// come out sorted (nlohmann::json's object is a std::map), so the order in which the parts are
// built does not change the document.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "autobatch/reports/report.h"
#include "reports/report_internal.h"

namespace autobatch {
namespace {

using detail::contextOf;
using detail::failedPhase;
using detail::gpuBytes;
using detail::gpuName;
using detail::memoryOf;
using detail::modelNeedsBytes;
using nlohmann::json;

// A recorded environment variable: its value, or null when it was unset (or no trial context).
json optionalJson(const RunContext* ctx, std::optional<std::string> AllocatorInfo::*field) {
  if (ctx == nullptr || !(ctx->allocator.*field)) return nullptr;
  return *(ctx->allocator.*field);
}

// A plan's micro-batch sizes one by one, or null above kMicroBatchListLimit steps (a target of
// 2^40 at a micro-batch of 2 would list 2^39 of them): the groups always describe it.
json microBatchesJson(const AccumulationPlan& plan) {
  return plan.listsMicroBatches() ? json(plan.microBatchSizes()) : json(nullptr);
}

json groupsJson(const AccumulationPlan& plan) {
  json groups = json::array();
  for (const auto& g : plan.groups) {
    groups.push_back({{"micro_batch_size", g.micro_batch_size},
                      {"count", g.count},
                      {"loss_weight", plan.lossWeight(g.micro_batch_size)}});
  }
  return groups;
}

json toJson(const TrialResult& t) {
  json phases = json::array();
  for (const auto& p : t.phase_peaks) {
    phases.push_back({{"phase", p.phase},
                      {"micro_batch_index", p.micro_batch_index},
                      {"peak_allocated_bytes", p.peak_allocated_bytes}});
  }
  json j = {{"micro_batch_size", t.request.micro_batch_size},
            {"micro_batches_per_step", t.request.micro_batches_per_step},
            {"outcome", toString(t.outcome)},
            {"reason", t.reason},
            {"peak_allocated_bytes", t.peak_allocated_bytes},
            {"peak_reserved_bytes", t.peak_reserved_bytes},
            {"peak_bytes", t.peak_bytes},
            {"memory_limit_bytes", t.memory_limit_bytes},
            {"failed_request_bytes", t.failed_request_bytes},
            {"failed_phase", failedPhase(t)},
            {"failed_in_use_bytes", t.failed_in_use_bytes},
            {"allocator_retries", t.allocator_retries},
            {"inactive_split_peak_bytes", t.inactive_split_peak_bytes},
            {"outside_growth_bytes", t.outside_growth_bytes},
            {"output_bytes", t.output_bytes},
            {"phase_peaks", phases},
            {"peak_phase", peakPhase(t)},
            {"step_ms", t.step_ms},
            {"steps_completed", t.steps_completed},
            {"samples_per_second", samplesPerSecond(t)},
            {"cancelled", t.cancelled}};
  // Only on a shortened measuring trial (TrialResult::shortened): the key's absence is a full one.
  if (t.shortened) j["shortened"] = true;
  if (t.stands_for_full) j["stands_for_full"] = true;
  // Only where the probe replayed the trial's allocations (TrialResult::replayed_peak).
  if (!t.replayed_peak.empty()) {
    json lines = json::array();
    for (const PeakLine& line : t.replayed_peak) {
      lines.push_back(json::array({line.intercept_bytes, line.bytes_per_sample}));
    }
    j["replayed_peak"] = lines;
  }
  return j;
}

// The buckets run mixed in one trial (autobatch/run/bucket_mix.h): its trials and lowered buckets.
json toJson(const MixVerification& v) {
  json trials = json::array();
  for (const auto& t : v.trials) {
    json steps = json::array();
    for (const auto& b : t.steps) steps.push_back({b.length, b.micro_batch_size});
    trials.push_back({{"steps", steps},
                      {"outcome", toString(t.result.outcome)},
                      {"passed", t.passed},
                      {"over_margin", t.over_margin},
                      {"failed_length", t.failed_length},
                      {"failed_step_index", t.result.failed_step_index},
                      {"reason", t.result.reason},
                      {"peak_bytes", t.result.peak_bytes},
                      {"memory_limit_bytes", t.result.memory_limit_bytes},
                      {"micro_batches_per_step", t.result.request.micro_batches_per_step}});
  }
  json lowered = json::array();
  for (const auto& l : v.lowered) {
    lowered.push_back({{"length", l.length}, {"from", l.from}, {"to", l.to}});
  }
  return {{"status", v.status},
          {"margin_bytes", v.margin_bytes},
          {"trials", trials},
          {"lowered", lowered}};
}

json toJson(const SweepReport& sweep) {
  json rows = json::array();
  for (const auto& r : sweep.rows) {
    json plan = nullptr;
    if (r.plan) {
      const AccumulationPlan& p = r.plan->primary();
      plan = {{"kind", toString(p.kind)},
              {"micro_batch_size", p.largestMicroBatch()},
              {"micro_batches", microBatchesJson(p)},
              {"groups", groupsJson(p)},
              {"accumulation_steps", p.accumulation_steps},
              {"effective_batch", p.effective_batch}};
    }
    rows.push_back({{"length", r.length},
                    {"status", r.status},
                    {"max_micro_batch", r.max_micro_batch},
                    {"safe_micro_batch", r.safe_micro_batch},
                    {"tokens_per_sample", r.tokens_per_sample},
                    {"tokens_per_micro_batch", r.tokens_per_micro_batch},
                    {"binding_phase", r.binding_phase},
                    {"trials", r.trials},
                    {"elapsed_s", r.elapsed_s},
                    {"target_batch", r.target_batch},
                    {"plan", plan},
                    {"min_batch_needs_at_least_bytes", r.min_batch_needs_at_least_bytes},
                    {"lowered_from", r.lowered_from},
                    {"error", r.error}});
    if (!r.eval_status.empty()) {  // --eval: additive keys, absent otherwise
      rows.back()["eval_status"] = r.eval_status;
      rows.back()["eval_max_batch"] = r.eval_max_batch;
      rows.back()["eval_safe_batch"] = r.eval_safe_batch;
      rows.back()["eval_trials"] = r.eval_trials;
    }
  }
  return {{"rows", rows},
          {"longest_trainable_length", sweep.longest_trainable_length},
          {"target_tokens", sweep.target_tokens},
          {"mixed_verification", sweep.mixed ? toJson(*sweep.mixed) : json(nullptr)}};
}

json toJson(const AccumulationPlan& plan);

json toJson(const FleetReport& fleet) {
  json rows = json::array();
  for (const auto& r : fleet.rows) {
    json plan = nullptr;
    if (r.plan) plan = toJson(r.plan->primary());
    rows.push_back({{"name", r.name},
                    {"bytes", r.bytes},
                    {"source", r.source},
                    {"status", r.status},
                    {"max_micro_batch", r.max_micro_batch},
                    {"safe_micro_batch", r.safe_micro_batch},
                    {"binding_phase", r.binding_phase},
                    {"plan", plan},
                    {"min_batch_needs_at_least_bytes", r.min_batch_needs_at_least_bytes},
                    {"trials_run", r.trials_run},
                    {"trials_reused", r.trials_reused},
                    {"verified", r.verified},
                    {"elapsed_s", r.elapsed_s},
                    {"note", r.note}});
  }
  return {{"rows", rows},
          {"largest_measurable_bytes", fleet.largest_measurable_bytes},
          {"trials_run", fleet.trials_run},
          {"note", fleet.note}};
}

json toJson(const CacheReport& c) {
  json fields = json::object();
  for (const auto& [name, value] : c.key.fields) fields[name] = value;
  return {{"dir", c.dir},
          {"key", c.key.hash},
          {"fields", fields},
          {"outcome", c.outcome},
          {"cached", c.outcome == "hit"},
          {"trusted", c.trusted},
          {"stored_at", c.stored_at},
          {"cached_trials", c.cached_trials},
          {"cached_search_s", c.cached_search_s},
          {"store_error", c.store_error}};
}

json toJson(const AccumulationPlan& plan) {
  return {{"kind", toString(plan.kind)},
          {"micro_batch_size", plan.largestMicroBatch()},
          {"micro_batches", microBatchesJson(plan)},
          {"groups", groupsJson(plan)},
          {"accumulation_steps", plan.accumulation_steps},
          {"per_rank_batch", plan.per_rank_batch},
          {"world_size", plan.world_size},
          {"effective_batch", plan.effective_batch},
          {"predicted_samples_per_second", plan.predicted_samples_per_second}};
}

json toJson(const MemoryBreakdown& m) {
  return {{"parameter_count", m.parameter_count},
          {"parameter_bytes", m.parameter_bytes},
          {"gradient_bytes", m.gradient_bytes},
          {"optimizer_state_bytes", m.optimizer_state_bytes},
          {"baseline_bytes", m.baseline_bytes},
          {"outside_bytes", m.outside_bytes},
          {"outside_growth_bytes", m.outside_growth_bytes},
          {"ddp_bucket_bytes", m.ddp_bucket_bytes}};
}

// null for a single process; else this rank and, after the exchange, what the ranks agreed on.
json ranksJson(const ReportData& d) {
  if (!d.rank || !d.rank->agrees()) return nullptr;
  const RankInfo& r = *d.rank;
  json doc = {{"rank", r.rank},
              {"world_size", r.world_size},
              {"local_rank", r.local_rank},
              {"source", r.source},
              {"master_addr", r.master_addr},
              {"master_port", r.master_port},
              {"agent_store", r.use_agent_store},
              {"agreed", d.agreement.has_value()}};
  if (d.agreement) {
    json reports = json::array();
    for (const auto& rep : d.agreement->reports) {
      reports.push_back({{"rank", rep.rank},
                         {"device", rep.device},
                         {"safe_micro_batch", rep.safe_micro_batch},
                         {"plan_max_micro_batch", rep.plan_max_micro_batch},
                         {"memory_limit_bytes", rep.memory_limit_bytes}});
    }
    doc["safe_micro_batch"] = d.agreement->safe_micro_batch;
    doc["plan_max_micro_batch"] = d.agreement->plan_max_micro_batch;
    doc["limiting_ranks"] = d.agreement->limiting_ranks;
    doc["reports"] = reports;
  }
  return doc;
}

json optionsJson(const TrainingSpec& spec, const SearchOptions& o) {
  json inputs = json::array();
  for (const auto& s : spec.inputs) inputs.push_back(toString(s));
  return {{"model", spec.model_path},
          {"inputs", inputs},
          {"loss", spec.loss ? json(toString(*spec.loss)) : json(nullptr)},
          {"optimizer", toString(spec.optimizer)},
          {"optimizer_impl", toString(spec.optimizer_impl)},
          {"zero_grad", toString(spec.zero_grad)},
          {"keep_output", spec.keep_output},
          {"learning_rate", spec.learning_rate},
          {"precision", toString(spec.precision)},
          {"device", spec.device},
          {"steps_per_trial", spec.steps_per_trial},
          {"accumulation_steps", spec.accumulation_steps},
          {"cudnn_benchmark", spec.cudnn_benchmark},
          {"optimize_graph", spec.optimize_graph},
          {"seed", spec.seed},
          {"memory_limit_bytes", o.memory_limit_bytes},
          {"reserve_bytes", o.reserve_bytes},
          {"margin_fraction", o.margin_fraction},
          {"margin_bytes", o.margin_bytes},
          {"min_batch", o.min_batch},
          {"max_batch", o.max_batch},
          {"dataset_size", o.dataset_size},
          {"initial_batch", o.initial_batch},
          {"strategy", toString(o.strategy)},
          {"relative_tolerance", o.relative_tolerance},
          {"max_trials", o.max_trials},
          {"time_limit_s", o.time_limit_s},
          {"target_batch", o.target_batch},
          {"world_size", o.world_size},
          {"plan", toString(o.plan)}};
}

json buildJson(const BuildInfo& b) {
  return {{"version", b.autobatch_version},
          {"libtorch_version", b.libtorch_version},
          {"cuda_build", b.cuda_build},
          {"cuda_version", b.cuda_version},
          {"cuda_driver_version", b.cuda_driver_version}};
}

// The device the run used (`ctx`), or the one asked for (`device`) when no trial ran.
json deviceJson(const BuildInfo& build, const RunContext* ctx, const std::string& device) {
  return {{"name", device},
          {"description", gpuName(build, device)},
          {"total_bytes", gpuBytes(build, device)},
          {"backend", ctx ? ctx->backend : ""},
          {"memory_limit_bytes", ctx ? ctx->memory_limit_bytes : 0},
          {"memory_limit_source", ctx ? ctx->memory_limit_source : ""},
          {"allocator_config", ctx ? ctx->allocator.config : ""},
          {"allocator_config_env", ctx ? ctx->allocator.config_env : ""},
          {"pytorch_alloc_conf", optionalJson(ctx, &AllocatorInfo::pytorch_alloc_conf)},
          {"pytorch_cuda_alloc_conf", optionalJson(ctx, &AllocatorInfo::pytorch_cuda_alloc_conf)},
          {"expandable_segments", ctx ? ctx->allocator.expandable_segments : false},
          {"allocator_fraction", ctx ? ctx->allocator.fraction : 1.0}};
}

json fingerprintJson(const ReportData& d, const RunContext* ctx, const std::string& device,
                     const json& options) {
  json used_inputs = json::array();
  if (ctx) {
    for (const auto& s : ctx->inputs) used_inputs.push_back(toString(s));
  }
  return {{"device_name", gpuName(d.build, device)},
          {"device_total_bytes", gpuBytes(d.build, device)},
          {"cuda_driver_version", d.build.cuda_driver_version},
          {"libtorch_version", d.build.libtorch_version},
          {"autobatch_version", d.build.autobatch_version},
          {"model_sha1", d.model_sha1},
          {"model_file_bytes", d.model_file_bytes},
          {"inputs", used_inputs},
          {"loss", ctx ? json(toString(ctx->loss)) : json(nullptr)},
          {"options", options}};
}

// The memory breakdown with the optimizer implementation and the model's format; null before a
// trial ran.
json modelJson(const ReportData& d) {
  const MemoryBreakdown* m = memoryOf(d);
  if (m == nullptr) return nullptr;
  json doc = toJson(*m);
  doc["optimizer_impl"] = m->optimizer_impl;
  doc["format"] = m->model_format;
  return doc;
}

json resultJson(const SearchResult& s, const MemoryBreakdown& m) {
  return {{"search_status", toString(s.status)},
          {"max_micro_batch", s.max_micro_batch},
          {"safe_micro_batch", s.safe_micro_batch},
          {"capped_by", s.capped_by},
          {"micro_batches_per_step", s.micro_batches_per_step},
          {"memory_limit_bytes", s.memory_limit_bytes},
          {"margin_bytes", s.margin_bytes},
          {"headroom_bytes", s.memory_limit_bytes - s.margin_bytes},
          {"fastest_micro_batch", s.fastest_micro_batch},
          {"non_monotonic", s.non_monotonic},
          {"size_limit_batch", s.size_limit_batch},
          {"size_limit_reason", s.size_limit_reason},
          {"min_batch_needs_at_least_bytes", s.min_batch_needs_at_least_bytes},
          {"model_needs_bytes", modelNeedsBytes(m)},
          {"model_exceeds_limit", modelNeedsBytes(m) > s.memory_limit_bytes},
          {"trial_count", s.trials.size()},
          {"elapsed_s", s.elapsed_s}};
}

json fitJson(const SearchResult& s) {
  return {{"fixed_bytes", s.fit.fixed_bytes},
          {"per_sample_bytes", s.fit.per_sample_bytes},
          {"points", s.fit.points},
          {"predicted_peak_bytes", s.predicted_peak_bytes},
          {"measured_peak_bytes", s.measured_peak_bytes}};
}

// Both plans for the target, the primary one named; null without a target.
json plansJson(const SearchResult& s, const SearchOptions& o) {
  if (!s.plan) return nullptr;
  return {{"target_batch", s.plan->target_batch},
          {"max_micro_batch", s.plan->max_micro_batch},
          {"verified", s.plan_verified},
          {"primary", toString(s.plan->primary_kind)},
          {"uniform", toJson(s.plan->uniform)},
          {"balanced", toJson(s.plan->balanced)},
          {"rule", toString(o.plan)},
          {"predicted_samples_per_second",
           {{"uniform", s.plan->uniform.predicted_samples_per_second},
            {"balanced", s.plan->balanced.predicted_samples_per_second}}}};
}

json checkJson(const CheckResult& c) {
  return {{"micro_batch_size", c.trial.request.micro_batch_size},
          {"fits", c.fits},
          {"fits_with_margin", c.fits_with_margin},
          {"margin_bytes", c.margin_bytes}};
}

// --eval / --eval-only / --check-eval-batch (docs/evaluation.md): the state the evaluation
// trials ran beside, the training step that made it, and the evaluation search.
json evalJson(const EvalResult& e) {
  json doc = {{"state", evalStateKey(e.state)}, {"training_batch", e.training_batch},
              {"state_fits", e.state_fits},     {"resident_bytes", e.resident_bytes},
              {"batches_per_trial", 2},         {"training_step", nullptr}};
  if (e.state == EvalState::kTrainingResident) doc["training_step"] = toJson(e.training_step);
  return doc;
}

json evalSearchJson(const EvalResult& e) {
  const SearchResult& s = e.search;
  json doc = evalJson(e);
  doc["search_status"] = toString(s.status);
  doc["max_batch"] = s.max_micro_batch;
  doc["safe_batch"] = s.safe_micro_batch;
  doc["capped_by"] = s.capped_by;
  doc["min_batch_needs_at_least_bytes"] = s.min_batch_needs_at_least_bytes;
  doc["trial_count"] = s.trials.size();
  doc["elapsed_s"] = s.elapsed_s;
  return doc;
}

// The eval keys of a run with --eval or --eval-only; nothing at all without them.
void addEval(const ReportData& d, json& doc, json& trials, json& warnings) {
  if (d.result && d.result->eval) {
    const EvalResult& e = *d.result->eval;
    doc["result"]["eval_max_batch"] = e.search.max_micro_batch;
    doc["result"]["eval_safe_batch"] = e.search.safe_micro_batch;
    doc["eval"] = evalSearchJson(e);
    if (e.state == EvalState::kParametersOnly) {  // result.search is the evaluation search
      for (auto& t : trials) t["eval"] = true;
      return;
    }
    for (const auto& t : e.search.trials) {
      json trial = toJson(t);
      trial["eval"] = true;
      trials.push_back(std::move(trial));
    }
    for (const auto& w : e.search.warnings) warnings.push_back("eval: " + w);
  }
  if (d.check && d.check->eval) {
    const EvalResult& e = *d.check->eval;
    doc["check"]["eval"] = true;
    doc["check"]["state_fits"] = e.state_fits;
    doc["eval"] = evalJson(e);
    if (e.state_fits && !trials.empty()) trials.back()["eval"] = true;
  }
}

}  // namespace

std::string detail::plansJsonText(const SearchResult& search, const SearchOptions& options) {
  return plansJson(search, options).dump();
}

std::string toJson(const ReportData& d) {
  json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["status"] = d.status;
  doc["exit_code"] = d.exit_code;
  doc["error"] = d.error;
  doc["autobatch"] = buildJson(d.build);
  const RunContext* ctx = contextOf(d);
  const std::string device = ctx ? ctx->device : d.spec.device;
  doc["device"] = deviceJson(d.build, ctx, device);
  doc["options"] = optionsJson(d.spec, d.options);
  doc["fingerprint"] = fingerprintJson(d, ctx, device, doc["options"]);
  doc["model"] = modelJson(d);
  json trials = json::array();
  json warnings = json::array();
  if (ctx) {
    for (const auto& w : ctx->warnings) warnings.push_back(w);
  }
  doc["result"] = nullptr;
  doc["fit"] = nullptr;
  doc["plans"] = nullptr;
  doc["check"] = nullptr;
  if (d.result) {
    const SearchResult& s = d.result->search;
    for (const auto& t : s.trials) trials.push_back(toJson(t));
    for (const auto& w : s.warnings) warnings.push_back(w);
    doc["result"] = resultJson(s, d.result->memory);
    doc["fit"] = fitJson(s);
    doc["plans"] = plansJson(s, d.options);
  }
  if (d.check) {
    trials.push_back(toJson(d.check->trial));
    doc["check"] = checkJson(*d.check);
  }
  addEval(d, doc, trials, warnings);
  doc["trials"] = trials;
  doc["warnings"] = warnings;
  doc["ranks"] = ranksJson(d);
  doc["cache"] = d.cache ? toJson(*d.cache) : json(nullptr);
  doc["sweep"] = d.sweep ? toJson(*d.sweep) : json(nullptr);
  if (d.fleet) doc["fleet"] = toJson(*d.fleet);  // only with --fleet (the goldens have none)
  // Paths, flag values and model messages are not always UTF-8: an invalid byte becomes U+FFFD
  // instead of an exception (the report is written on every exit, errors included).
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace autobatch
