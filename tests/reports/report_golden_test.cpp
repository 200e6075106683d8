// Golden outputs of the report (autobatch/reports/report.h, issue 28 item 1): ReportData fixtures
// built in code, one per kind of run, whose humanReport, toJson and envLines must stay byte for
// byte what tests/golden/report/<case>.txt / .json / .env hold. They pin today's output so that a
// restructured report (sections in their own functions and files) cannot change a line unseen.
//
// Update mode: AUTOBATCH_UPDATE_GOLDEN=1 build/tests/report_golden_test rewrites the files instead
// of comparing (tests/golden/README.md); review `git diff tests/golden` and say in the commit why
// a line changed.
//
// Every value is fixed in the fixtures: no clock, no path of this machine, no version of this
// build (BuildInfo is a fixture too, "9.9.9-golden"), so nothing is normalised here.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "autobatch/reports/report.h"
#include "autobatch/search/planner.h"
#include "autobatch/vocabulary/input_spec.h"
#include "support/golden.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace report_golden_test {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * kKiB;
constexpr std::int64_t kGiB = 1024 * kMiB;

BuildInfo goldenBuild() {
  BuildInfo b;
  b.autobatch_version = "9.9.9-golden";
  b.libtorch_version = "9.9.9";
  b.cuda_build = true;
  b.cuda_version = "12.8";
  b.cuda_driver_version = 12080;
  b.cuda_devices = {{0, "NVIDIA Golden 80GB", 80 * kGiB, 9, 0},
                    {1, "NVIDIA Golden 80GB", 80 * kGiB, 9, 0}};
  return b;
}

// A run of `model` on `device` with inputs `inputs` (cross-entropy), everything else default.
ReportData baseData(const std::string& device, const std::string& inputs, std::int64_t limit,
                    const std::string& limit_source) {
  ReportData d;
  d.status = "found";
  d.build = goldenBuild();
  d.spec.model_path = "models/golden.pt";
  d.spec.inputs = parseInputSpecs(inputs);
  d.spec.loss = LossKind::kCrossEntropy;
  d.spec.device = device;
  d.model_sha1 = "0123456789abcdef0123456789abcdef01234567";
  d.model_file_bytes = 4 * kMiB + 123;
  RunContext c;
  c.device = device;
  c.backend = device == "cpu" ? "cpu-budget" : "cuda-caching";
  c.memory_limit_bytes = limit;
  c.memory_limit_source = limit_source;
  c.inputs = d.spec.inputs;
  c.loss = LossKind::kCrossEntropy;
  MemoryBreakdown m;
  m.parameter_count = 1'048'576 + 2'570;
  m.parameter_bytes = m.parameter_count * 4;
  m.gradient_bytes = m.parameter_bytes;
  m.optimizer_state_bytes = 2 * m.parameter_bytes;
  m.baseline_bytes = m.parameter_bytes + 4096;
  m.optimizer_impl = device == "cpu" ? "loop" : "foreach";
  d.result.emplace();
  d.result->context = c;
  d.result->memory = m;
  return d;
}

// A trial at `batch` x `micro` that ended with `outcome`, peaking at `peak` bytes allocated (2 MiB
// more reserved, 1 MiB more outside the allocator), with the phases of each micro-batch.
TrialResult trial(std::int64_t batch, int micro, TrialOutcome outcome, std::int64_t peak,
                  std::int64_t limit) {
  TrialResult t;
  t.request.micro_batch_size = batch;
  t.request.micro_batches_per_step = micro;
  t.outcome = outcome;
  t.peak_allocated_bytes = peak;
  t.peak_reserved_bytes = peak + 2 * kMiB;
  t.peak_bytes = peak + 3 * kMiB;
  t.memory_limit_bytes = limit;
  t.output_bytes = batch * 10 * 4;
  t.phase_peaks = {{"inputs", 0, peak / 8},
                   {"forward", 0, peak / 2},
                   {"loss", 0, peak / 2 + 40 * batch},
                   {"backward", 0, peak},
                   {"optimizer-step", 0, peak * 3 / 4}};
  if (micro == 2) t.phase_peaks.push_back({"forward", 1, peak - 1});
  if (outcome == TrialOutcome::kFits) {
    t.step_ms = 10.0 + 0.25 * static_cast<double>(batch);
    t.steps_completed = 2;
  } else {
    t.reason =
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 12.00 MiB is free.";
    t.failed_request_bytes = 20 * kMiB;
    t.failed_phase = "backward";
    t.failed_in_use_bytes = peak - kMiB;
    t.phase_peaks.pop_back();  // the step never ran
  }
  return t;
}

