"""Result, Plan and Trial: the JSON report of the search (docs/report.md) as Python objects.
`Result.raw` is the whole dict, with the schema the `autobatch` command writes with --json."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple


class RunLengths(Sequence):
    """A sequence given as runs of equal values [(value, count), ...]: a plan's micro-batches
    and loss weights without listing them (a target of 2^40 samples at micro-batch 2 has 2^39
    of them; issue 40 row 5). Indexing, len, iteration and equality as a list's.

    Attributes:
        runs (list[tuple[Any, int]]): the runs, [(value, count), ...], counts >= 1.

    Examples:
        >>> steps = autobatch.plan(1, 2**40).micro_batches
        >>> len(steps), steps[0], steps.runs
        (1099511627776, 1, [(1, 1099511627776)])
    """

    def __init__(self, runs: Iterable[Tuple[Any, int]]) -> None:
        """Takes the runs as (value, count) pairs; runs of count 0 are dropped."""
        self.runs = [(v, int(n)) for v, n in runs if int(n) > 0]
        self._len = sum(n for _, n in self.runs)

    def __len__(self) -> int:
        """The number of values (the sum of the counts)."""
        return self._len

    def __getitem__(self, i: Any) -> Any:
        """The value at index `i` (negative from the end), or a list for a slice.

        Raises:
            IndexError: `i` is out of range.
        """
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

    def __iter__(self) -> Iterator[Any]:
        """Each value in order, each run's value `count` times (lazily)."""
        for v, n in self.runs:
            for _ in range(n):
                yield v

    def __eq__(self, other: object) -> bool:
        """Equal to another RunLengths with the same runs, or to a sequence of the same values."""
        if isinstance(other, RunLengths):
            return self.runs == other.runs
        return isinstance(other, Sequence) and len(other) == self._len and list(self) == list(other)

    def __repr__(self) -> str:
        """The list of values up to 16 of them, else the runs: "RunLengths(value x count, ...)"."""
        if self._len <= 16:
            return repr(list(self))
        return "RunLengths(" + ", ".join(f"{v!r} x {n}" for v, n in self.runs) + ")"


@dataclass(frozen=True)
class Plan:
    """One gradient accumulation plan for a target (effective) batch.

    `micro_batches` (samples, per optimizer step on one rank) sum to `per_rank_batch`;
    `loss_weights[i]` = micro_batches[i] / per_rank_batch (scale each micro-batch's mean loss by
    it so the accumulated gradient is the mean over the effective batch); `effective_batch` =
    per_rank_batch x world_size, the target. `groups`: the plan as runs of equal micro-batches
    [(micro_batch, count, loss_weight), ...]; `micro_batches` and `loss_weights` are sequences
    over them (RunLengths), never a list of every step, so plans of any size are held. Made by
    autobatch.plan() and found in Result.plan / Result.plans; the JSON report's "plans" entries
    (docs/report.md).

    Attributes:
        kind (str): "uniform" (equal micro-batches) or "balanced" (fewest steps, sizes differ by
            at most 1 sample).
        micro_batch_size (int): the largest micro-batch, samples.
        accumulation_steps (int): micro-batches per optimizer step on one rank.
        micro_batches (Sequence[int]): each micro-batch's size in samples, in order.
        loss_weights (Sequence[float]): each micro-batch's loss weight, in order.
        world_size (int): the ranks (data-parallel processes) that share the effective batch.
        per_rank_batch (int): samples per optimizer step on one rank.
        effective_batch (int): samples per optimizer step over all ranks (the target).
        groups (tuple): runs of equal micro-batches, (micro_batch, count, loss_weight) each.

    Examples:
        >>> p = autobatch.plan(max_micro_batch=184, target_batch=256)
        >>> str(p)
        'uniform plan: micro-batch 128 x 2 accumulation steps x 1 rank(s) = 256'
        >>> for size, count, weight in p.groups:
        ...     ...  # `count` micro-batches of `size` samples, each loss scaled by `weight`
    """

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
    def from_json(cls, p: dict) -> Plan:
        """The Plan of one entry of the JSON report's "plans" section (docs/report.md).

        Args:
            p (dict): the entry: kind, micro_batch_size, accumulation_steps, world_size,
                per_rank_batch, effective_batch and groups [{micro_batch_size, count,
                loss_weight}, ...].

        Returns:
            Plan: the plan, its micro-batches and loss weights as RunLengths over the groups.

        Raises:
            KeyError: a field is missing.
        """
        groups = tuple((g["micro_batch_size"], g["count"], g["loss_weight"]) for g in p["groups"])
        return cls(
            p["kind"],
            p["micro_batch_size"],
            p["accumulation_steps"],
            RunLengths((b, n) for b, n, _ in groups),
            RunLengths((w, n) for _, n, w in groups),
            p["world_size"],
            p["per_rank_batch"],
            p["effective_batch"],
            groups,
        )

    def __str__(self) -> str:
        """One line, as the text report writes the plan (micro-batches x steps x ranks = target)."""
        if len(self.groups) > 1:
            # The report's own form, which adds up: "1 x 84 + 2 x 83" ("84+2 x 83 x 3
            # accumulation steps" reads as arithmetic that does not make the target)
            sizes = " + ".join(f"{n} x {b}" for b, n, _ in self.groups)
            return (
                f"{self.kind} plan: micro-batches {sizes} ({self.accumulation_steps} "
                f"accumulation steps) x {self.world_size} rank(s) = {self.effective_batch}"
            )
        return (
            f"{self.kind} plan: micro-batch {self.micro_batch_size} x "
            f"{self.accumulation_steps} accumulation steps x {self.world_size} rank(s) = "
            f"{self.effective_batch}"
        )


