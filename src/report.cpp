#include "autobatch/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "autobatch/error.h"
#include "autobatch/units.h"
#include "memory_backend.h"

namespace autobatch {
namespace {

using nlohmann::json;

std::string inputsText(const std::vector<InputSpec>& inputs) {
  std::string text;
  for (const auto& spec : inputs) {
    if (!text.empty()) text += ",";
    text += toString(spec);
  }
  return text;
}

// A recorded environment variable: its value, or null when it was unset (or no trial context).
json optionalJson(const RunContext* ctx, std::optional<std::string> AllocatorInfo::*field) {
  if (ctx == nullptr || !(ctx->allocator.*field)) return nullptr;
  return *(ctx->allocator.*field);
}

}  // namespace

std::string peakPhase(const TrialResult& t) {
  const PhasePeak* top = nullptr;
  for (const auto& p : t.phase_peaks) {
    // A measure of a package's forward-backward call, never the phase that set the peak.
    if (p.phase == detail::phaseKey(detail::TrialPhase::kCallActivations)) continue;
    if (top == nullptr || p.peak_allocated_bytes > top->peak_allocated_bytes) top = &p;
  }
  if (top == nullptr) return "";
  return top->phase + (top->micro_batch_index > 0
                           ? " #" + std::to_string(top->micro_batch_index + 1)
                           : std::string());
}

namespace {

// The failed phase of an out-of-memory trial, with the lower bound it gives on that phase's peak
// ("failed in backward, needs >= 1.2 GiB"); else the phase that set the trial's peak.
std::string failedPhase(const TrialResult& t) {
  if (t.failed_phase.empty()) return "";
  return t.failed_phase + (t.failed_micro_batch_index > 0
                               ? " #" + std::to_string(t.failed_micro_batch_index + 1)
                               : std::string());
}
std::string phaseNote(const TrialResult& t) {
  if (t.outcome != TrialOutcome::kFits && !failedPhase(t).empty()) {
    return "  failed in " + failedPhase(t) +
           (t.failed_in_use_bytes > 0
                ? ", needs >= " + formatBytes(t.failed_in_use_bytes + t.failed_request_bytes)
                : std::string());
  }
  return peakPhase(t).empty() ? std::string() : "  peak in " + peakPhase(t);
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
  return {{"micro_batch_size", t.request.micro_batch_size},
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
          {"outside_growth_bytes", t.outside_growth_bytes},
          {"output_bytes", t.output_bytes},
          {"phase_peaks", phases},
          {"peak_phase", peakPhase(t)},
          {"step_ms", t.step_ms},
          {"steps_completed", t.steps_completed},
          {"samples_per_second", samplesPerSecond(t)},
          {"cancelled", t.cancelled}};
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
  }
  json mixed = nullptr;
  if (sweep.mixed) {
    const MixVerification& v = *sweep.mixed;
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
    mixed = {{"status", v.status},
             {"margin_bytes", v.margin_bytes},
             {"trials", trials},
             {"lowered", lowered}};
  }
  return {{"rows", rows},
          {"longest_trainable_length", sweep.longest_trainable_length},
          {"target_tokens", sweep.target_tokens},
          {"mixed_verification", mixed}};
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

const RunContext* contextOf(const ReportData& d) {
  if (d.result) return &d.result->context;
  if (d.check) return &d.check->context;
  return nullptr;
}

const MemoryBreakdown* memoryOf(const ReportData& d) {
  if (d.result) return &d.result->memory;
  if (d.check) return &d.check->memory;
  return nullptr;
}

std::string gpuName(const BuildInfo& build, const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return "cpu";
  int index = 0;
  if (const auto colon = device.find(':'); colon != std::string::npos) {
    index = std::atoi(device.c_str() + colon + 1);
  }
  for (const auto& d : build.cuda_devices) {
    if (d.index == index) return d.name;
  }
  return device;
}

std::int64_t gpuBytes(const BuildInfo& build, const std::string& device) {
  for (const auto& d : build.cuda_devices) {
    if (device == "cuda:" + std::to_string(d.index) || (device == "cuda" && d.index == 0)) {
      return d.total_bytes;
    }
  }
  return 0;
}

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

/// A sweep row with no verified batch whose search did not find that nothing fits: what stopped
/// it. "nothing fits (cancelled)" blamed memory for an interrupt (issue 27, row 21).
std::string unverifiedRowText(const std::string& status) {
  if (status == "cancelled") return "interrupted before a batch was verified";
  if (status == "time-budget") return "the time budget ran out before a batch was verified";
  if (status == "trial-budget") return "the trial budget ran out before a batch was verified";
  return "nothing fits (" + status + ")";
}

/// What the model holds whatever the batch: parameters, gradients and optimizer state, in bytes.
std::int64_t modelNeedsBytes(const MemoryBreakdown& m) {
  return m.parameter_bytes + m.gradient_bytes + m.optimizer_state_bytes;
}

}  // namespace

CacheKey cacheKeyFields(const ReportData& d) {
  CacheKey key;
  if (!d.result) return key;
  const RunContext& c = d.result->context;
  const MemoryBreakdown& m = d.result->memory;
  const TrainingSpec& s = d.spec;
  const SearchOptions& o = d.options;
  auto add = [&key](std::string name, std::string value) {
    key.fields.emplace_back(std::move(name), std::move(value));
  };
  add("model_sha1", d.model_sha1);
  add("model_file_bytes", std::to_string(d.model_file_bytes));
  std::string inputs;
  for (const auto& spec : c.inputs) inputs += (inputs.empty() ? "" : ",") + toString(spec);
  add("inputs", inputs);
  add("loss", std::string(toString(c.loss)));
  add("optimizer", std::string(toString(s.optimizer)));
  add("optimizer_impl", m.optimizer_impl);
  add("zero_grad", std::string(toString(s.zero_grad)));
  add("keep_output", s.keep_output ? "yes" : "no");
  add("precision", std::string(toString(s.precision)));
  add("steps_per_trial", std::to_string(s.steps_per_trial));
  add("micro_batches_per_step", std::to_string(c.micro_batches_per_trial));
  add("cudnn_benchmark", s.cudnn_benchmark ? "yes" : "no");
  add("optimize_graph", s.optimize_graph ? "yes" : "no");
  add("memory_limit_bytes", std::to_string(c.memory_limit_bytes));
  add("reserve_bytes", std::to_string(o.reserve_bytes));
  add("margin", o.margin_bytes >= 0 ? std::to_string(o.margin_bytes) + " bytes"
                                    : fmt::format("{} of the limit", o.margin_fraction));
  add("strategy", std::string(toString(o.strategy)));
  add("relative_tolerance", fmt::format("{}", o.relative_tolerance));
  add("min_batch", std::to_string(o.min_batch));
  add("max_batch", std::to_string(o.max_batch));
  add("dataset_size", std::to_string(o.dataset_size));
  add("ddp_bucket_bytes", std::to_string(m.ddp_bucket_bytes));
  add("device_name", gpuName(d.build, c.device));
  add("device_total_bytes", std::to_string(gpuBytes(d.build, c.device)));
  add("cuda_driver_version", std::to_string(d.build.cuda_driver_version));
  add("libtorch_version", d.build.libtorch_version);
  add("autobatch_version", d.build.autobatch_version);
  add("allocator_config", c.allocator.config);
  return key;
}

std::string toJson(const ReportData& d) {
  json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["status"] = d.status;
  doc["exit_code"] = d.exit_code;
  doc["error"] = d.error;
  doc["autobatch"] = {{"version", d.build.autobatch_version},
                      {"libtorch_version", d.build.libtorch_version},
                      {"cuda_build", d.build.cuda_build},
                      {"cuda_version", d.build.cuda_version},
                      {"cuda_driver_version", d.build.cuda_driver_version}};
  const RunContext* ctx = contextOf(d);
  const std::string device = ctx ? ctx->device : d.spec.device;
  doc["device"] = {
      {"name", device},
      {"description", gpuName(d.build, device)},
      {"total_bytes", gpuBytes(d.build, device)},
      {"backend", ctx ? ctx->backend : ""},
      {"memory_limit_bytes", ctx ? ctx->memory_limit_bytes : 0},
      {"memory_limit_source", ctx ? ctx->memory_limit_source : ""},
      {"allocator_config", ctx ? ctx->allocator.config : ""},
      {"allocator_config_env", ctx ? ctx->allocator.config_env : ""},
      {"pytorch_alloc_conf", optionalJson(ctx, &AllocatorInfo::pytorch_alloc_conf)},
      {"pytorch_cuda_alloc_conf", optionalJson(ctx, &AllocatorInfo::pytorch_cuda_alloc_conf)},
      {"expandable_segments", ctx ? ctx->allocator.expandable_segments : false},
      {"allocator_fraction", ctx ? ctx->allocator.fraction : 1.0}};
  doc["options"] = optionsJson(d.spec, d.options);
  json used_inputs = json::array();
  if (ctx) {
    for (const auto& s : ctx->inputs) used_inputs.push_back(toString(s));
  }
  doc["fingerprint"] = {{"device_name", gpuName(d.build, device)},
                        {"device_total_bytes", gpuBytes(d.build, device)},
                        {"cuda_driver_version", d.build.cuda_driver_version},
                        {"libtorch_version", d.build.libtorch_version},
                        {"autobatch_version", d.build.autobatch_version},
                        {"model_sha1", d.model_sha1},
                        {"model_file_bytes", d.model_file_bytes},
                        {"inputs", used_inputs},
                        {"loss", ctx ? json(toString(ctx->loss)) : json(nullptr)},
                        {"options", doc["options"]}};
  doc["model"] = memoryOf(d) ? toJson(*memoryOf(d)) : json(nullptr);
  if (memoryOf(d) != nullptr) {
    doc["model"]["optimizer_impl"] = memoryOf(d)->optimizer_impl;
    doc["model"]["format"] = memoryOf(d)->model_format;
  }
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
    doc["result"] = {
        {"search_status", toString(s.status)},
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
        {"model_needs_bytes", modelNeedsBytes(d.result->memory)},
        {"model_exceeds_limit", modelNeedsBytes(d.result->memory) > s.memory_limit_bytes},
        {"trial_count", s.trials.size()},
        {"elapsed_s", s.elapsed_s}};
    doc["fit"] = {{"fixed_bytes", s.fit.fixed_bytes},
                  {"per_sample_bytes", s.fit.per_sample_bytes},
                  {"points", s.fit.points},
                  {"predicted_peak_bytes", s.predicted_peak_bytes},
                  {"measured_peak_bytes", s.measured_peak_bytes}};
    if (s.plan) {
      doc["plans"] = {{"target_batch", s.plan->target_batch},
                      {"max_micro_batch", s.plan->max_micro_batch},
                      {"verified", s.plan_verified},
                      {"primary", toString(s.plan->primary_kind)},
                      {"uniform", toJson(s.plan->uniform)},
                      {"balanced", toJson(s.plan->balanced)},
                      {"rule", toString(d.options.plan)},
                      {"predicted_samples_per_second",
                       {{"uniform", s.plan->uniform.predicted_samples_per_second},
                        {"balanced", s.plan->balanced.predicted_samples_per_second}}}};
    }
  }
  if (d.check) {
    trials.push_back(toJson(d.check->trial));
    doc["check"] = {{"micro_batch_size", d.check->trial.request.micro_batch_size},
                    {"fits", d.check->fits},
                    {"fits_with_margin", d.check->fits_with_margin},
                    {"margin_bytes", d.check->margin_bytes}};
  }
  doc["trials"] = trials;
  doc["warnings"] = warnings;
  doc["ranks"] = ranksJson(d);
  doc["cache"] = d.cache ? toJson(*d.cache) : json(nullptr);
  doc["sweep"] = d.sweep ? toJson(*d.sweep) : json(nullptr);
  // Paths, flag values and model messages are not always UTF-8: an invalid byte becomes U+FFFD
  // instead of an exception (the report is written on every exit, errors included).
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string humanReport(const ReportData& d) {
  std::ostringstream out;
  const RunContext* ctx = contextOf(d);
  if (ctx) {
    out << fmt::format("device {} ({}), limit {} ({})\n", ctx->device, ctx->backend,
                       formatBytes(ctx->memory_limit_bytes), ctx->memory_limit_source);
    out << fmt::format(
        "model {}{}: inputs {}, loss {}, optimizer {}{}, zero_grad {}, output {}, {}, {} steps "
        "per trial, {} micro-batch(es) per step\n",
        d.spec.model_path,
        memoryOf(d) != nullptr && memoryOf(d)->model_format == "pt2" ? " (pt2 package)" : "",
        inputsText(ctx->inputs), toString(ctx->loss), toString(d.spec.optimizer),
        memoryOf(d) != nullptr && !memoryOf(d)->optimizer_impl.empty()
            ? " (" + memoryOf(d)->optimizer_impl + ")"
            : std::string(),
        toString(d.spec.zero_grad), d.spec.keep_output ? "kept through the step" : "dropped",
        toString(d.spec.precision), d.spec.steps_per_trial, ctx->micro_batches_per_trial);
  }
  std::vector<TrialResult> trials;
  if (d.result) trials = d.result->search.trials;
  if (d.check) trials.push_back(d.check->trial);
  if (!trials.empty()) {
    out << "\ntrials\n";
    out << fmt::format("  {:>3} {:>7} {:>5}  {:<13} {:>12} {:>12} {:>12} {:>9} {:>10}\n", "#",
                       "batch", "micro", "outcome", "peak alloc", "peak reserv", "peak vs lim",
                       "step ms", "samples/s");
    int n = 0;
    for (const auto& t : trials) {
      out << fmt::format("  {:>3} {:>7} {:>5}  {:<13} {:>12} {:>12} {:>12} {:>9.1f} {:>10.1f}{}\n",
                         ++n, t.request.micro_batch_size, t.request.micro_batches_per_step,
                         outcomeText(t, d.options), formatBytes(t.peak_allocated_bytes),
                         formatBytes(t.peak_reserved_bytes), formatBytes(t.peak_bytes), t.step_ms,
                         samplesPerSecond(t),
                         phaseNote(t) +
                             (t.outside_growth_bytes > 0
                                  ? "  outside allocator +" + formatBytes(t.outside_growth_bytes)
                                  : std::string()) +
                             (t.reason.empty() ? "" : "  " + t.reason.substr(0, 80)));
    }
  }
  if (d.result) {
    const SearchResult& s = d.result->search;
    out << fmt::format("\nresult ({}, {} trials, {:.1f} s)\n", toString(s.status), s.trials.size(),
                       s.elapsed_s);
    if (d.cache) {
      const CacheReport& c = *d.cache;
      if (c.outcome == "hit") {
        out << fmt::format(
            "  cached            from {} ({} trials, {:.1f} s then; {}; key {})\n", c.stored_at,
            c.cached_trials, c.cached_search_s,
            c.trusted ? "trusted without a trial (--cache-trust)" : "confirmed by the trial above",
            c.key.hash.substr(0, 12));
      } else {
        out << fmt::format("  cache             {}{}; key {}\n",
                           c.outcome == "miss" ? "miss, searched and stored"
                                               : "the entry's confirming trial failed: dropped, "
                                                 "searched and stored again",
                           c.store_error.empty() ? "" : " (not stored: " + c.store_error + ")",
                           c.key.hash.substr(0, 12));
      }
    }
    out << fmt::format("  max micro-batch   {}\n", s.max_micro_batch);
    if (s.max_micro_batch > 0 && s.capped_by != "memory") {
      out << fmt::format("  capped by         {}{}\n", s.capped_by,
                         s.capped_by == "max-batch" || s.capped_by == "dataset-size"
                             ? ": memory may allow more; larger batches were not tried"
                         : s.capped_by == "size-limit"
                             ? ": the next batch hits a kernel's size limit, not memory"
                             : ": the search stopped before larger batches were ruled out");
    } else if (s.max_micro_batch > 0) {
      out << "  capped by         memory\n";
    }
    out << fmt::format("  safe micro-batch  {}  (peak under limit - margin = {} - {} = {})\n",
                       s.safe_micro_batch, formatBytes(s.memory_limit_bytes),
                       formatBytes(s.margin_bytes),
                       formatBytes(s.memory_limit_bytes - s.margin_bytes));
    if (s.status == SearchStatus::kNothingFits && s.max_micro_batch > 0) {
      out << fmt::format(
          "  nothing fits under the margin: the minimum batch {} fits (raw maximum {}), but its "
          "peak {} is above the limit less the margin {}; lower --margin or give more memory\n",
          d.options.min_batch, s.max_micro_batch, formatBytes(s.min_batch_needs_at_least_bytes),
          formatBytes(s.memory_limit_bytes - s.margin_bytes));
    } else if (s.status == SearchStatus::kNothingFits) {
      out << fmt::format(
          "  nothing fits at the minimum batch {}: it needs at least {} (limit less the margin "
          "{})\n",
          d.options.min_batch, formatBytes(s.min_batch_needs_at_least_bytes),
          formatBytes(s.memory_limit_bytes - s.margin_bytes));
      const MemoryBreakdown& m = d.result->memory;
      const std::int64_t own = modelNeedsBytes(m);
      if (own > s.memory_limit_bytes) {
        out << fmt::format(
            "  the model itself needs {} ({} bytes: parameters {} + gradients {} + optimizer state "
            "{}), more than the limit of {} ({} bytes): no batch can fit; use {}, sgd instead "
            "of adam/adamw, fp16/bf16, or a smaller model\n",
            formatBytes(own), own, formatBytes(m.parameter_bytes), formatBytes(m.gradient_bytes),
            formatBytes(m.optimizer_state_bytes), formatBytes(s.memory_limit_bytes),
            s.memory_limit_bytes,
            // The limit came from the flag, or from the device / the process's own limits,
            // which a larger --memory-limit cannot raise.
            d.options.memory_limit_bytes > 0 ? "a larger --memory-limit (if the device has it)"
                                             : "a device or a job with more memory");
      }
    }
    if (s.size_limit_batch > 0) {
      out << fmt::format("  size limit at {}: {}\n", s.size_limit_batch, s.size_limit_reason);
    }
    if (s.plan) {
      const auto& p = *s.plan;
      out << fmt::format(
          "\nplans for target batch {} (world size {}, max micro-batch {}{}; steps x "
          "micro-batch, * primary by rule {})\n",
          p.target_batch, p.uniform.world_size, p.max_micro_batch,
          p.primary().accumulation_steps == 1 ? ", no accumulation needed"
          : s.plan_verified                   ? ", verified with 2 micro-batches per step"
                                              : ", NOT verified with 2 micro-batches per step",
          toString(d.options.plan));
      for (const AccumulationPlan* plan : {&p.uniform, &p.balanced}) {
        std::string sizes;
        for (const auto& g : plan->groups) {
          sizes +=
              fmt::format("{}{} x {}", sizes.empty() ? "" : " + ", g.count, g.micro_batch_size);
        }
        out << fmt::format(
            "  {} {:<9} {:>3} accumulation steps: {} = {} per rank, x {} rank(s) = "
            "{}{}\n",
            plan->kind == p.primary_kind ? "*" : " ", toString(plan->kind),
            plan->accumulation_steps, sizes, plan->per_rank_batch, plan->world_size,
            plan->effective_batch,
            plan->predicted_samples_per_second > 0.0
                ? fmt::format("  (predicted {:.1f} samples/s per rank)",
                              plan->predicted_samples_per_second)
                : std::string("  (no speed prediction: no trial near its micro-batch)"));
      }
    }
    const MemoryBreakdown& m = d.result->memory;
    out << "\nmemory\n";
    out << fmt::format("  parameters       {:.2f}M, {}\n",
                       static_cast<double>(m.parameter_count) / 1e6,
                       formatBytes(m.parameter_bytes));
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
    if (s.fit.points >= 2) {
      out << fmt::format("  affine fit       fixed {} + {} per sample ({} points)\n",
                         formatBytes(static_cast<std::int64_t>(s.fit.fixed_bytes)),
                         formatBytes(static_cast<std::int64_t>(s.fit.per_sample_bytes)),
                         s.fit.points);
      if (s.measured_peak_bytes > 0) {
        const double err = 100.0 *
                           (s.predicted_peak_bytes - static_cast<double>(s.measured_peak_bytes)) /
                           static_cast<double>(s.measured_peak_bytes);
        out << fmt::format("  at batch {}:  predicted {}, measured {} ({:+.1f}%)\n",
                           s.max_micro_batch,
                           formatBytes(static_cast<std::int64_t>(s.predicted_peak_bytes)),
                           formatBytes(s.measured_peak_bytes), err);
      }
    }
    if (d.agreement) {
      out << fmt::format("\nranks ({} ranks agreed on the minimum; limited by rank(s) {})\n",
                         d.agreement->reports.size(), fmt::join(d.agreement->limiting_ranks, ", "));
      for (const auto& rep : d.agreement->reports) {
        out << fmt::format("  rank {:>3}  {:<8} safe micro-batch {:>6}  limit {}{}\n", rep.rank,
                           rep.device, rep.safe_micro_batch, formatBytes(rep.memory_limit_bytes),
                           rep.rank == d.rank->rank ? "  (this rank)" : "");
      }
    }
    for (const auto& w : ctx->warnings) out << "warning: " << w << "\n";
    for (const auto& w : s.warnings) out << "warning: " << w << "\n";
  }
  if (d.sweep) {
    const SweepReport& sw = *d.sweep;
    out << fmt::format("\nlength sweep ({} lengths{})\n", sw.rows.size(),
                       sw.target_tokens > 0
                           ? fmt::format(", target {} tokens per optimizer step", sw.target_tokens)
                           : std::string());
    out << fmt::format("  {:>7} {:>9} {:>9} {:>12}  {:<16} {:>6} {:>8}  {}\n", "length", "max",
                       "safe", "tokens/micro", "peak phase", "trials", "time", "plan");
    for (const auto& r : sw.rows) {
      std::string plan;
      if (r.status == "error") {
        plan = "error: " + r.error;
      } else if (r.status == "fails-mixed") {
        plan = fmt::format("left out: batch {} (found alone) never passed mixed", r.lowered_from);
      } else if (r.safe_micro_batch <= 0) {
        // The search's first trial is at --min-batch: the bound is for that batch, not for 1.
        plan = r.min_batch_needs_at_least_bytes > 0
                   ? fmt::format("nothing fits: batch {} needs at least {}", d.options.min_batch,
                                 formatBytes(r.min_batch_needs_at_least_bytes))
                   : unverifiedRowText(r.status);
      } else if (r.plan) {
        const AccumulationPlan& p = r.plan->primary();
        plan = fmt::format("{} steps x {} = {} sequences ({})", p.accumulation_steps,
                           p.largestMicroBatch(), p.effective_batch, toString(p.kind));
      } else if (sw.target_tokens > 0 && r.target_batch == 0) {
        plan = "target below one sequence per rank";
      } else if (r.target_batch > 0) {
        plan = fmt::format("no plan for {} sequences: none fits with 2 micro-batches per step",
                           r.target_batch);
      }
      out << fmt::format("  {:>7} {:>9} {:>9} {:>12}  {:<16} {:>6} {:>7.1f}s  {}\n", r.length,
                         r.max_micro_batch, r.safe_micro_batch, r.tokens_per_micro_batch,
                         r.binding_phase.empty() ? "-" : r.binding_phase, r.trials, r.elapsed_s,
                         plan);
    }
    out << (sw.longest_trainable_length > 0
                ? fmt::format("  longest trainable length: {} (the result above is for it)\n",
                              sw.longest_trainable_length)
                : std::string("  no length fits\n"));
    if (sw.mixed && sw.mixed->status != "skipped") {
      const MixVerification& v = *sw.mixed;
      std::string what;
      for (const auto& l : v.lowered) {
        what += l.to > 0 ? fmt::format("; length {} lowered {} -> {}", l.length, l.from, l.to)
                         : fmt::format("; length {} left out (from {})", l.length, l.from);
      }
      std::int64_t peak = 0;
      std::int64_t limit = 0;
      bool over_margin = false;
      if (!v.trials.empty()) {
        peak = v.trials.back().result.peak_bytes;
        limit = v.trials.back().result.memory_limit_bytes;
        over_margin = v.trials.back().over_margin;
      }
      out << fmt::format(
          "  mixed verification (the buckets in one trial, the longest after each other one, "
          "the allocator's cache kept): {} in {} trial{}{}{}\n",
          v.status, v.trials.size(), v.trials.size() == 1 ? "" : "s",
          limit > 0
              ? fmt::format(", last peak {} of {} (limit less the margin {}{})", formatBytes(peak),
                            formatBytes(limit), formatBytes(limit - v.margin_bytes),
                            over_margin ? ": over the margin" : "")
              : std::string(),
          what);
    }
  }
  if (d.check) {
    const CheckResult& c = *d.check;
    out << fmt::format("\ncheck micro-batch {}: {} raw, {} with the margin ({})\n",
                       c.trial.request.micro_batch_size, c.fits ? "fits" : "does not fit",
                       c.fits_with_margin ? "fits" : "does not fit", formatBytes(c.margin_bytes));
  }
  if (ctx && !d.result) {
    for (const auto& w : ctx->warnings) out << "warning: " << w << "\n";
  }
  if (!d.error.empty()) out << "error: " << d.error << "\n";
  return out.str();
}

namespace {

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

}  // namespace

std::string envLines(const ReportData& d) {
  // The raw maximum and the safe batch, as in the JSON (result, or check.fits /
  // check.fits_with_margin): the maximum is reported even when nothing is under the margin.
  std::int64_t max_micro = 0;
  std::int64_t safe_micro = 0;
  if (d.result) {
    max_micro = d.result->search.max_micro_batch;
    safe_micro = d.result->search.safe_micro_batch;
  } else if (d.check) {
    const std::int64_t micro = d.check->trial.request.micro_batch_size;
    max_micro = d.check->fits ? micro : 0;
    safe_micro = d.check->fits_with_margin ? micro : 0;
  }
  const std::optional<AccumulationPlan> plan = launchPlan(d);
  std::string sizes;
  std::string groups;
  if (plan) {
    if (plan->listsMicroBatches())
      sizes = fmt::format("{}", fmt::join(plan->microBatchSizes(), " "));
    for (const auto& g : plan->groups) {
      groups += fmt::format("{}{}:{}", groups.empty() ? "" : " ", g.micro_batch_size, g.count);
    }
  }
  // What bounds the answer; "" for --check-batch (no search) and before any result.
  const std::string capped_by = d.result ? d.result->search.capped_by : "";
  std::string out;
  const auto line = [&out](const char* name, const std::string& word) {
    out += fmt::format("{}={}\n", name, word);
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
      buckets += fmt::format("{}{}:{}", buckets.empty() ? "" : " ", r.length, r.safe_micro_batch);
    }
    line("AUTOBATCH_LENGTH", std::to_string(d.sweep->longest_trainable_length));
    line("AUTOBATCH_BUCKETS", shellWord(buckets, true));
  }
  return out;
}