void check(const std::string& name, const ReportData& d) {
  SCOPED_TRACE(name);
  testing::expectGolden("report/" + name + ".txt", humanReport(d));
  testing::expectGolden("report/" + name + ".json", toJson(d));
  testing::expectGolden("report/" + name + ".env", envLines(d));
}

// A search on cuda:0 that found 280 under the margin (300 raw), with plans for a target of 1030
// over 2 ranks (uniform 5 x 103 and balanced 258 + 257 differ; balanced is primary), verified
// with 2 micro-batches per step; warnings, the affine fit, DDP buckets and outside growth.
ReportData foundWithPlans() {
  const std::int64_t limit = kGiB;
  ReportData d = baseData("cuda:0", "3x32x32", limit, "cudaMemGetInfo: 1.00 GiB of 79.19 GiB free");
  d.spec.ddp = true;
  d.options.target_batch = 1030;
  d.options.world_size = 2;
  RunContext& c = d.result->context;
  c.allocator.config = "expandable_segments:True";
  c.allocator.pytorch_alloc_conf = "expandable_segments:True";
  c.allocator.config_env = "PYTORCH_ALLOC_CONF";
  c.allocator.expandable_segments = true;
  c.allocator.fraction = 0.0125;
  c.warnings = {"the limit is below the device's free memory"};
  MemoryBreakdown& m = d.result->memory;
  m.outside_bytes = 512 * kMiB;
  m.outside_growth_bytes = 2 * kMiB;
  m.ddp_bucket_bytes = m.gradient_bytes;
  SearchResult& s = d.result->search;
  s.trials = {trial(1, 1, TrialOutcome::kFits, 40 * kMiB, limit),
              trial(2, 1, TrialOutcome::kFits, 42 * kMiB, limit),
              trial(400, 1, TrialOutcome::kOutOfMemory, 1000 * kMiB, limit),
              trial(300, 1, TrialOutcome::kFits, 975 * kMiB, limit),
              trial(280, 1, TrialOutcome::kFits, 850 * kMiB, limit),
              trial(280, 2, TrialOutcome::kFits, 860 * kMiB, limit)};
  s.trials[0].outside_growth_bytes = 2 * kMiB;
  s.max_micro_batch = 300;
  s.safe_micro_batch = 280;
  s.memory_limit_bytes = limit;
  s.margin_bytes = marginBytes(d.options, limit);
  s.fit = {38.0 * static_cast<double>(kMiB), 2.83 * static_cast<double>(kMiB), 4};
  s.predicted_peak_bytes = s.fit.predictBytes(300);
  s.measured_peak_bytes = s.trials[3].peak_bytes;
  s.plan = planAccumulation(280, 1030, 2, d.options.plan);
  s.plan->uniform.predicted_samples_per_second = 1234.5;
  s.plan_max_micro_batch = 280;
  s.plan_verified = true;
  s.capped_by = "memory";
  s.fastest_micro_batch = 280;
  s.elapsed_s = 12.34;
  s.warnings = {"batch 300 fit with a peak above the limit less the margin"};
  return d;
}

// Catches a restructured humanReport that reorders or drops the plans section, the affine fit,
// the warnings or the DDP/outside lines; a JSON whose plans, fit or device keys move; env lines
// that plan on the raw maximum instead of the primary plan.
TEST(ReportGoldenTest, FoundWithPlans) { check("found_plans", foundWithPlans()); }