@dataclass(frozen=True)
class Trial:
    """One trial: `micro_batches_per_step` micro-batches of `micro_batch_size` samples per step.

    The JSON report's "trials" entries (docs/report.md) as an object; check_batch() returns one,
    Result.trials holds the search's in the order run.

    Attributes:
        micro_batch_size (int): samples per micro-batch.
        micro_batches_per_step (int): micro-batches accumulated before each optimizer step.
        outcome (str): "fits", "out-of-memory" or "size-limit" (the model refused the size).
        peak_bytes (int): the trial's peak, bytes: the figure compared with the limit (for an
            out-of-memory trial a lower bound).
        peak_allocated_bytes (int): the peak of bytes allocated to tensors.
        peak_reserved_bytes (int): the peak of bytes reserved by the allocator (CUDA's caching
            allocator holds more than its tensors).
        peak_phase (str): the phase where the peak was ("forward", "backward", ...; "" if none).
        phase_peaks (dict[str, int]): {phase: peak allocated bytes}, the largest over the
            micro-batches and steps.
        failed_phase (str): the phase an out-of-memory trial failed in ("" otherwise).
        failed_in_use_bytes (int): bytes in use when the failing allocation was refused.
        failed_request_bytes (int): bytes the refused allocation asked for.
        step_ms (float): milliseconds per optimizer step (0.0 when no step completed).
        reason (str): the failure's words ("" for a fit).
        cancelled (bool): stopped by Ctrl-C or a deadline before its end.
        eval (bool): an evaluation trial (find(eval=...)): 2 batches, no optimizer step.
        steps_completed (int): whole optimizer steps run (a stopped or failed trial: fewer).
        shortened (bool): a shortened measuring trial (docs/search.md "Measuring trials"); never
            the answer.
        stands_for_full (bool): a shortened trial's out of memory shown to be the full trial's.

    Examples:
        >>> t = autobatch.check_batch(model, batch, 256, memory_limit="8GiB")
        >>> t.outcome, t.peak_bytes, t.phase_peaks.get("backward")
    """

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
    def from_json(cls, t: dict) -> Trial:
        """The Trial of one entry of the JSON report's "trials" (or a trial record of the probe).

        Args:
            t (dict): the entry; micro_batch_size, micro_batches_per_step, outcome and the peaks
                are required, the other fields default to empty.

        Returns:
            Trial: the trial, `phase_peaks` the largest allocated bytes per phase name.

        Raises:
            KeyError: a required field is missing.
        """
        phases: dict = {}
        for p in t.get("phase_peaks", []):
            phases[p["phase"]] = max(phases.get(p["phase"], 0), p["peak_allocated_bytes"])
        return cls(
            t["micro_batch_size"],
            t["micro_batches_per_step"],
            t["outcome"],
            t["peak_bytes"],
            t["peak_allocated_bytes"],
            t["peak_reserved_bytes"],
            t.get("peak_phase", ""),
            phases,
            t.get("failed_phase", ""),
            t.get("failed_in_use_bytes", 0),
            t.get("failed_request_bytes", 0),
            t.get("step_ms", 0.0),
            t.get("reason", ""),
            t.get("cancelled", False),
            bool(t.get("eval", False)),
            int(t.get("steps_completed", 0)),
            bool(t.get("shortened", False)),
            bool(t.get("stands_for_full", False)),
        )


