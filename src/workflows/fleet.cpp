// The fleet table (autobatch/workflows/fleet.h): one search per memory size, largest first, trials
// shared.
#include "autobatch/workflows/fleet.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ranges>
#include <set>
#include <utility>

#include "autobatch/probes/trial_runner.h"
#include "autobatch/search/search.h"
#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "run/workflow_budget.h"

namespace autobatch {
namespace {

// The largest micro-batch whose peak the fits put at or under `budget`: linear between the
// largest fit under it and the smallest fit above it, else along the last two fits' slope;
// nullopt with fewer than two fits or no growth.
std::optional<std::int64_t> predictedBoundary(std::vector<const TrialResult*> fits,
                                              std::int64_t budget) {
  std::sort(fits.begin(), fits.end(), [](const TrialResult* a, const TrialResult* b) {
    return a->request.micro_batch_size < b->request.micro_batch_size;
  });
  const TrialResult* below = nullptr;
  const TrialResult* above = nullptr;
  for (const TrialResult* t : fits) {
    if (t->peak_bytes <= budget) below = t;
    if (t->peak_bytes > budget && above == nullptr && below != nullptr &&
        t->request.micro_batch_size > below->request.micro_batch_size) {
      above = t;
    }
  }
  if (below == nullptr) return std::nullopt;
  const TrialResult* a = below;
  const TrialResult* b = above;
  if (b == nullptr) {  // extrapolate from the last two fits
    if (fits.size() < 2) return std::nullopt;
    a = fits[fits.size() - 2];
    b = fits.back();
  }
  const auto dx = static_cast<double>(b->request.micro_batch_size - a->request.micro_batch_size);
  const auto dy = static_cast<double>(b->peak_bytes - a->peak_bytes);
  if (dx <= 0.0 || dy <= 0.0) return std::nullopt;
  const double x = static_cast<double>(a->request.micro_batch_size) +
                   static_cast<double>(budget - a->peak_bytes) * dx / dy;
  if (x < 1.0 || x > 1e15) return std::nullopt;
  return static_cast<std::int64_t>(x);
}

// The trials run on the device so far, under any size: what smaller sizes may reuse.
class TrialBank {
 public:
  // A trial of `request` run under a limit >= `limit` that answers it under `limit` (file
  // comment of autobatch/workflows/fleet.h), as a result under `limit`; nullopt when none does.
  std::optional<TrialResult> answer(const TrialRequest& request, std::int64_t limit,
                                    std::int64_t slack) const {
    for (std::size_t i = trials_.size(); i-- > 0;) {  // the latest first
      const TrialResult& t = trials_[i];
      if (t.cancelled || t.memory_limit_bytes < limit ||
          t.request.micro_batch_size != request.micro_batch_size ||
          t.request.micro_batches_per_step != request.micro_batches_per_step) {
        continue;
      }
      const bool fits = t.outcome == TrialOutcome::kFits;
      if (fits && t.peak_bytes + slack > limit) continue;  // runs: not taken as a failure
      TrialResult reused = t;
      reused.request = request;
      reused.memory_limit_bytes = limit;
      reused.classification_rerun = nullptr;  // listed once, with the trial that ran it
      return reused;
    }
    return std::nullopt;
  }