// Nothing fits on the CPU at 64 KiB: batch 1 runs out of memory in backward and the model's own
// parameters, gradients and optimizer state exceed the limit.
TEST(ReportGoldenTest, NothingFits) {
  ReportData d = baseData("cpu", "64", 64 * kKiB, "--memory-limit");
  d.status = "nothing-fits";
  d.exit_code = 3;
  d.options.memory_limit_bytes = 64 * kKiB;
  SearchResult& s = d.result->search;
  s.status = SearchStatus::kNothingFits;
  TrialResult t = trial(1, 1, TrialOutcome::kOutOfMemory, 60 * kKiB, 64 * kKiB);
  t.reason = "CPU budget: 64.0 KiB limit, 60.0 KiB in use, asked for 4.0 MiB";
  t.failed_request_bytes = 4 * kMiB;
  t.peak_reserved_bytes = t.peak_allocated_bytes;
  t.peak_bytes = t.peak_allocated_bytes;
  s.trials = {t};
  s.memory_limit_bytes = 64 * kKiB;
  s.margin_bytes = marginBytes(d.options, 64 * kKiB);
  s.min_batch_needs_at_least_bytes = t.peak_bytes + t.failed_request_bytes;
  s.capped_by = "memory";
  s.elapsed_s = 0.25;
  // Catches a lost "the model itself needs" paragraph, or one that names the wrong remedy.
  check("nothing_fits", d);
}

// Batch 1 fits, but only above the limit less the margin: max 1, safe 0, nothing fits.
TEST(ReportGoldenTest, NothingFitsUnderTheMargin) {
  ReportData d = baseData("cpu", "64", 32 * kMiB, "--memory-limit");
  d.status = "nothing-fits";
  d.exit_code = 3;
  d.options.memory_limit_bytes = 32 * kMiB;
  d.options.target_batch = 64;
  SearchResult& s = d.result->search;
  s.status = SearchStatus::kNothingFits;
  TrialResult t = trial(1, 1, TrialOutcome::kFits, 31 * kMiB, 32 * kMiB);
  t.peak_bytes = 31 * kMiB + 512 * kKiB;
  s.trials = {t};
  s.max_micro_batch = 1;
  s.memory_limit_bytes = 32 * kMiB;
  s.margin_bytes = marginBytes(d.options, 32 * kMiB);
  s.min_batch_needs_at_least_bytes = t.peak_bytes;
  s.capped_by = "memory";
  s.elapsed_s = 0.5;
  // Catches "fits, >margin" lost from the trial table, and env lines whose maximum is 0 while the
  // JSON's is 1 (issue 27, row 9).
  check("nothing_fits_margin", d);
}

// A sweep of five lengths (--lengths 4096,2048,1024,512,128, --target-tokens 131072): 4096
// nothing fits, 2048 and 512 lowered by the mixed verification, 128 left out of the mix.
SweepReport sweep(std::int64_t limit, std::int64_t margin) {
  SweepReport sw;
  sw.target_tokens = 131072;
  sw.longest_trainable_length = 2048;
  auto row = [](std::int64_t length, const std::string& status, std::int64_t max,
                std::int64_t safe) {
    SweepRow r;
    r.length = length;
    r.status = status;
    r.max_micro_batch = max;
    r.safe_micro_batch = safe;
    r.tokens_per_sample = length;
    r.tokens_per_micro_batch = safe * length;
    r.binding_phase = safe > 0 ? "backward" : "";
    r.trials = 6;
    r.elapsed_s = 1.5 + static_cast<double>(length) / 1024.0;
    r.target_batch = 131072 / length;
    if (safe > 0) r.plan = planAccumulation(safe, r.target_batch, 1);
    return r;
  };
  sw.rows = {row(4096, "nothing-fits", 0, 0), row(2048, "found", 6, 5), row(1024, "found", 12, 12),
             row(512, "found", 30, 24), row(128, "fails-mixed", 1, 0)};
  sw.rows[0].min_batch_needs_at_least_bytes = limit + 3 * kMiB;
  sw.rows[1].lowered_from = 6;
  sw.rows[3].lowered_from = 30;
  sw.rows[4].lowered_from = 1;
  MixVerification v;
  v.status = "lowered";
  v.margin_bytes = margin;
  auto mixed = [&](std::vector<Bucket> steps, TrialOutcome outcome, std::int64_t peak) {
    MixedTrial t;
    t.steps = std::move(steps);
    t.result = trial(0, 1, outcome, peak, limit);
    t.result.request.micro_batches_per_step = 1;
    t.passed = outcome == TrialOutcome::kFits && t.result.peak_bytes <= limit - margin;
    t.over_margin = outcome == TrialOutcome::kFits && !t.passed;
    return t;
  };
  v.trials = {mixed({{2048, 6, 0}, {128, 1, 0}, {1024, 12, 0}, {512, 30, 0}},
                    TrialOutcome::kOutOfMemory, 950 * kMiB),
              mixed({{2048, 5, 0}, {128, 1, 0}, {1024, 12, 0}, {512, 30, 0}}, TrialOutcome::kFits,
                    kGiB - 20 * kMiB),
              mixed({{2048, 5, 0}, {1024, 12, 0}, {512, 24, 0}}, TrialOutcome::kFits, 700 * kMiB)};
  v.trials[0].failed_length = 2048;
  v.trials[0].result.failed_step_index = 0;
  v.trials[1].failed_length = 512;
  v.lowered = {{2048, 6, 5}, {512, 30, 24}, {128, 1, 0}};
  v.buckets = {{4096, 0, 0}, {2048, 5, 0}, {1024, 12, 0}, {512, 24, 0}, {128, 0, 0}};
  sw.mixed = v;
  return sw;
}