@dataclass
class Result:
    """What autobatch.find measured: the JSON report (docs/report.md) as an object.

    Batch sizes are micro-batch sizes in samples, memory in bytes. `str(result)` is the human
    report, as the `autobatch` command prints it.

    Attributes:
        status (str): "found", "trial-budget" or "time-budget" from a successful find();
            "nothing-fits" and "cancelled" are seen on the `.result` of DoesNotFit / Cancelled.
        max_micro_batch (int): the largest micro-batch seen to fit (raw, no headroom); 0 when
            none.
        safe_micro_batch (int): the largest seen to fit with its peak under the limit less the
            margin (also `micro_batch`).
        memory_limit_bytes (int): the memory limit the trials ran under, bytes.
        margin_bytes (int): the margin (headroom) in bytes.
        capped_by (str): what bounded the answer: "memory", "max-batch", "dataset-size",
            "size-limit", or the "trial-budget", "time-budget" or "cancelled" that stopped the
            search first (docs/report.md).
        plan (Plan | None): the primary accumulation plan for target_batch (None without a
            target).
        plans (dict[str, Plan]): both plans by kind ("uniform", "balanced").
        plan_verified (bool): the plan's largest micro-batch fit with 2 micro-batches per step.
        trials (list[Trial]): every trial in the order run.
        memory (dict): the model's own bytes (parameter_bytes, gradient_bytes,
            optimizer_state_bytes, baseline_bytes, held_outside_model_bytes, ...).
        fingerprint (str): SHA-1 (hex) of the model's structure, its step and the options.
        warnings (list[str]): what the report warns about (memory held outside the model, an
            enclosing autocast, ...).
        raw (dict): the JSON report as a dict (`autobatch --json`'s schema).
        text (str): the human report.
        env (str): the shell lines (AUTOBATCH_MICRO_BATCHES=..., as `autobatch --env`).
        eval_max_batch (int): with find(eval=True / "only"), the largest evaluation batch seen
            to fit (raw); 0 without eval= or when none fits.
        eval_safe_batch (int): the same under the margin.
        eval (dict): the JSON report's "eval" section (state, training_batch, state_fits,
            resident_bytes, ...); {} without eval=.
        cache (dict): with find(cache=...), the JSON report's "cache" section (outcome "hit",
            "miss" or "confirm-failed", key, fields, stored_at, ...; docs/python.md); {} without.
        data (dict): with a DataLoader in place of the example batch, how the trial batches were
            made (docs/data.md): collation ("stacks" or "concatenates"), samples_scanned, scope
            ("the epoch", or the first N batches of an IterableDataset), binding_shape (each
            tensor's shape for the costliest sample collated alone), dataset_size,
            sampler_batches (the loader's own batch_sampler: batches, largest_samples,
            costliest_samples, costliest_shape), scan_seconds; {} without.
        soak (SoakResult | None): with find(soak_steps=N), the soak of the answer
            (autobatch.soak's result, docs/soak.md); None without.

    Examples:
        >>> result = autobatch.find(model, batch, memory_limit="8GiB", target_batch=512)
        >>> result.safe_micro_batch, result.plan.accumulation_steps
        >>> [(t.micro_batch_size, t.outcome) for t in result.trials]
        >>> print(result)  # the text report
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
    data: dict = field(default_factory=dict, repr=False)
    soak: Any = field(default=None, repr=False)

    @property
    def micro_batch(self) -> int:
        """The micro-batch to train with, samples: the primary plan's (its largest, checked with
        two micro-batches accumulated) when there is a plan, else the safe one (under the margin).
        With a plan the safe micro-batch can be too large for an accumulating step (the gradients
        it keeps between micro-batches), so it pairs with `accumulation_steps` only this way."""
        return self.plan.micro_batch_size if self.plan else self.safe_micro_batch

    @property
    def accumulation_steps(self) -> int:
        """The primary plan's accumulation steps (1 without a target)."""
        return self.plan.accumulation_steps if self.plan else 1

    @classmethod
    def from_report(cls, doc: dict, text: str, env: str, fingerprint: str) -> Result:
        """The Result of one JSON report (as the library renders it).

        Args:
            doc (dict): the JSON report (docs/report.md).
            text (str): the human report.
            env (str): the shell lines.
            fingerprint (str): the fingerprint of the model and the options.

        Returns:
            Result: the report as an object; absent fields are 0, "" or empty.
        """
        r = doc.get("result") or {}
        plans_doc = doc.get("plans")
        plans, plan = {}, None
        if plans_doc:
            for kind in ("uniform", "balanced"):
                if plans_doc.get(kind):
                    plans[kind] = Plan.from_json(plans_doc[kind])
            plan = plans.get(plans_doc.get("primary"))
        return cls(
            status=r.get("search_status", doc.get("status", "")),
            max_micro_batch=r.get("max_micro_batch", 0),
            safe_micro_batch=r.get("safe_micro_batch", 0),
            memory_limit_bytes=r.get("memory_limit_bytes", 0),
            margin_bytes=r.get("margin_bytes", 0),
            capped_by=r.get("capped_by", ""),
            plan=plan,
            plans=plans,
            plan_verified=bool(plans_doc and plans_doc.get("verified")),
            trials=[Trial.from_json(t) for t in doc.get("trials", [])],
            memory=doc.get("model") or {},
            fingerprint=fingerprint,
            warnings=list(doc.get("warnings", [])),
            raw=doc,
            text=text,
            env=env,
            eval_max_batch=r.get("eval_max_batch", 0),
            eval_safe_batch=r.get("eval_safe_batch", 0),
            eval=doc.get("eval") or {},
            cache=doc.get("cache") or {},
        )

    def __str__(self) -> str:
        """The human report, as the `autobatch` command prints it."""
        return self.text


