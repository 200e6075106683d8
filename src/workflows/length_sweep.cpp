#include "autobatch/workflows/length_sweep.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/run/bucket_mix.h"
#include "autobatch/run/ranks.h"
#include "autobatch/search/replan.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/failure.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/units.h"
#include "run/workflow_budget.h"

namespace autobatch {
namespace {

std::vector<InputSpec> inputsAtLength(const std::vector<std::string>& texts, std::int64_t length) {
  std::vector<InputSpec> inputs;
  for (const auto& text : texts) {
    for (auto& spec : parseInputSpecsAtLength(text, length)) inputs.push_back(std::move(spec));
  }
  return inputs;
}

// A length's row from its search.
SweepRow sweepRowOf(std::int64_t length, std::int64_t tokens_per_sample, const LengthRun& run) {
  const SearchResult& r = run.result.search;
  SweepRow row;
  row.length = length;
  row.tokens_per_sample = tokens_per_sample;
  row.status = std::string(toString(r.status));
  row.max_micro_batch = r.max_micro_batch;
  row.safe_micro_batch = r.safe_micro_batch;
  row.tokens_per_micro_batch = r.safe_micro_batch * tokens_per_sample;
  for (const auto& t : r.trials) {
    if (t.request.micro_batch_size == r.safe_micro_batch && t.outcome == TrialOutcome::kFits &&
        !t.cancelled) {
      row.binding_phase = peakPhase(t);
    }
  }
  row.trials = static_cast<int>(r.trials.size());
  row.elapsed_s = r.elapsed_s;
  row.target_batch = run.options.target_batch;
  row.plan = r.plan;
  row.min_batch_needs_at_least_bytes = r.min_batch_needs_at_least_bytes;
  if (run.cache) row.cache_outcome = run.cache->outcome;
  if (const auto& eval = run.result.eval) {
    row.eval_status = eval->state_fits ? std::string(toString(eval->search.status))
                                       : std::string("state-does-not-fit");
    row.eval_max_batch = eval->search.max_micro_batch;
    row.eval_safe_batch = eval->search.safe_micro_batch;
    row.eval_trials = static_cast<int>(eval->search.trials.size());
  }
  return row;
}

// The search of one length, with the cache when there is one.
void searchOne(LengthRun& run, const LengthSweepOptions& sweep) {
  if (sweep.cache) {
    CachedSearchResult cached = findMaxBatchCached(run.spec, run.options, *sweep.cache);
    run.result = std::move(cached.result);
    run.cache = std::move(cached.cache);
  } else if (sweep.eval) {
    run.result = findMaxBatchAndEval(run.spec, run.options, *sweep.eval);
  } else {
    run.result = findMaxBatch(run.spec, run.options);
  }
}

// Searches one length. A model error at this length (a position table shorter than the length, a
// reshape that needs another length) becomes the row's error and nullopt, so that the other
// lengths are still searched; what no length can get past (bad input, ranks, the model not
// fitting before any trial, a fatal device error) propagates.
std::optional<LengthRun> searchLength(LengthRun run, const LengthSweepOptions& sweep,
                                      SweepRow& row) {
  // The trial in progress, to name its batch in an error it raises.
  std::optional<TrialRequest> running;
  const auto before = run.options.before_trial;
  const auto after = run.options.on_trial;
  run.options.before_trial = [&running, before](const TrialRequest& r) {
    running = r;
    if (before) before(r);
  };
  run.options.on_trial = [&running, after](const TrialResult& t) {
    running.reset();
    if (after) after(t);
  };
  try {
    searchOne(run, sweep);
    row = sweepRowOf(row.length, row.tokens_per_sample, run);
    run.options.before_trial = before;
    run.options.on_trial = after;
    return run;
  } catch (const Error&) {
    throw;
  } catch (const RankError&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& e) {
    if (isFatalDeviceError(std::current_exception())) throw;
    row.status = "error";
    row.error = withoutBacktrace(e.what());
    if (running) {
      row.error += fmt::format(" (raised in the training step at micro-batch {} x {} per step)",
                               running->micro_batch_size, running->micro_batches_per_step);
    }
    spdlog::error("length {}: the model raised an error; the row says so and the sweep goes on: {}",
                  row.length, row.error);
    return std::nullopt;
  }
}

// The buckets of a sweep run mixed in one trial (autobatch/run/bucket_mix.h), on a runner made for
// `longest` (the longest length that fits). Micro-batches per step: 2 when a bucket's plan
// accumulates (as the job will run it), else the runner's.
MixVerification verifyMix(const std::vector<Bucket>& buckets, const LengthRun& longest,
                          const std::vector<std::string>& input_texts, bool accumulates) {
  TrialRunner runner(longest.spec, longest.options);
  const int micro_batches = accumulates ? 2 : runner.microBatchesPerTrial();
  // A mixed trial passes only under the limit less the margin, as every answer of the search.
  const std::int64_t margin = marginBytes(longest.options, runner.memoryLimitBytes());
  const CancelHook& cancel = longest.options.cancel;
  const MixedProbe probe = [&](const std::vector<Bucket>& steps) {
    std::vector<MixedStep> mixed;
    std::string order;
    for (const auto& b : steps) {
      mixed.push_back({b.micro_batch_size, inputsAtLength(input_texts, b.length)});
      order += fmt::format("{}{}:{}", order.empty() ? "" : " ", b.length, b.micro_batch_size);
    }
    spdlog::info(
        "mixed verification: one trial of {} steps (length:micro-batch {}), {} "
        "micro-batch{} per step",
        steps.size(), order, micro_batches, micro_batches == 1 ? "" : "es");
    TrialResult r = runner.runMixed(mixed, micro_batches, cancel);
    if (r.outcome != TrialOutcome::kFits) {
      spdlog::warn("mixed verification: step {} (length {}) failed: {}", r.failed_step_index,
                   steps.at(static_cast<std::size_t>(r.failed_step_index)).length, r.reason);
    } else if (!r.cancelled && r.peak_bytes > r.memory_limit_bytes - margin) {
      spdlog::warn(
          "mixed verification: the trial fit, but its peak {} is above the limit less "
          "the margin {}: not verified",
          formatBytes(r.peak_bytes), formatBytes(r.memory_limit_bytes - margin));
    }
    return r;
  };
  return verifyBucketMix(buckets, probe, margin, 6, cancel);
}

// The micro-batch a length's bucket trains with: its plan's bound when it has a plan, else its
// safe micro-batch.
std::int64_t bucketBatch(const SearchResult& search) {
  return search.plan ? search.plan_max_micro_batch : search.safe_micro_batch;
}

// The buckets of the rows that fit, run mixed; a bucket the mix lowers or drops lowers its row.
void verifySweepMix(SweepReport& sweep, std::vector<std::optional<LengthRun>>& runs,
                    const LengthSweepOptions& options) {
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_rows;
  bool accumulates = false;
  for (std::size_t i = 0; i < sweep.rows.size(); ++i) {
    if (!runs[i]) continue;  // an error row
    const SearchResult& search = runs[i]->result.search;
    if (sweep.rows[i].safe_micro_batch > 0 && bucketBatch(search) > 0) {
      Bucket bucket{sweep.rows[i].length, bucketBatch(search)};
      for (const auto& t : search.trials) {
        if (t.outcome == TrialOutcome::kFits &&
            t.request.micro_batch_size == bucket.micro_batch_size) {
          bucket.alone_peak_bytes = std::max(bucket.alone_peak_bytes, t.peak_bytes);
        }
      }
      buckets.push_back(bucket);
      bucket_rows.push_back(i);
      accumulates = accumulates || (search.plan && search.plan->primary().accumulation_steps > 1);
    }
  }
  if (buckets.empty() || cancelled(runs[bucket_rows.front()]->options)) return;
  sweep.mixed = buckets.size() >= 2 ? verifyMix(buckets, *runs[bucket_rows.front()],
                                                options.input_texts, accumulates)
                                    : MixVerification{};
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const std::int64_t from = buckets[k].micro_batch_size;
    const std::int64_t to =
        sweep.mixed->buckets.empty() ? from : sweep.mixed->buckets[k].micro_batch_size;
    if (to == from) continue;
    LengthRun& run = *runs[bucket_rows[k]];
    lowerSweepRow(sweep.rows[bucket_rows[k]], run.result.search, from, to, run.options);
  }
}

void checkSweep(const LengthSweepOptions& sweep) {
  if (sweep.lengths.empty()) {
    throw Error("length sweep: expected at least one length, but got none");
  }
  if (tokensPerSample(sweep.input_texts, sweep.lengths.back()) <= 0) {
    throw Error(
        "length sweep: expected an input with the length placeholder L (e.g. "
        "'int64:L:<32000'), but no input names L");
  }
  if (sweep.eval && *sweep.eval != EvalState::kTrainingResident) {
    throw Error(
        "length sweep: expected the evaluation with the training state resident (--eval), but "
        "got the parameters-only state (--eval-only); sweep the lengths with --eval");
  }
  if (sweep.eval && sweep.cache) {
    throw Error(
        "length sweep: expected no result cache with an evaluation search (the cache holds "
        "training answers only), but got both; leave out --cache");
  }
}

// The answer: the first length that fits (the longest), else the last searched; the error when
// no length trains and some raised.
void pickAnswer(LengthSweepResult& out, std::vector<std::optional<LengthRun>>& runs,
                double time_limit_s) {
  std::string errors;
  std::optional<std::size_t> pick;
  for (std::size_t i = 0; i < out.sweep.rows.size(); ++i) {
    const SweepRow& row = out.sweep.rows[i];
    if (row.status == "error") errors += fmt::format("; length {}: {}", row.length, row.error);
    if (runs[i] && (!pick || runs[*pick]->result.search.safe_micro_batch <= 0)) pick = i;
    if (out.sweep.longest_trainable_length == 0 && row.safe_micro_batch > 0) {
      out.sweep.longest_trainable_length = row.length;
    }
  }
  if (pick) {
    out.pick = std::move(runs[*pick]);
    out.pick->options.time_limit_s = time_limit_s;  // the sweep's, not what was left
  }
  if (out.sweep.longest_trainable_length == 0 && !errors.empty()) {
    out.error =
        "no length of the sweep trains, and the model raised an error at " + errors.substr(2);
  }
}

}  // namespace