// Catches a sweep table whose columns, plan texts (nothing fits / left out / steps x batch) or
// mixed-verification line change, and AUTOBATCH_BUCKETS listing a length that left the mix.
TEST(ReportGoldenTest, SweepWithALoweredBucket) {
  const std::int64_t limit = kGiB;
  ReportData d = baseData("cuda:0", "int64:2048:<32000", limit, "--memory-limit");
  d.options.memory_limit_bytes = limit;
  d.spec.loss = LossKind::kModel;
  d.result->context.loss = LossKind::kModel;
  SearchResult& s = d.result->search;
  s.trials = {trial(1, 1, TrialOutcome::kFits, 200 * kMiB, limit),
              trial(8, 1, TrialOutcome::kOutOfMemory, 990 * kMiB, limit),
              trial(6, 1, TrialOutcome::kFits, 800 * kMiB, limit)};
  s.max_micro_batch = 6;
  s.safe_micro_batch = 5;
  s.memory_limit_bytes = limit;
  s.margin_bytes = marginBytes(d.options, limit);
  s.plan = planAccumulation(5, 64, 1);
  s.plan_max_micro_batch = 5;
  s.capped_by = "memory";
  s.elapsed_s = 3.5;
  d.sweep = sweep(limit, s.margin_bytes);
  check("sweep_lowered", d);
}

// Rank 1 of 4 (torchrun) after the ranks agreed on rank 2's 48; this rank found 52 alone.
TEST(ReportGoldenTest, RanksAgreed) {
  const std::int64_t limit = 40 * kGiB;
  ReportData d = baseData("cuda:1", "3x224x224", limit, "--memory-limit");
  d.options.memory_limit_bytes = limit;
  d.options.world_size = 4;
  d.options.target_batch = 512;
  RankInfo r;
  r.rank = 1;
  r.world_size = 4;
  r.local_rank = 1;
  r.master_addr = "10.0.0.1";
  r.master_addr_origin = "MASTER_ADDR";
  r.source = "torchrun";
  d.rank = r;
  Agreement a;
  a.safe_micro_batch = 48;
  a.plan_max_micro_batch = 48;
  a.plan_verified = true;
  a.limiting_ranks = {2};
  for (int i = 0; i < 4; ++i) {
    const std::int64_t safe = i == 2 ? 48 : 52;
    RankReport report;
    report.rank = i;
    report.device = "cuda:" + std::to_string(i);
    report.safe_micro_batch = report.plan_max_micro_batch = safe;
    report.plan_verified = true;
    report.memory_limit_bytes = limit;
    a.reports.push_back(report);
  }
  d.agreement = a;
  SearchResult& s = d.result->search;
  s.trials = {trial(1, 1, TrialOutcome::kFits, 2 * kGiB, limit),
              trial(64, 1, TrialOutcome::kOutOfMemory, 39 * kGiB, limit),
              trial(52, 1, TrialOutcome::kFits, 36 * kGiB, limit),
              trial(48, 2, TrialOutcome::kFits, 35 * kGiB, limit)};
  s.max_micro_batch = 52;
  s.safe_micro_batch = 48;
  s.memory_limit_bytes = limit;
  s.margin_bytes = marginBytes(d.options, limit);
  s.plan = planAccumulation(48, 512, 4);
  s.plan_max_micro_batch = 48;
  s.plan_verified = true;
  s.capped_by = "memory";
  s.elapsed_s = 30.0;
  // Catches a ranks section that marks the wrong rank, loses the limiting ranks, or a JSON whose
  // ranks object (agreed, reports) changes shape.
  check("ranks_agreed", d);
}