namespace {

namespace fs = std::filesystem;

std::string errnoText(int error) { return std::strerror(error); }

// Where a report for `path` goes: a symbolic link's target (a rename would replace the link).
fs::path reportTarget(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    fs::path resolved = fs::canonical(path, ec);
    if (!ec) return resolved;
  }
  return path;
}

fs::path folderOf(const fs::path& target) {
  return target.parent_path().empty() ? fs::path(".") : target.parent_path();
}

// A temporary file next to `target` (same folder, so the rename cannot cross file systems); its
// descriptor, or -1 with errno set. `name` receives its path.
int temporaryNextTo(const fs::path& target, std::string& name) {
  name = (folderOf(target) / ("." + target.filename().string() + ".autobatch-XXXXXX")).string();
  return mkostemp(name.data(), O_CLOEXEC);
}

}  // namespace

void checkReportPath(const std::string& flag, const std::string& path,
                     const std::vector<std::string>& inputs) {
  if (path.empty()) {
    throw Error(flag + ": expected a file path (or - for standard output), but got an empty path");
  }
  if (path == "-") return;
  const std::string what = flag + " '" + path + "'";
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) {
    throw Error(what + ": expected a file to write the report to, but it is a directory; name a " +
                "file in it, e.g. " + (fs::path(path) / "report.json").string());
  }
  if (fs::exists(status)) {
    for (const auto& input : inputs) {
      if (!input.empty() && fs::equivalent(path, input, ec)) {
        throw Error(what + ": expected a file other than the run's input, but it is the model '" +
                    input + "' itself; the report would replace it");
      }
    }
    // Opened without O_TRUNC: the check writes nothing.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && !(fs::is_fifo(status) && errno == ENXIO)) {  // a FIFO with no reader yet
      throw Error(what + ": expected a file that can be written, but it cannot be opened for " +
                  "writing (" + errnoText(errno) + ")");
    }
    if (fd >= 0) ::close(fd);
    if (!fs::is_regular_file(status)) return;  // written in place
  }
  const fs::path target = reportTarget(path);
  const fs::path folder = folderOf(target);
  if (!fs::is_directory(folder, ec)) {
    throw Error(what + ": expected a path in an existing folder, but '" + folder.string() + "' " +
                (fs::exists(folder, ec) ? "is not a folder" : "does not exist"));
  }
  std::string probe;
  const int fd = temporaryNextTo(target, probe);
  if (fd < 0) {
    throw Error(what + ": expected a folder where the report can be created, but '" +
                folder.string() + "' refuses a new file (" + errnoText(errno) + ")");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string writeReportTo(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoText(errno);
    done += static_cast<std::size_t>(n);
  }
  return "";
}

std::string writeReportFile(const std::string& path, const std::string& text) {
  const fs::path target = reportTarget(path);
  struct stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  if (exists && !S_ISREG(existing.st_mode)) {  // a device or a pipe: no file to replace
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errnoText(errno);
    std::string why = writeReportTo(fd, text);
    if (::close(fd) != 0 && why.empty()) why = errnoText(errno);
    return why;
  }
  std::string temporary;
  const int fd = temporaryNextTo(target, temporary);
  if (fd < 0) return errnoText(errno);
  mode_t mode = existing.st_mode & 07777;
  if (!exists) {
    // The umask cannot be read without setting it; no other thread creates files at this point.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  std::string why = writeReportTo(fd, text);
  if (why.empty() && ::fchmod(fd, mode) != 0) why = errnoText(errno);
  if (why.empty() && ::fsync(fd) != 0) why = errnoText(errno);
  if (::close(fd) != 0 && why.empty()) why = errnoText(errno);
  if (why.empty() && ::rename(temporary.c_str(), target.c_str()) != 0) why = errnoText(errno);
  if (!why.empty()) ::unlink(temporary.c_str());
  return why;
}

}  // namespace autobatch
