"""Result, Plan and Trial: the JSON report of the search (docs/report.md) as Python objects.
`Result.raw` is the whole dict, with the schema the `autobatch` command writes with --json."""
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import List, Optional


class RunLengths(Sequence):
    """A sequence given as runs of equal values [(value, count), ...]: a plan's micro-batches
    and loss weights without listing them (a target of 2^40 samples at micro-batch 2 has 2^39
    of them; issue 40 row 5). Indexing, len, iteration and equality as a list's."""

    def __init__(self, runs):
        self.runs = [(v, int(n)) for v, n in runs if int(n) > 0]
        self._len = sum(n for _, n in self.runs)

    def __len__(self):
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("RunLengths index out of range")
        for v, n in self.runs:
            if i < n:
                return v
            i -= n
        raise IndexError("RunLengths index out of range")  # not reached

    def __iter__(self):
        for v, n in self.runs:
            for _ in range(n):
                yield v

    def __eq__(self, other):
        if isinstance(other, RunLengths):
            return self.runs == other.runs
        return isinstance(other, Sequence) and len(other) == self._len and list(self) == list(other)

    def __repr__(self):
        if self._len <= 16:
            return repr(list(self))
        return "RunLengths(" + ", ".join(f"{v!r} x {n}" for v, n in self.runs) + ")"


@dataclass(frozen=True)
class Plan:
    """One accumulation plan: `micro_batches` (samples, per optimizer step on one rank) sum to
    `per_rank_batch`; `loss_weights[i]` = micro_batches[i] / per_rank_batch (scale each
    micro-batch's mean loss by it so the accumulated gradient is the mean over the effective
    batch); `effective_batch` = per_rank_batch x world_size, the target. `groups`: the plan as
    runs of equal micro-batches [(micro_batch, count, loss_weight), ...]; `micro_batches` and
    `loss_weights` are sequences over them (RunLengths), never a list of every step, so plans of
    any size are held."""

    kind: str  # "uniform" (equal micro-batches) or "balanced" (fewest steps, sizes differ by <= 1)
    micro_batch_size: int  # the largest micro-batch, samples
    accumulation_steps: int
    micro_batches: Sequence
    loss_weights: Sequence
    world_size: int
    per_rank_batch: int
    effective_batch: int
    groups: tuple = ()

    @classmethod
    def from_json(cls, p):
        groups = tuple((g["micro_batch_size"], g["count"], g["loss_weight"]) for g in p["groups"])
        return cls(p["kind"], p["micro_batch_size"], p["accumulation_steps"],
                   RunLengths((b, n) for b, n, _ in groups),
                   RunLengths((w, n) for _, n, w in groups), p["world_size"], p["per_rank_batch"],
                   p["effective_batch"], groups)

    def __str__(self):
        if len(self.groups) > 1:
            # The report's own form, which adds up: "1 x 84 + 2 x 83" (a review of stop 55: "84+2
            # x 83 x 3 accumulation steps" read as arithmetic that did not make the target)
            sizes = " + ".join(f"{n} x {b}" for b, n, _ in self.groups)
            return (f"{self.kind} plan: micro-batches {sizes} ({self.accumulation_steps} "
                    f"accumulation steps) x {self.world_size} rank(s) = {self.effective_batch}")
        return (f"{self.kind} plan: micro-batch {self.micro_batch_size} x "
                f"{self.accumulation_steps} accumulation steps x {self.world_size} rank(s) = "
                f"{self.effective_batch}")


@dataclass(frozen=True)
class Trial:
    """One trial: `micro_batch_size` samples x `micro_batches_per_step`; `outcome` "fits",
    "out-of-memory" or "size-limit"; peaks in bytes; `phase_peaks` {phase: bytes} (largest over
    micro-batches); `failed_phase` and `failed_in_use_bytes` for an out-of-memory trial."""

    micro_batch_size: int
    micro_batches_per_step: int
    outcome: str
    peak_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_phase: str
    phase_peaks: dict
    failed_phase: str
    failed_in_use_bytes: int
    failed_request_bytes: int
    step_ms: float
    reason: str
    cancelled: bool
    eval: bool = False  # an evaluation trial (find(eval=...)): 2 batches, no optimizer step
    steps_completed: int = 0  # whole optimizer steps run (a stopped or failed trial: fewer)
    # A shortened measuring trial (docs/search.md "Measuring trials"): one step after the
    # optimizer's state was made; never the answer.
    shortened: bool = False
    # A shortened trial's out of memory that the probe showed to be the full trial's (docs/search.md
    # "When a shortened failure stands"): no full trial repeated it.
    stands_for_full: bool = False

    @classmethod
    def from_json(cls, t):
        phases = {}
        for p in t.get("phase_peaks", []):
            phases[p["phase"]] = max(phases.get(p["phase"], 0), p["peak_allocated_bytes"])
        return cls(t["micro_batch_size"], t["micro_batches_per_step"], t["outcome"], t["peak_bytes"],
                   t["peak_allocated_bytes"], t["peak_reserved_bytes"], t.get("peak_phase", ""),
                   phases, t.get("failed_phase", ""), t.get("failed_in_use_bytes", 0),
                   t.get("failed_request_bytes", 0), t.get("step_ms", 0.0), t.get("reason", ""),
                   t.get("cancelled", False), bool(t.get("eval", False)),
                   int(t.get("steps_completed", 0)), bool(t.get("shortened", False)),
                   bool(t.get("stands_for_full", False)))


