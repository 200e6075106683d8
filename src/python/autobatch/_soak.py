"""autobatch.soak: a micro-batch run as the job runs it, many optimizer steps in a row under the
same limit, with what each step leaves held and its peak, so that memory that grows step after
step is measured instead of met hours into the run (issue 67, docs/soak.md).

What a search cannot see: its trials are a few steps each, with everything they made let go in
between, so a step that keeps what it made (a forward hook that appends activations to a list, a
metric that stores its inputs, `loss.backward(retain_graph=True)` with the loss kept) passes every
trial and runs out of memory later. The soak runs the user's own step `steps` times on one
optimizer, reads the meter at the end of each step (the bytes held) and over each step (its peak,
a window of the meter per step), and fits the growth of the held bytes.

The growth rule: the first `WARM_UP_STEPS` steps are left out (what a job makes once as it starts:
a buffer built on first use, a scaler's or a scheduler's state, an optimizer that makes its state
at its second step), and the growth per step is the median of
the differences between consecutive steps' held bytes, its noise band their median absolute
deviation. A median is robust to growth that stops (a cache filled once at step 5 is one
difference among many) where a least-squares slope is not. Growth above its band is a finding:
the step at which the step's peak reaches the limit at that rate, and, given the job's step count,
whether the job lasts.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from . import _core
from ._batches import make_batch
from ._errors import Cancelled, UsageError
from ._leaks import Recorder, baseline_ptrs, finding_lines
from ._loader import consecutive, is_loader, tensors_of
from ._option_checks import _SEARCH_ONLY, _refuse_search_options
from ._options import _INT32_MAX, _count
from ._residue import storage_bytes
from ._session import _Session, _session_of, check_option_names
from ._vocabulary import FITS

# Steps whose held bytes are no evidence of growth: a job's start makes what it makes once (the
# optimizer's state is made inside step 0, before its held bytes are read; lazily built buffers and
# state made at the second step are not).
WARM_UP_STEPS = 2
# The fewest differences after the warm-up from which a growth is fitted (a median of fewer is
# one step's noise).
MIN_FITTED_STEPS = 4


@dataclass
class SoakStep:
    """One optimizer step of a soak (micro-batch x accumulation steps, the user's step).

    Attributes:
        step (int): 0-based index of the step.
        held_bytes (int): the meter's bytes at the end of the step (after zero_grad), as the
            limit counts them (the model, its optimizer state and what the step kept).
        peak_bytes (int): the step's peak, bytes: the tensors' peak over this step alone (on
            CUDA the allocated peak; the CPU budget's count of every CPU tensor).
        peak_reserved_bytes (int): on CUDA the caching allocator's reserved peak of the step
            (equal to peak_bytes on the CPU).
        batch_bytes (int): the bytes of the step's last micro-batch, which the loop still holds
            at the step's end (part of held_bytes; the growth is fitted without it, so that
            batches that grow along a sorted loader are not read as a leak).
        batch_shape (dict[str, list[int]]): the shapes of the step's largest micro-batch, by
            each tensor's path in the batch ("input_ids", "[0]").
        allocator_retries (int): CUDA: the caching allocator's retries in the step (a refused
            request made it free its cached blocks and try again: num_alloc_retries); 0 on the CPU.
        inactive_split_peak_bytes (int): CUDA: the step's peak of inactive split bytes (free
            fragments of split cached blocks, reserved memory only small requests can use);
            0 on the CPU.
    """

    step: int
    held_bytes: int
    peak_bytes: int
    peak_reserved_bytes: int
    batch_bytes: int = 0
    batch_shape: dict = field(default_factory=dict)
    allocator_retries: int = 0
    inactive_split_peak_bytes: int = 0


@dataclass
class SoakResult:
    """What autobatch.soak measured (docs/soak.md).

    Attributes:
        micro_batch (int): samples per micro-batch.
        accumulation_steps (int): micro-batches per optimizer step.
        steps_asked (int): the optimizer steps asked for.
        steps (list[SoakStep]): the steps that ran whole, in order.
        outcome (str): "fits" (every step ran), or "out-of-memory" (step `failed_step` ran out
            of memory under the limit).
        failed_step (int | None): the 0-based step that ran out of memory, None when all ran.
        memory_limit_bytes (int): the limit the steps ran under (less the reserve), bytes.
        growth_bytes_per_step (float): the steady growth of the held bytes per step after the
            warm-up (the median of consecutive differences), 0.0 when fewer steps ran than fit.
        growth_noise_bytes (float): its noise band (median absolute deviation of the
            differences), bytes per step.
        growing (bool): the growth is above its band: memory grows step after step.
        limit_step (int | None): with growth, the 0-based step at which the step's peak reaches
            the limit at that rate (from the last step's peak); None without growth.
        job_steps (int | None): the job's optimizer steps, as given.
        lasts (bool | None): with job_steps, whether the job's last step stays under the limit
            at the measured rate (False when a soaked step ran out of memory); None without
            job_steps, or when too few steps ran to fit a growth.
        lasting_micro_batch (int | None): when the job does not last, the largest micro-batch
            whose job_steps steps stay under the limit, from this soak and a second one at half
            the micro-batch (each step's peak and the growth taken as affine in the
            micro-batch); None when the job lasts, without job_steps, or when nothing lasts.
        start_bytes (int): the meter's bytes before the first step (the model, its state, the
            example, and what the process held).
        steady_peak_bytes (int): the median of the steps' peaks after the warm-up (of all steps
            when fewer ran).
        worst_step (int): the step with the largest peak (-1 when no step ran).
        holders (list[str]): what holds tensors the steps made past the soak (the survivor
            check's warning, _survivors.py: the objects and their bytes), empty when nothing.
        device (str): the device type the steps ran on ("cpu", "cuda").
        fragmentation (dict): on CUDA, the caching allocator's fragmentation at the worst step:
            reserved_minus_allocated_bytes (its reserved peak less its allocated peak),
            inactive_split_peak_bytes, and allocator_retries over all steps; {} on the CPU,
            where the budget allocator has no cache to fragment.
        batches (str): where the steps' batches came from: the example's rows repeated, or the
            loader's batches in its sampler's order, collated in this process.
        leaks (list[dict]): when the steps left tensors alive, what one more instrumented step
            (_leaks.py) found keeps them, the most bytes first: "holder" (a list in the
            closure of a hook, a tensor with its autograd graph, ...), "where" (the user's
            file:line that keeps them), "source" (that line), "tensors", "bytes" (one step's,
            a graph's saved tensors charged to its root), "fix"; empty when nothing survived.
        seconds (float): the soak's own wall time, its steps and their measurement (both soaks
            when a second one ran for lasting_micro_batch).
        soaks (int): the soaks run: 1, or 2 when a second one at half the micro-batch gave
            lasting_micro_batch.
    """

    micro_batch: int
    accumulation_steps: int
    steps_asked: int
    steps: List[SoakStep]
    outcome: str
    failed_step: Optional[int]
    memory_limit_bytes: int
    growth_bytes_per_step: float = 0.0
    growth_noise_bytes: float = 0.0
    growing: bool = False
    limit_step: Optional[int] = None
    job_steps: Optional[int] = None
    lasts: Optional[bool] = None
    lasting_micro_batch: Optional[int] = None
    start_bytes: int = 0
    steady_peak_bytes: int = 0
    worst_step: int = -1
    holders: List[str] = field(default_factory=list)
    device: str = "cpu"
    fragmentation: dict = field(default_factory=dict)
    batches: str = ""
    leaks: List[dict] = field(default_factory=list)
    seconds: float = 0.0
    soaks: int = 1

    def to_dict(self) -> dict:
        """The result as plain JSON-serialisable data (bytes as ints, the steps as dicts)."""
        out = dict(self.__dict__)
        out["steps"] = [dict(s.__dict__) for s in self.steps]
        return out

    def __str__(self) -> str:
        """The soak's report: its steps, the growth and what it means, and its own cost."""
        fmt = _core.format_bytes
        ran = len(self.steps)
        lines = [
            f"soak: micro-batch {self.micro_batch} x {self.accumulation_steps} accumulation "
            f"step(s), {ran} of {self.steps_asked} optimizer steps under "
            f"{fmt(self.memory_limit_bytes)} in {self.seconds:.1f} s (the soak's own steps"
            + (f", with the second soak at {self.micro_batch // 2})" if self.soaks == 2 else ")")
        ]
        if self.failed_step == 0:
            lines.append(
                f"out of memory at step 0: micro-batch {self.micro_batch} does not fit even once "
                f"(the model and its state held {fmt(self.start_bytes)} before it; "
                "autobatch.find gives the largest micro-batch that does)"
            )
        elif self.failed_step is not None:
            lines.append(f"out of memory at step {self.failed_step}")
        if ran:
            worst = self.steps[self.worst_step]
            shapes = worst.batch_shape
            shape = ", ".join(f"{k} {v}" if k != "batch" else str(v) for k, v in shapes.items())
            lines.append(
                f"steady peak {fmt(self.steady_peak_bytes)}; worst step {self.worst_step} "
                f"(peak {fmt(worst.peak_bytes)}{', batch ' + shape if shape else ''}); held "
                f"after the last step {fmt(self.steps[-1].held_bytes)}"
            )
        if self.fragmentation:
            f = self.fragmentation
            lines.append(
                f"fragmentation at the worst step: reserved - allocated "
                f"{fmt(f['reserved_minus_allocated_bytes'])}, inactive split "
                f"{fmt(f['inactive_split_peak_bytes'])}; {f['allocator_retries']} allocator "
                "retries in all steps"
            )
        if self.batches:
            lines.append(f"batches: {self.batches}")
        lines.append(_growth_line(self))
        lines += finding_lines(self.leaks)
        lines += [f"kept past the soak: {h}" for h in self.holders]
        return "\n".join(lines)


def _fitted(r: SoakResult) -> bool:
    """Whether enough steps ran for a growth to be fitted (fit_growth)."""
    return len(r.steps) - WARM_UP_STEPS - 1 >= MIN_FITTED_STEPS


def _growth_line(r: SoakResult) -> str:
    fmt = _core.format_bytes
    if not _fitted(r):
        return (
            f"growth: not fitted ({len(r.steps)} steps ran; at least "
            f"{WARM_UP_STEPS + MIN_FITTED_STEPS + 1} are needed)"
        )
    rate = (
        f"{fmt(round(r.growth_bytes_per_step))} per step (noise {fmt(round(r.growth_noise_bytes))})"
    )
    if not r.growing:
        return f"growth: none seen in {len(r.steps)} steps ({rate})"
    text = f"growth: {rate}: at this rate the limit is reached at step {r.limit_step}"
    if r.lasts is not None:
        text += f"; the job's {r.job_steps} steps {'last' if r.lasts else 'do not last'}"
    if r.lasting_micro_batch:
        text += (
            f"; the largest micro-batch that lasts them is {r.lasting_micro_batch} (from soaks at "
            f"{r.micro_batch} and {r.micro_batch // 2})"
        )
    elif r.lasts is False:
        text += "; no micro-batch lasts them at these rates"
    return text


def fit_growth(held: List[int]) -> tuple:
    """(growth per step, noise band) of the bytes held at the end of each step, bytes: the median
    of the consecutive differences after WARM_UP_STEPS steps, and their median absolute deviation.
    (0.0, 0.0) when fewer than MIN_FITTED_STEPS differences remain."""
    diffs = [b - a for a, b in zip(held[WARM_UP_STEPS:], held[WARM_UP_STEPS + 1 :])]
    if len(diffs) < MIN_FITTED_STEPS:
        return 0.0, 0.0
    slope = float(statistics.median(diffs))
    return slope, float(statistics.median(abs(d - slope) for d in diffs))


def _analyse(r: SoakResult) -> None:
    """The growth, the limit step, the steady and worst peaks of `r` (in place)."""
    peaks = [s.peak_bytes for s in r.steps]
    if peaks:
        r.worst_step = max(range(len(peaks)), key=peaks.__getitem__)
        steady = peaks[WARM_UP_STEPS:] or peaks
        r.steady_peak_bytes = int(statistics.median(steady))
        if r.device == "cuda":
            worst = r.steps[r.worst_step]
            r.fragmentation = {
                "reserved_minus_allocated_bytes": worst.peak_reserved_bytes - worst.peak_bytes,
                "inactive_split_peak_bytes": worst.inactive_split_peak_bytes,
                "allocator_retries": sum(s.allocator_retries for s in r.steps),
            }
    r.growth_bytes_per_step, r.growth_noise_bytes = fit_growth(
        [s.held_bytes - s.batch_bytes for s in r.steps]
    )
    r.growing = r.growth_bytes_per_step > max(r.growth_noise_bytes, 0.0)
    if r.growing:
        last = r.steps[-1]
        room = r.memory_limit_bytes - last.peak_bytes
        r.limit_step = last.step + max(1, math.floor(room / r.growth_bytes_per_step) + 1)
    if r.job_steps is None:
        return
    if r.failed_step is not None:
        r.lasts = r.failed_step >= r.job_steps
    elif r.growing:
        r.lasts = r.limit_step >= r.job_steps
    elif len(r.steps) >= r.job_steps or _fitted(r):
        r.lasts = True  # measured: no growth in a fit, or the job's every step ran


class _StepRecorder:
    """What the trial's step loop reports after each optimizer step (_trial.EagerProbe._run_steps
    calls a residue's first/later there, the batch still held as a loop holds it until the next
    one is made): each step's window of the meter is closed (its peak), the bytes held read,
    and the next step's window opened."""

    def __init__(self, meter, rows):
        self.meter, self.rows = meter, rows
        self.made = []  # (bytes, elements, shapes) of each micro-batch made in this step

    def batches(self, make, skip):
        """A probe's batches(size, device) that makes each batch with `make` and notes its
        bytes (its storages but those in `skip`: the example's, passed unchanged) and shapes."""

        def made(size, device):
            batch = make(size, device)
            shapes = {p: list(t.shape) for p, t in tensors_of(batch)}
            elements = sum(math.prod(v) for v in shapes.values())
            self.made.append((storage_bytes(batch, skip), elements, shapes))
            return batch

        return made

    def begin(self):
        """Nothing before the first step: the trial opened its window."""

    def replaced(self, freed_bytes, own_bytes):
        """A later step's batch replacing the previous one: no evidence the soak uses."""

    def first(self, size, made_bytes, now_bytes):
        """After step 0 (as later)."""
        self.later(size, now_bytes)

    def later(self, size, now_bytes):
        """After each step: its peak from the window, the bytes held, the next window opened."""
        peaks = self.meter.end()
        held_batch = self.made[-1][0] if self.made else 0
        shape = max(self.made, key=lambda m: m[1])[2] if self.made else {}
        self.made = []
        # The tensors' peak in this step's window. Not "peak_bytes": without an explicit limit
        # on the CPU that is the process's need grown since the search's setup (the guard's,
        # cpu_budget.cpp endTrial), which no step's window resets.
        self.rows.append(
            SoakStep(
                len(self.rows),
                int(now_bytes),
                int(peaks["peak_allocated_bytes"]),
                int(peaks["peak_reserved_bytes"]),
                held_batch,
                shape,
                int(peaks.get("allocator_retries", 0)),
                int(peaks.get("inactive_split_peak_bytes", 0)),
            )
        )
        self.meter.begin()


def _soak_body(probe, steps, rows, start, loader, instrumented=None):
    """The trial's body: `steps` optimizer steps on one optimizer in one loop (the batch held
    from one step to the next, as the user's loop holds it), a window of the meter per step.
    With a DataLoader, each micro-batch is the loader's next batch of the micro-batch's size
    (_loader.consecutive). Returns (steps completed, total ms). Appends the meter's bytes before
    the first step to `start`. `instrumented`: (a _leaks.Recorder the steps run inside, the
    list its findings are added to), read after the steps while the trial still runs (the
    model's plain attributes are put back when it ends, and with them what a hook kept there)."""

    def body(size, micro_batches):
        start.append(probe.meter.current_bytes())  # before the first batch is made
        optimizer = probe.make_optimizer()
        recorder = _StepRecorder(probe.meter, rows)
        if loader is not None:
            following = consecutive(loader, size)
            make = lambda _size, device: following(device)  # noqa: E731
        else:
            make = lambda size, device: make_batch(probe.example, size, probe.n0, device)  # noqa: E731
        probe.batches = recorder.batches(make, probe.example_ptrs)
        try:
            if instrumented is None:
                return probe._run_steps(size, micro_batches, steps, optimizer, recorder, 0, None)
            instrument, found = instrumented
            baseline = baseline_ptrs(probe.device)
            with instrument:
                done = probe._run_steps(size, micro_batches, steps, optimizer, recorder, 0, None)
            found.extend(instrument.leaks(baseline))
            return done
        finally:
            release = getattr(probe.make_optimizer, "release_trial", None)
            if release is not None:
                release()

    body.__name__ = "_train"  # a training trial's evidence (_trial._body_key)
    return body


def soak(
    model: torch.nn.Module,
    example_batch: Any,
    micro_batch: int,
    *,
    steps: int = 20,
    accumulation_steps: int = 1,
    job_steps: Optional[int] = None,
    **options: Any,
) -> SoakResult:
    """Runs `steps` optimizer steps of the user's step at `micro_batch` in a row and measures
    whether memory grows from step to step (docs/soak.md).

    Each step is micro_batch x accumulation_steps samples (the plan's micro-batch and its
    accumulation), on one optimizer, under the same limit as find()'s trials, with the batch
    made from `example_batch` as find() makes it. After the steps the model, its gradients and
    the process are put back as find() puts them back.

    Args:
        model (torch.nn.Module): the model, as for find().
        example_batch (Any): one batch whose samples are repeated, as for find(), or the job's
            DataLoader: each micro-batch is then its next batch of `micro_batch` samples in the
            loader's own order (its sampler's or batch_sampler's), collated in this process
            (docs/data.md).
        micro_batch (int): samples per micro-batch, >= 1.
        steps (int): optimizer steps to run, 1 to 2^31 - 1 (default 20; the growth is fitted
            from 7 on: 2 warm-up steps, then at least 4 differences).
        accumulation_steps (int): micro-batches per optimizer step, >= 1 (default 1).
        job_steps (int | None): the job's optimizer steps; with it, `lasts` says whether the
            job's last step stays under the limit at the measured growth, and when it does not,
            a second soak at half the micro-batch gives `lasting_micro_batch`, the largest
            micro-batch that lasts them (the soak's time then counts both).
        **options (Any): find()'s options for the step and the memory: optimizer, loss_fn,
            step, precision, device, memory_limit, margin, reserve, ddp, zero_grad,
            keep_output, autocast_cache. The search's options (target_batch, min_batch, ...,
            steps_per_trial) are UsageErrors unless left at their defaults.

    Returns:
        SoakResult: the steps' held bytes and peaks, the growth per step and its noise band,
        the step at which the limit would be reached, whether the job lasts, what holds tensors
        past the soak, and the soak's own time. Out of memory is an outcome here
        (`outcome` "out-of-memory", `failed_step`), never an exception.

    Raises:
        UsageError: a bad argument (micro_batch, steps, accumulation_steps or job_steps not an
            int >= 1, a search option, an unknown option), or as find() raises it.
        ModelError: the step raised an error that is not out of memory.
        Cancelled: Ctrl-C during the soak (the model is restored).

    Examples:
        >>> r = autobatch.soak(model, torch.randn(1, 256), 64, steps=20, memory_limit="64MiB")
        >>> r.growing, r.growth_bytes_per_step, r.limit_step
        (False, 0.0, None)
    """
    for name, value in (("micro_batch", micro_batch), ("accumulation_steps", accumulation_steps)):
        if value is None:
            raise UsageError(f"{name}: expected an int >= 1, but got None")
        _count(value, name, maximum=_INT32_MAX)
    if steps is None:
        raise UsageError("steps: expected an int >= 1 (the optimizer steps to run), but got None")
    _count(steps, "steps", maximum=_INT32_MAX)
    if job_steps is not None:
        _count(job_steps, "job_steps", maximum=2**62)
    if "steps_per_trial" in options:
        raise UsageError("steps_per_trial: soak runs `steps` optimizer steps; pass steps=")
    # an unknown name lists what soak takes, not the search's options it refuses
    check_option_names(
        options, _Session.__init__, "soak", shown_out=(*_SEARCH_ONLY, "steps_per_trial")
    )
    _refuse_search_options(options, "soak")
    started = time.perf_counter()
    result = _soak_once(model, example_batch, micro_batch, steps, accumulation_steps, options)
    result.job_steps = job_steps
    _analyse(result)
    if result.growing and result.lasts is False and micro_batch > 1:
        # A second soak at half the micro-batch: the two give each step's peak and the growth
        # as affine functions of the micro-batch, and the largest micro-batch that lasts.
        half = _soak_once(
            model, example_batch, micro_batch // 2, steps, accumulation_steps, options
        )
        _analyse(half)
        result.lasting_micro_batch = lasting_micro_batch(result, half, job_steps)
        result.soaks = 2
    result.seconds = time.perf_counter() - started
    return result


def _soak_once(model, example_batch, micro_batch, steps, accumulation_steps, options):
    """One soak at `micro_batch`: its steps, outcome and holders (not yet analysed). Given a
    DataLoader, the session's example is its first batch of `micro_batch` samples: the soak runs
    the loader's batches in order, so the scan of its costliest samples (find's) is not made."""
    loader = example_batch if is_loader(example_batch) else None
    if loader is not None:
        if "loader_batches" in options:
            raise UsageError(
                "loader_batches: bounds find()'s scan of the loader's costliest samples; soak "
                "runs the loader's batches in its own order: drop it"
            )
        example_batch = consecutive(loader, micro_batch)(torch.device("cpu"))
    session = _session_of(model, example_batch, options, "soak")
    rows: List[SoakStep] = []
    holders: List[str] = []
    leaks: List[dict] = []
    start: List[int] = []

    def run(probe, facts):
        body = _soak_body(probe, steps, rows, start, loader)
        record = probe.trial(micro_batch, accumulation_steps, body, label="soak")
        if probe.survivor_note:  # the survivor check after the trial (_survivors.py)
            holders.append(_kept_line(probe.survivors))
        slope, noise = fit_growth([r.held_bytes - r.batch_bytes for r in rows])
        if record.get("outcome", FITS) == FITS and (probe.survivor_note or slope > noise):
            leaks.extend(_name_leaks(probe, micro_batch, accumulation_steps, loader))
        return record

    record = session.run(run)
    if record.get("cancelled"):
        raise Cancelled("interrupted: the soak stopped at Ctrl-C; the model is restored")
    outcome = record.get("outcome", FITS)
    return SoakResult(
        micro_batch=micro_batch,
        accumulation_steps=accumulation_steps,
        steps_asked=steps,
        steps=rows,
        outcome=outcome,
        failed_step=None if outcome == FITS else len(rows),
        memory_limit_bytes=int(record["memory_limit_bytes"]),
        holders=holders,
        start_bytes=int(start[0]) if start else 0,
        device=session.device.type,
        batches=_batches_line(loader),
        leaks=leaks,
    )


def _kept_line(survivors):
    """The survivor check's finding in the soak's words: what its steps left alive, and what
    holds it (_survivors.py names the holders)."""
    held = "; ".join(survivors.holders[:3]) or "objects Python cannot trace (C++ references)"
    return (
        f"{len(survivors.known)} tensor storage(s), "
        f"{_core.format_bytes(sum(survivors.known.values()))}, made by the soak's steps and "
        f"alive after them, held by {held}"
    )


def _name_leaks(probe, micro_batch, accumulation_steps, loader):
    """One more step of the soak's, instrumented (_leaks.Recorder), after the soak's steps grew
    or left tensors alive: what keeps the tensors this step makes past its end. [] when the
    step did not run to its end."""
    found: List[dict] = []
    body = _soak_body(probe, 1, [], [], loader, (Recorder(), found))
    record = probe.trial(micro_batch, accumulation_steps, body, label="soak-leak")
    return found if record.get("outcome", FITS) == FITS else []


def _batches_line(loader):
    if loader is None:
        return "the example batch's rows repeated"
    workers = loader.num_workers
    return "the DataLoader's batches in its sampler's order, collated in this process" + (
        f" (not by its {workers} worker processes: their batches sit in shared memory "
        "outside the memory limit)"
        if workers
        else ""
    )


def _first_failing_step(start_peak, growth, limit):
    """The first 0-based step whose peak, `start_peak` + `growth` x step, is above `limit`."""
    if start_peak > limit:
        return 0
    return math.floor((limit - start_peak) / growth) + 1


def lasting_micro_batch(big: SoakResult, small: SoakResult, job_steps: int) -> Optional[int]:
    """The largest micro-batch, at most `big`'s, whose every one of `job_steps` steps stays under
    the limit, from two analysed soaks at two micro-batches that both grow: each step's peak is
    start(B) + growth(B) x step, with start and growth affine in B through the two soaks' figures
    (start: the last step's peak less its growth so far). None when the small soak does not grow
    or a micro-batch of 1 does not last either."""
    if not (small.growing and big.growing) or big.micro_batch == small.micro_batch:
        return None

    def start(r):
        # what the second soak began with beyond the first (the first soak's kept tensors, still
        # alive when the step keeps them in a global or a closure) is no part of a fresh job
        shift = big.start_bytes - r.start_bytes
        return r.steps[-1].peak_bytes + shift - r.growth_bytes_per_step * r.steps[-1].step

    span = big.micro_batch - small.micro_batch
    start_per_sample = (start(big) - start(small)) / span
    growth_per_sample = (big.growth_bytes_per_step - small.growth_bytes_per_step) / span

    def lasts(b):
        d = b - small.micro_batch
        growth = small.growth_bytes_per_step + growth_per_sample * d
        first = start(small) + start_per_sample * d
        if growth <= 0:
            return first <= big.memory_limit_bytes
        return _first_failing_step(first, growth, big.memory_limit_bytes) >= job_steps

    lo, hi = 0, big.micro_batch  # lasts(lo) holds (0: none), lasts(hi + 1) is not asked
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if lasts(mid) else (lo, mid - 1)
    return lo or None