@dataclass
class EvalCheck:
    """What check_eval_batch measured: one evaluation batch with the training state resident.

    `str(check)` is the human report, as `autobatch --check-eval-batch` prints it.

    Attributes:
        eval_batch (int): the evaluation batch checked, samples.
        fits (bool): the evaluation trial ran to its end (raw, no headroom).
        fits_with_margin (bool): it fits and its peak is under the limit less the margin.
        state_fits (bool): False when the training state itself does not fit: no evaluation
            batch ran, and `trial` is then the training step.
        margin_bytes (int): the margin (headroom), bytes.
        resident_bytes (int): bytes held with the training state (parameters, optimizer state,
            gradients with zero_grad="zeros", DDP's buckets).
        trial (Trial): the evaluation trial (2 batches of `eval_batch`).
        training_step (Trial | None): the training step that made the state (None when none
            ran).
        raw (dict): the JSON report (`autobatch --check-eval-batch --json`'s schema).
        text (str): the human report.
        env (str): the shell lines.

    Examples:
        >>> check = autobatch.check_eval_batch(model, batch, 512, memory_limit="8GiB")
        >>> check.state_fits, check.fits, check.fits_with_margin
    """

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
    def from_report(cls, doc: dict, text: str, env: str, eval_batch: int) -> EvalCheck:
        """The EvalCheck of one `--check-eval-batch` JSON report.

        Args:
            doc (dict): the JSON report, with its "check", "eval" and "trials" sections.
            text (str): the human report.
            env (str): the shell lines.
            eval_batch (int): the evaluation batch checked, samples.

        Returns:
            EvalCheck: the check; `trial` is the report's last trial.

        Raises:
            IndexError: the report has no trial.
        """
        check, e = doc.get("check") or {}, doc.get("eval") or {}
        trials = doc.get("trials") or []
        step = e.get("training_step")
        return cls(
            eval_batch,
            bool(check.get("fits")),
            bool(check.get("fits_with_margin")),
            bool(e.get("state_fits")),
            check.get("margin_bytes", 0),
            e.get("resident_bytes", 0),
            Trial.from_json(trials[-1]),
            Trial.from_json(step) if step else None,
            doc,
            text,
            env,
        )

    def __str__(self) -> str:
        """The human report, as `autobatch --check-eval-batch` prints it."""
        return self.text