// A cache hit confirmed by one trial at the cached safe batch; the key's fields are the ones
// cacheKeyFields computes for this run (pinned with it).
TEST(ReportGoldenTest, CacheHit) {
  ReportData d = baseData("cpu", "64", 64 * kMiB, "--memory-limit");
  d.options.memory_limit_bytes = 64 * kMiB;
  SearchResult& s = d.result->search;
  s.trials = {trial(120, 1, TrialOutcome::kFits, 50 * kMiB, 64 * kMiB)};
  s.max_micro_batch = 130;
  s.safe_micro_batch = 120;
  s.memory_limit_bytes = 64 * kMiB;
  s.margin_bytes = marginBytes(d.options, 64 * kMiB);
  s.capped_by = "memory";
  CacheReport c;
  c.dir = "/cache/autobatch/results";
  c.key = cacheKeyFields(d);
  c.key.hash = "fedcba9876543210fedcba9876543210fedcba98";
  c.outcome = "hit";
  c.stored_at = "2026-01-02T03:04:05Z";
  c.cached_trials = 7;
  c.cached_search_s = 41.5;
  d.cache = c;
  // Catches a "cached" line lost or moved out of the result section, and key fields reordered.
  check("cache_hit", d);
}

// --check-batch 32 with --accumulation-steps 4 on the CPU under 64 MiB.
ReportData checkData(TrialOutcome outcome, std::int64_t peak) {
  ReportData d = baseData("cpu", "64", 64 * kMiB, "--memory-limit");
  d.options.memory_limit_bytes = 64 * kMiB;
  d.spec.accumulation_steps = 4;
  CheckResult c;
  c.trial = trial(32, 2, outcome, peak, 64 * kMiB);
  c.fits = outcome == TrialOutcome::kFits;
  c.margin_bytes = marginBytes(d.options, 64 * kMiB);
  c.fits_with_margin = c.fits && c.trial.peak_bytes <= 64 * kMiB - c.margin_bytes;
  c.memory = d.result->memory;
  c.context = d.result->context;
  c.context.micro_batches_per_trial = 2;
  c.context.warnings = {"a context warning"};
  d.result.reset();
  d.status = c.fits_with_margin ? "fits" : "does-not-fit";
  d.exit_code = c.fits_with_margin ? 0 : 3;
  d.check = c;
  return d;
}

// Catches a check line that swaps raw and with-margin, and env lines whose plan is not the
// checked micro-batch x --accumulation-steps.
TEST(ReportGoldenTest, CheckFits) {
  check("check_fits", checkData(TrialOutcome::kFits, 30 * kMiB));
}

TEST(ReportGoldenTest, CheckDoesNotFit) {
  check("check_does_not_fit", checkData(TrialOutcome::kOutOfMemory, 63 * kMiB));
}

// Fits raw, not with the margin: exit 3, AUTOBATCH_MAX_MICRO_BATCH=32, safe 0.
TEST(ReportGoldenTest, CheckFitsOnlyAboveTheMargin) {
  check("check_over_margin", checkData(TrialOutcome::kFits, 58 * kMiB));
}

// A usage error before any trial: no context, the error line only.
TEST(ReportGoldenTest, UsageError) {
  ReportData d;
  d.status = "usage-error";
  d.exit_code = 2;
  d.error = "--precision: expected fp32, fp16, bf16, amp-fp16 or amp-bf16, but got 'fp8'";
  d.build = goldenBuild();
  d.spec.model_path = "models/golden.pt";
  // Catches a report that prints a device line or trials without a context, or drops the error.
  check("usage_error", d);
}

}  // namespace report_golden_test
}  // namespace
}  // namespace autobatch