void lowerSweepRow(SweepRow& row, SearchResult& search, std::int64_t from, std::int64_t to,
                   const SearchOptions& options) {
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
  std::optional<PlanBound> bound;
  if (search.plan)
    bound = PlanBound{std::min(search.plan_max_micro_batch, to), search.plan_verified};
  replan(search, safe, bound, options);
  if (safe <= 0) {
    row.status = "fails-mixed";
    row.plan.reset();
  } else if (bound && options.target_batch > 0) {
    row.plan = search.plan;
  }
}

LengthSweepResult sweepLengths(const TrainingSpec& spec, const SearchOptions& options,
                               const LengthSweepOptions& sweep) {
  checkSweep(sweep);
  LengthSweepResult out;
  out.sweep.target_tokens = sweep.target_tokens;
  std::vector<std::optional<LengthRun>> runs;
  std::int64_t prev_length = 0;
  std::int64_t prev_tokens = 0;  // tokens per sample at prev_length
  std::int64_t prev_max = 0;
  const int world = options.world_size;
  const auto start = Clock::now();
  for (const std::int64_t length : sweep.lengths) {
    if (cancelled(options)) break;
    LengthRun run{spec, options, {}, std::nullopt};
    run.spec.inputs = inputsAtLength(sweep.input_texts, length);
    run.options.time_limit_s = timeLeftS(options.time_limit_s, start);
    SweepRow row;
    row.length = length;
    row.tokens_per_sample = tokensPerSample(sweep.input_texts, length);
    if (sweep.target_tokens > 0) {
      run.options.target_batch = sweep.target_tokens / row.tokens_per_sample / world * world;
    }
    if (prev_max > 0) {
      run.options.seed_batches = {prev_max, prev_max * prev_tokens / row.tokens_per_sample};
    }
    spdlog::info("length {}: searching{}", length,
                 prev_max > 0
                     ? fmt::format(" from batch {} (fits at length {})", prev_max, prev_length)
                     : std::string());
    row.target_batch = run.options.target_batch;
    runs.push_back(searchLength(std::move(run), sweep, row));
    out.sweep.rows.push_back(row);
    if (sweep.on_row) sweep.on_row(row);
    if (row.max_micro_batch > 0) {
      prev_length = length;
      prev_tokens = row.tokens_per_sample;
      prev_max = row.max_micro_batch;
    }
  }
  verifySweepMix(out.sweep, runs, sweep);
  pickAnswer(out, runs, options.time_limit_s);
  return out;
}

}  // namespace autobatch