  // The next size's seeds (SearchOptions::seed_batches, tried in order): the micro-batches
  // whose trials answer under `limit` without running (fits ascending, then the smallest
  // failure), then the boundary the fits' peaks predict for `limit` and the batch after it (two
  // real trials, which close the maximum's bracket when the prediction is exact).
  std::vector<std::int64_t> seeds(std::int64_t limit, std::int64_t slack, int per_step) const {
    std::vector<const TrialResult*> fits;  // transferable or not: all measured peaks
    std::vector<std::int64_t> out;
    std::optional<std::int64_t> smallest_failure;
    for (const auto& t : trials_) {
      if (t.request.micro_batches_per_step != per_step) continue;
      if (t.outcome == TrialOutcome::kFits) {
        fits.push_back(&t);
        if (t.peak_bytes + slack <= limit) out.push_back(t.request.micro_batch_size);
      } else if (!smallest_failure || t.request.micro_batch_size < *smallest_failure) {
        smallest_failure = t.request.micro_batch_size;
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    if (smallest_failure) out.push_back(*smallest_failure);
    if (const auto b = predictedBoundary(fits, limit - slack)) {
      out.push_back(*b);
      out.push_back(*b + 1);
    }
    return out;
  }

  void add(const TrialResult& t) {
    if (!t.cancelled) trials_.push_back(t);
  }

  bool empty() const { return trials_.empty(); }

 private:
  std::vector<TrialResult> trials_;
};

// One size's search: reused trials answered from the bank, the others run and banked.
struct SizeSearch {
  SearchResult search;
  int run = 0;
  int reused = 0;
  std::set<std::pair<std::int64_t, int>> reused_requests;
};

SizeSearch searchSize(const FleetTarget& target, const SearchOptions& o, TrialBank& bank,
                      bool reuse) {
  SizeSearch out;
  const Probe probe = [&](const TrialRequest& request) {
    if (reuse) {
      if (auto prior =
              bank.answer(request, target.trial_limit_bytes, target.transfer_slack_bytes)) {
        ++out.reused;
        out.reused_requests.insert({request.micro_batch_size, request.micro_batches_per_step});
        spdlog::info("batch {} x {}: {} under a larger size, so {} here (reused, not run)",
                     request.micro_batch_size, request.micro_batches_per_step,
                     toString(prior->outcome), toString(prior->outcome));
        return *prior;
      }
    }
    TrialResult t = target.probe(request);
    ++out.run;
    bank.add(t);
    return t;
  };
  out.search = findMaxBatch(probe, o);
  return out;
}

// The fitting trial the safe micro-batch rests on, if it was reused: then it runs once more.
bool safeRestsOnReuse(const SizeSearch& s) {
  const SearchResult& r = s.search;
  if (r.safe_micro_batch <= 0) return false;
  // True unless a trial of this size's own saw it fit.
  return std::none_of(r.trials.begin(), r.trials.end(), [&](const TrialResult& t) {
    return t.request.micro_batch_size == r.safe_micro_batch && t.outcome == TrialOutcome::kFits &&
           !s.reused_requests.contains(
               {t.request.micro_batch_size, t.request.micro_batches_per_step});
  });
}

FleetRow rowOf(const FleetSize& size, const SizeSearch& s) {
  const SearchResult& r = s.search;
  FleetRow row;
  row.name = size.name;
  row.bytes = size.bytes;
  row.source = size.source;
  row.status = std::string(toString(r.status));
  row.max_micro_batch = r.max_micro_batch;
  row.safe_micro_batch = r.safe_micro_batch;
  for (const auto& t : r.trials) {
    if (t.request.micro_batch_size == r.safe_micro_batch && t.outcome == TrialOutcome::kFits &&
        !t.cancelled) {
      row.binding_phase = peakPhase(t);
    }
  }
  row.plan = r.plan;
  row.min_batch_needs_at_least_bytes = r.min_batch_needs_at_least_bytes;
  row.trials_run = s.run;
  row.trials_reused = s.reused;
  row.elapsed_s = r.elapsed_s;
  return row;
}

// Runs the confirming trial of a safe micro-batch that rests on a reused trial; true when it
// fits under the margin. The trial joins the search's list.
bool confirm(const FleetTarget& target, SizeSearch& s, const SearchOptions& o, TrialBank& bank) {
  TrialRequest request;
  request.micro_batch_size = s.search.safe_micro_batch;
  request.micro_batches_per_step = o.micro_batches_per_step;
  request.cancel = o.cancel;
  if (o.before_trial) o.before_trial(request);
  TrialResult t = target.probe(request);
  if (o.on_trial) o.on_trial(t);
  ++s.run;
  bank.add(t);
  s.search.trials.push_back(t);
  const std::int64_t margin = marginBytes(o, t.memory_limit_bytes);
  return t.outcome == TrialOutcome::kFits && !t.cancelled &&
         t.peak_bytes <= t.memory_limit_bytes - margin;
}

FleetRow notMeasurable(const FleetSize& size, std::int64_t largest) {
  FleetRow row;
  row.name = size.name;
  row.bytes = size.bytes;
  row.source = size.source;
  row.status = "not-measurable";
  row.note = fmt::format(
      "above what this device can emulate: the largest measurable size is {} ({} bytes); run "
      "the table on a device with at least {} to measure it",
      formatBytes(largest), largest, formatBytes(size.bytes));
  return row;
}

// The options of one size's search: its limit, the runner's units, what is left of the time
// budget, and the seed a larger size's fits give.
SearchOptions sizeOptions(const SearchOptions& options, const FleetSize& size,
                          const FleetTarget& target, const TrialBank& bank, double time_left_s) {
  SearchOptions o = options;
  o.memory_limit_bytes = size.bytes;
  o.micro_batches_per_step = target.micro_batches_per_step;
  o.allocation_units = target.allocation_units;
  o.time_limit_s = time_left_s;
  if (!bank.empty()) {  // the first size keeps the caller's seeds
    o.seed_batches = bank.seeds(target.trial_limit_bytes, target.transfer_slack_bytes,
                                target.micro_batches_per_step);
  }
  return o;
}

// Searches one measurable size (and again without reuse when its confirming trial fails).
FleetRow searchOneSize(const FleetSize& size, const FleetTarget& target, const SearchOptions& o,
                       TrialBank& bank, std::optional<SearchResult>& search) {
  SizeSearch s = searchSize(target, o, bank, true);
  bool verified = s.search.safe_micro_batch > 0 && !safeRestsOnReuse(s);
  std::string note;
  if (s.search.safe_micro_batch > 0 && !verified) {
    verified = confirm(target, s, o, bank);
    if (!verified) {
      spdlog::warn(
          "{}: micro-batch {} (from reused trials) did not fit under this size's own "
          "limit; searching this size again without reuse",
          size.name, s.search.safe_micro_batch);
      note = "searched again without reused trials: the reused answer did not fit here";
      const int first_run = s.run;
      s = searchSize(target, o, bank, false);
      s.run += first_run;
      verified = s.search.safe_micro_batch > 0;
    }
  }
  FleetRow row = rowOf(size, s);
  row.verified = verified;
  row.note = note;
  search = std::move(s.search);
  return row;
}

}  // namespace

FleetResult sizeFleet(const std::vector<FleetSize>& sizes, const SearchOptions& options,
                      const FleetTargetFactory& make_target) {
  if (sizes.empty()) throw Error("--fleet: expected at least one size");
  std::vector<FleetSize> order = sizes;
  std::stable_sort(order.begin(), order.end(),
                   [](const FleetSize& a, const FleetSize& b) { return a.bytes > b.bytes; });
  FleetResult out;
  TrialBank bank;
  const auto start = Clock::now();
  std::int64_t measurable_up_to = 0;  // known once a size was clipped
  for (const auto& size : order) {
    if (options.cancel && options.cancel()) break;
    if (measurable_up_to > 0 && size.bytes > measurable_up_to) {
      out.fleet.rows.push_back(notMeasurable(size, measurable_up_to));
      continue;
    }
    spdlog::info("fleet: size {} ({})", size.name, formatBytes(size.bytes));
    std::optional<FleetTarget> target;
    try {
      target = make_target(size.bytes);
    } catch (const c10::OutOfMemoryError& e) {
      FleetRow row;
      row.name = size.name;
      row.bytes = size.bytes;
      row.source = size.source;
      row.status = "nothing-fits";
      row.note =
          std::string("the model does not fit before any trial: ") + e.what_without_backtrace();
      out.fleet.rows.push_back(std::move(row));
      continue;
    }
    const std::int64_t limit = target->trial_limit_bytes + options.reserve_bytes;
    if (!target->measurable) {
      measurable_up_to = limit;
      out.fleet.rows.push_back(notMeasurable(size, measurable_up_to));
      continue;
    }
    if (out.fleet.largest_measurable_bytes == 0) out.fleet.largest_measurable_bytes = size.bytes;
    const SearchOptions o =
        sizeOptions(options, size, *target, bank, timeLeftS(options.time_limit_s, start));
    std::optional<SearchResult> search;
    out.fleet.rows.push_back(searchOneSize(size, *target, o, bank, search));
    out.fleet.trials_run += out.fleet.rows.back().trials_run;
    if (!out.pick) {
      MaxBatchResult pick;
      pick.search = std::move(*search);
      if (target->add_facts) target->add_facts(pick);
      out.pick = std::move(pick);
    }
  }
  if (measurable_up_to > 0 && out.fleet.largest_measurable_bytes == 0) {
    out.fleet.largest_measurable_bytes = measurable_up_to;
  }
  return out;
}

FleetResult sizeFleet(const std::vector<FleetSize>& sizes, const TrainingSpec& spec,
                      const SearchOptions& options) {
  std::string note;
  const FleetTargetFactory make = [&](std::int64_t limit_bytes) {
    SearchOptions o = options;
    o.memory_limit_bytes = limit_bytes;
    auto runner = std::make_shared<TrialRunner>(spec, o);
    FleetTarget t;
    t.probe = runner->probe();
    t.trial_limit_bytes = runner->memoryLimitBytes();
    t.measurable = runner->memoryLimitBytes() + options.reserve_bytes >= limit_bytes;
    t.micro_batches_per_step = runner->microBatchesPerTrial();
    t.allocation_units = runner->allocatorInfo().allocation_units;
    const bool cuda = runner->backendName().rfind("cuda", 0) == 0;
    t.transfer_slack_bytes = cuda ? kCudaCachingAllocatorUnits.page_bytes : 0;
    if (cuda && note.empty()) {
      note = fmt::format(
          "another card's CUDA context and library workspaces may differ from this {}'s: its "
          "memory outside the allocator measured {} here",
          runner->device(), formatBytes(runner->outsideBytes()));
    }
    t.add_facts = [runner](MaxBatchResult& r) {
      const MaxBatchResult facts = runnerFacts(*runner);
      r.memory = facts.memory;
      r.context = facts.context;
    };
    t.owner = runner;
    return t;
  };
  FleetResult result = sizeFleet(sizes, options, make);
  // GPU names measured on another device: the rows are those cards' memory sizes on this
  // device's kernels, not the cards' answers (a CPU run printed an "l4" row as if for the card).
  const bool gpu_names = std::any_of(sizes.begin(), sizes.end(),
                                     [](const FleetSize& s) { return s.source != "given"; });
  const bool on_cuda = spec.device.rfind("cuda", 0) == 0;
  if (gpu_names && !on_cuda) {
    note = "the GPU names' rows were measured on " + spec.device +
           ", not on those cards: each row is the card's memory size under this device's "
           "kernels and allocator (no cuDNN or cuBLAS workspaces, other attention kernels, no "
           "caching allocator's rounding), so it sizes nothing for the card itself; run the "
           "table on a GPU, whose rows then emulate the others" +
           (note.empty() ? "" : "; " + note);
  }
  result.fleet.note = note;
  return result;
}

}  // namespace autobatch