@dataclass
class Result:
    """What autobatch.find measured. Batch sizes are micro-batch sizes in samples.

    status: "found", "nothing-fits", "trial-budget", "time-budget" or "cancelled".
    max_micro_batch: the largest micro-batch seen to fit (raw, no headroom); 0 when none.
    safe_micro_batch: the largest seen to fit with its peak under the limit less the margin.
    plan: the primary accumulation plan for target_batch (None without a target); plans: both.
    trials: every trial in the order run. memory: the model's own bytes (parameters, gradients,
    optimizer state, baseline). fingerprint: the hash of the model's structure and the options.
    raw: the JSON report as a dict; text: the human report; env: the shell lines (AUTOBATCH_*).
    eval_max_batch, eval_safe_batch: with find(eval=True / "only"), the largest evaluation batch
    seen to fit (raw) and under the margin; 0 without eval= or when none fits. eval: the JSON
    report's "eval" section (state, training_batch, state_fits, resident_bytes, ...), {} without.
    cache: with find(cache=...), the JSON report's "cache" section (outcome "hit", "miss" or
    "confirm-failed", key, fields, stored_at, ...; docs/python.md), {} without.
    """

    status: str
    max_micro_batch: int
    safe_micro_batch: int
    memory_limit_bytes: int
    margin_bytes: int
    capped_by: str
    plan: Optional[Plan]
    plans: dict
    plan_verified: bool
    trials: List[Trial]
    memory: dict
    fingerprint: str
    warnings: List[str]
    raw: dict = field(repr=False)
    text: str = field(repr=False)
    env: str = field(repr=False)
    eval_max_batch: int = 0
    eval_safe_batch: int = 0
    eval: dict = field(default_factory=dict, repr=False)
    cache: dict = field(default_factory=dict, repr=False)

    @property
    def micro_batch(self) -> int:
        """The micro-batch to train with: the safe one (under the margin)."""
        return self.safe_micro_batch

    @property
    def accumulation_steps(self) -> int:
        """The primary plan's accumulation steps (1 without a target)."""
        return self.plan.accumulation_steps if self.plan else 1

    @classmethod
    def from_report(cls, doc, text, env, fingerprint):
        r = doc.get("result") or {}
        plans_doc = doc.get("plans")
        plans, plan = {}, None
        if plans_doc:
            for kind in ("uniform", "balanced"):
                if plans_doc.get(kind):
                    plans[kind] = Plan.from_json(plans_doc[kind])
            plan = plans.get(plans_doc.get("primary"))
        return cls(status=r.get("search_status", doc.get("status", "")),
                   max_micro_batch=r.get("max_micro_batch", 0),
                   safe_micro_batch=r.get("safe_micro_batch", 0),
                   memory_limit_bytes=r.get("memory_limit_bytes", 0),
                   margin_bytes=r.get("margin_bytes", 0), capped_by=r.get("capped_by", ""),
                   plan=plan, plans=plans, plan_verified=bool(plans_doc and plans_doc.get("verified")),
                   trials=[Trial.from_json(t) for t in doc.get("trials", [])],
                   memory=doc.get("model") or {}, fingerprint=fingerprint,
                   warnings=list(doc.get("warnings", [])), raw=doc, text=text, env=env,
                   eval_max_batch=r.get("eval_max_batch", 0),
                   eval_safe_batch=r.get("eval_safe_batch", 0), eval=doc.get("eval") or {},
                   cache=doc.get("cache") or {})

    def __str__(self):
        return self.text


@dataclass
class EvalCheck:
    """What check_eval_batch measured: `fits` (the evaluation trial ran to its end, raw),
    `fits_with_margin` (and its peak is under the limit less the margin), `state_fits` (False:
    the training state itself does not fit; no evaluation batch ran, `trial` is then the training
    step); `trial` the evaluation trial (2 batches of `eval_batch`); `training_step` the training
    step that made the state; `resident_bytes` held with the state; raw/text/env the report."""

    eval_batch: int
    fits: bool
    fits_with_margin: bool
    state_fits: bool
    margin_bytes: int
    resident_bytes: int
    trial: Trial
    training_step: Optional[Trial]
    raw: dict = field(repr=False)
    text: str = field(repr=False)
    env: str = field(repr=False)

    @classmethod
    def from_report(cls, doc, text, env, eval_batch):
        check, e = doc.get("check") or {}, doc.get("eval") or {}
        trials = doc.get("trials") or []
        step = e.get("training_step")
        return cls(eval_batch, bool(check.get("fits")), bool(check.get("fits_with_margin")),
                   bool(e.get("state_fits")), check.get("margin_bytes", 0),
                   e.get("resident_bytes", 0), Trial.from_json(trials[-1]),
                   Trial.from_json(step) if step else None, doc, text, env)

    def __str__(self):
        return self.text
