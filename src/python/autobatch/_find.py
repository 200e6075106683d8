"""autobatch.find: the C++ search, planner and report, with the user's own eager step as the
trial."""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import torch

from . import _core
from ._collectives import refuse_collective_modules
from ._errors import Cancelled, DoesNotFit, ModelError, UsageError
from ._eval import EvalProbe, eval_nothing_fits_message, eval_state_of
from ._fingerprint import _code_digest, fingerprint
from ._optimizers import _impl, _optimizer_factory
from ._option_checks import _check_one_step, _outside_note, _refuse_search_options
from ._options import (
    _INT32_MAX,
    _autocast,
    _bytes,
    _count,
    _device_of,
    _limit,
    _margin,
    _seconds,
    _target,
)
from ._result import Result, Trial
from ._state import ModelState, example_tensors, live_storages, local_tensor
from ._survivors import Survivors
from ._trial import EagerProbe, Meter, leading_size

log = logging.getLogger("autobatch")
_CACHE_OFF = " (autocast cache off)"  # the report's step line, after the precision


def _check_step_arguments(
    model, example_batch, steps_per_trial, step, loss_fn, ddp, keep_output
) -> int:
    """find()'s checks of the model, the example batch and how the step is given; returns the
    example's batch size. Raises UsageError naming the argument and what was expected."""
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model: expected a torch.nn.Module, but got {type(model).__name__}")
    _check_trainable_module(model)
    _check_dense(example_batch)
    n0 = leading_size(example_batch)
    if not n0:
        raise UsageError(
            "example_batch: expected a tensor, tuple, list or mapping holding at "
            "least one tensor with a leading batch dimension (e.g. "
            "torch.randn(1, 3, 224, 224), or {'input_ids': ids, 'labels': ids} "
            "with ids of shape (1, T))"
        )
    if not _count(steps_per_trial, "steps_per_trial", maximum=_INT32_MAX):  # None
        raise UsageError("steps_per_trial: expected an int >= 1, but got None")
    if step is not None and not callable(step):
        raise UsageError(
            f"step: expected a function step(model, batch) -> loss, but got {type(step).__name__}"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise UsageError(
            f"loss_fn: expected a function loss_fn(output, batch) -> scalar, but "
            f"got {type(loss_fn).__name__}"
        )
    _check_arity(
        loss_fn,
        "loss_fn",
        "loss_fn(output, batch) -> scalar",
        "lambda output, batch: F.cross_entropy(output, batch[1])",
    )
    _check_arity(
        step, "step", "step(model, batch) -> loss", "lambda model, batch: model(**batch).loss"
    )
    if step is not None and loss_fn is not None:
        raise UsageError(
            "step and loss_fn: pass one; step(model, batch) computes the loss "
            "itself (it replaces model(batch) and loss_fn)"
        )
    if not isinstance(ddp, bool):
        raise UsageError(f"ddp: expected True or False, but got {ddp!r}")
    if not isinstance(keep_output, bool):
        raise UsageError(
            f"keep_output: expected True (the output alive through backward, as "
            f"`out = model(x); out.loss.backward()` keeps it) or False (dropped "
            f"before backward, as Lightning's training_step), but got "
            f"{keep_output!r}"
        )
    return n0


def _search_options(
    memory_limit,
    reserve,
    fraction,
    margin_bytes,
    min_batch,
    max_batch,
    dataset_size,
    strategy,
    plan,
    target_batch,
    world_size,
    time_limit,
    max_trials,
) -> dict:
    """find()'s search options, checked, as the C++ search takes them (_core.search). Raises
    UsageError naming the option and what was expected."""
    options = {
        "memory_limit_bytes": _limit(memory_limit),
        "reserve_bytes": _bytes(reserve, "reserve"),
        "margin_fraction": fraction,
        "margin_bytes": margin_bytes,
        "min_batch": _count(min_batch, "min_batch", none_is=1),
        "max_batch": _count(max_batch, "max_batch"),
        "dataset_size": _count(dataset_size, "dataset_size"),
        "strategy": strategy,
        "plan": plan,
        "target_batch": _target(target_batch),
        "world_size": _count(world_size, "world_size", none_is=1, maximum=_INT32_MAX),
        "time_limit_s": _seconds(time_limit),
        "max_trials": _count(max_trials, "max_trials", maximum=_INT32_MAX),
    }
    for name, value, allowed in (
        ("strategy", strategy, _core.STRATEGIES),
        ("plan", plan, _core.PLAN_KINDS),
    ):
        if not isinstance(value, str):  # else pybind11's cast error, naming no option
            raise UsageError(
                f"{name}: expected one of {', '.join(map(repr, allowed))}, but got {value!r}"
            )
    if options["max_batch"] and options["min_batch"] > options["max_batch"]:
        # In find()'s words, not the command's ("0 (no bound)": max_batch=0 is refused here).
        raise UsageError(
            f"max_batch: expected None (no bound) or an int >= min_batch "
            f"{options['min_batch']}, but got {options['max_batch']}"
        )
    return options


class _Session:
    """One use of the user's model: validated options, the meter installed, the model's state
    captured; `run(fn)` calls fn(probe, facts) and always puts everything back."""

    def __init__(
        self,
        model,
        example_batch,
        optimizer=None,
        loss_fn=None,
        precision=None,
        device=None,
        memory_limit=None,
        margin=None,
        target_batch=None,
        world_size=1,
        time_limit=None,
        steps_per_trial=2,
        min_batch=1,
        max_batch=None,
        dataset_size=None,
        max_trials=None,
        strategy="guided",
        plan="fastest",
        reserve=None,
        step=None,
        ddp=False,
        zero_grad="none",
        keep_output=True,
        autocast_cache=True,
    ):
        self.n0 = _check_step_arguments(
            model, example_batch, steps_per_trial, step, loss_fn, ddp, keep_output
        )
        self.keep_output = keep_output
        if zero_grad not in ("none", "zeros"):
            raise UsageError(
                f"zero_grad: expected 'none' (zero_grad(set_to_none=True), PyTorch's "
                f"default: the gradients freed after each step) or 'zeros' "
                f"(set_to_none=False: kept allocated), but got {zero_grad!r}"
            )
        self.zero_grad = zero_grad
        self.model, self.example, self.loss_fn, self.step = model, example_batch, loss_fn, step
        self.steps, self.ddp = steps_per_trial, ddp
        self.device = _device_of(model, device)
        self.autocast, self.precision = _autocast(self.device, precision, autocast_cache)
        self.autocast_cache = autocast_cache
        fraction, margin_bytes = _margin(margin)
        self.trained = [p for p in model.parameters() if p.requires_grad]
        if not self.trained:
            raise UsageError("model: no parameter requires grad, so there is nothing to train")
        self.make_optimizer, self.optimizer_name = _optimizer_factory(optimizer, self.trained)
        if steps_per_trial == 1:
            _check_one_step(self.make_optimizer, zero_grad)
        # One figure for the report and the trials' DDP bucket buffer (the same bytes).
        self.gradient_bytes = _distinct_bytes(self.trained)
        self.ddp_bucket_bytes = self.gradient_bytes if self.ddp else 0
        self.options = _search_options(
            memory_limit,
            reserve,
            fraction,
            margin_bytes,
            min_batch,
            max_batch,
            dataset_size,
            strategy,
            plan,
            target_batch,
            world_size,
            time_limit,
            max_trials,
        )
        if (
            self.device.type == "cuda"
        ):  # the caching allocator's units (autobatch/vocabulary/trial.h)
            self.options.update(_core.CUDA_ALLOCATION_UNITS)
        self.optimizer_code = _code_digest(optimizer) if callable(optimizer) else None
        self.key = fingerprint(
            model,
            example_batch,
            device=str(self.device),
            optimizer=(self.optimizer_name, self.optimizer_code),
            precision=self.precision,
            steps=steps_per_trial,
            step=(_name(step), _code_digest(step)),
            loss_fn=(_name(loss_fn), _code_digest(loss_fn)),
            ddp=ddp,
            **self.options,
            **({"zero_grad": zero_grad} if zero_grad != "none" else {}),
            **({"keep_output": False} if not keep_output else {}),
            **({"autocast_cache": False} if not autocast_cache else {}),
        )

    def describe(self, doc, probe):
        """The JSON report with the options of the step that ran (the C++ report writes the
        command's training spec there: inputs, loss, optimizer, precision, output kept)."""
        step = {
            "model": doc["options"].get("model"),
            "inputs": _inputs(self.example),
            "loss": _loss_name(self, probe.loss_rule),
            "optimizer": probe.facts["optimizer"],
            "optimizer_impl": probe.facts["model"]["optimizer_impl"] or "none",
            "zero_grad": self.zero_grad,
            "keep_output": self.keep_output,
            "precision": self.precision,
            "steps_per_trial": self.steps,
            "device": str(self.device),
            "learning_rate": None,
            "cudnn_benchmark": None,
            "optimize_graph": None,
            "seed": None,
            "ddp": self.ddp,
            "step": "python-eager" if self.step is None else f"python-eager: {_name(self.step)}",
        }
        doc["options"].update(step)
        if isinstance(doc.get("model"), dict):  # Result.memory; the text's line is a warning
            doc["model"]["held_outside_model_bytes"] = getattr(self, "outside", (0,))[0]
        if isinstance(doc.get("fingerprint"), dict):
            doc["fingerprint"]["options"] = doc["options"]
            doc["fingerprint"]["inputs"] = step["inputs"]
            doc["fingerprint"]["loss"] = step["loss"]
        return doc

    def run(self, fn):
        """fn(probe, facts) with the meter installed and the model's state captured; everything
        put back afterwards. One search at a time per process (the CPU budget allocator and the
        memory fraction are process-wide), in grad mode whatever the caller's."""
        if torch.is_inference_mode_enabled():
            raise UsageError(
                "autobatch runs training steps, which need autograd, but it was "
                "called inside torch.inference_mode(); call it outside that block"
            )
        if not _ONE_AT_A_TIME.acquire(blocking=False):
            raise UsageError(
                f"another autobatch search is running in this process (thread "
                f"{_RUNNING[0]!r}): the memory it measures is process-wide, so two "
                "at once would measure each other; run them one after the other"
            )
        _RUNNING[:] = [threading.current_thread().name]
        # The caller's autocast is not the trials': they run as `precision` says, and the result
        # says so (inside an enclosing bf16 autocast the answer was twice the fp32 one while the
        # report said fp32).
        self.outer_autocast = torch.is_autocast_enabled(self.device.type)
        try:
            self.collected_bytes = _collect_garbage(self.device)
            with torch.enable_grad(), torch.autocast(self.device.type, enabled=False):
                return self._run(fn)
        finally:
            _RUNNING[:] = [None]
            _ONE_AT_A_TIME.release()

    def _run(self, fn):
        state = ModelState(self.model, self.example)
        meter = None
        try:
            limit, reserve = self.options["memory_limit_bytes"], self.options["reserve_bytes"]
            ranks = _ranks_searching_alone()
            if ranks > 1:
                refuse_collective_modules(self.model)
            try:
                meter = (
                    Meter.cuda(self.device.index, limit, reserve)
                    if self.device.type == "cuda"
                    else Meter.cpu(limit, reserve)
                )
            except _core.Error as e:
                raise UsageError(str(e)) from None
            self._check_room(meter)
            meter.notes += _held_note(state)
            if self.collected_bytes > 0:
                meter.notes.append(
                    f"garbage collection before the search freed {self.collected_bytes} bytes of "
                    f"{self.device.type} memory held by unreachable objects (reference cycles): "
                    "the trials ran without them; a job that does not run gc.collect() before "
                    "its loop may still hold them when it starts"
                )
            if self.outer_autocast:
                meter.notes.append(
                    f"autobatch was called inside torch.autocast: the trials ran in "
                    f"{self.precision} as precision= says, not under the caller's autocast; pass "
                    "precision='amp-bf16' or 'amp-fp16' to size an autocast training step"
                )
            state.detach_grads()
            self.model.train()
            probe = EagerProbe(
                self.model,
                self.example,
                self.n0,
                self.device,
                self.make_optimizer,
                self.loss_fn,
                self.autocast,
                meter,
                state,
                self.steps,
                self.step,
                self.ddp_bucket_bytes,
            )
            probe.zero_grad, probe.keep_output = self.zero_grad, self.keep_output
            probe.state_batch = self.options["min_batch"]
            if meter.needs_warm_up() or ranks > 1:
                probe.warm_up(self.options["min_batch"], check_collectives=ranks > 1)
            try:
                self.untracked = state.count_untracked(meter)
            except _core.Error as e:
                raise UsageError(str(e)) from None
            self.outside = state.outside_model(self.device)
            meter.notes += _outside_note(self.outside, self.device)
            probe.facts = _facts(self, state, meter)
            probe.survivors = Survivors(
                self.device, [p for p, _, _ in live_storages(self.device)], meter.current_bytes()
            )
            try:
                return fn(probe, probe.facts)
            except _core.Error as e:
                raise UsageError(str(e)) from None
        finally:
            device_usable = meter is None or not meter.poisoned()
            state.restore(device_usable)
            if meter is not None:
                meter.remove()

    def _check_room(self, meter):
        """UsageError before any trial when the reserve or the margin in bytes leave nothing of
        the limit (issue 40 row 13: they were found only after trials, or read as 0 bytes)."""
        limit, o = meter.limit_bytes() + meter.reserve_bytes, self.options
        if meter.limit_bytes() <= 0:
            raise UsageError(
                f"reserve: {o['reserve_bytes']} bytes leave nothing of the memory "
                f"limit, {limit} bytes ({meter.limit_source()}); expected a reserve "
                "below the limit"
            )
        if o["margin_bytes"] >= meter.limit_bytes():
            raise UsageError(
                f"margin: {o['margin_bytes']} bytes are not less than the limit the "
                f"trials run under, {meter.limit_bytes()} bytes "
                f"({meter.limit_source()}, less the reserve); expected a smaller "
                "margin, or a fraction such as 0.05"
            )


def _collect_garbage(device):
    """gc.collect() before the snapshot and the baseline, as Lightning's finder does before each
    trial (garbage_collection_cuda) and accelerate's release_memory does. Unreachable objects
    that hold tensors (a deleted model whose hooks refer to it, an exception's traceback kept in
    a cycle) are freed only by the cyclic collector, which can run in the middle of a search:
    their bytes would be counted by the trials before it and not by those after (the budget
    allocator counts every live tensor it allocated, process-wide). Returns
    the bytes it freed where the device's allocator counts them (CUDA's allocated bytes; on the
    CPU the budget allocator's count only while it is installed, so 0 here), for the note."""
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    gc.collect()
    return before - torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


_ONE_AT_A_TIME = threading.Lock()
_RUNNING = [None]  # the name of the thread whose search holds the lock


def _check_arity(fn, name, form, example):
    """A UsageError before any trial when `fn` cannot take two positional arguments (a loss_fn
    written as loss_fn(output) failed at the first trial as the model's TypeError; issue 40)."""
    if fn is None:
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without a signature: tried as is
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise UsageError(
            f"{name}: expected a function called as {form}, but its signature is "
            f"{signature}; e.g. {example}"
        ) from None


def _held_note(state):
    """The result's line naming the tensors the modules hold outside their parameters and buffers
    (issue 40 row 2): counted in the baseline, so the user knows where those bytes went."""
    held = state.held_bytes()
    if not held:
        return []
    names = ", ".join(f"{name} ({_core.format_bytes(n)})" for name, n in held[:5])
    more = f" and {len(held) - 5} more" if len(held) > 5 else ""
    total = _core.format_bytes(sum(n for _, n in held))
    return [
        f"the model holds {total} in tensors that are neither parameters nor buffers: "
        f"{names}{more}; counted in every trial's memory as your job will hold them"
    ]


_COLLECTIVES_NEVER_WAIT = threading.Event()  # set inside collectives_never_wait()


@contextlib.contextmanager
def collectives_never_wait() -> Iterator[None]:
    """Inside: the model's collectives go to a fake process group (find_sharded in a running
    job shards the rank's model over one made beside the real group), so the search is not a
    rank's search alone: no CollectiveGuard, no refusal of collective modules."""
    _COLLECTIVES_NEVER_WAIT.set()
    try:
        yield
    finally:
        _COLLECTIVES_NEVER_WAIT.clear()


def _ranks_searching_alone():
    """The world size of the process group this process is in (1 without torch.distributed, or
    in torch's fake process group, whose collectives do nothing): above 1, each rank's search runs
    on its own and its step must run no collective."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    if (
        dist.get_backend() == "fake" or _COLLECTIVES_NEVER_WAIT.is_set()
    ):  # collectives return at once
        return 1
    return dist.get_world_size()


def find(
    model: torch.nn.Module,
    example_batch: Any,
    *,
    optimizer: torch.optim.Optimizer | Callable[..., Any] | str | None = None,
    loss_fn: Callable[..., Any] | None = None,
    precision: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    memory_limit: int | str | None = None,
    margin: float | int | str | None = None,
    target_batch: int | None = None,
    world_size: int = 1,
    time_limit: float | None = None,
    steps_per_trial: int = 2,
    min_batch: int = 1,
    max_batch: int | None = None,
    dataset_size: int | None = None,
    max_trials: int | None = None,
    strategy: str = "guided",
    plan: str = "fastest",
    reserve: int | str | None = None,
    progress: bool | None = None,
    step: Callable[..., Any] | None = None,
    ddp: bool = False,
    zero_grad: str = "none",
    keep_output: bool = True,
    eval: bool | str = False,
    cache: bool | str | os.PathLike[str] | None = None,
    cache_trust: bool = False,
    autocast_cache: bool = True,
) -> Result:
    """Finds the largest micro-batch with which `model` trains, by running real training steps.

    Each trial is the user's own eager step at a micro-batch the search picks (inputs, forward,
    loss, backward, optimizer step, zero_grad; `steps_per_trial` optimizer steps) under the
    memory limit; the search, the accumulation planner and the report are the C++ library's,
    the same as the `autobatch` command's. docs/python.md says what a trial runs and how memory
    is measured. Batch sizes are counts of samples; memory is in bytes.

    Side effects: runs real steps on `model` (its parameters, buffers, gradients, training
    flags, plain attributes and the RNG states are put back bitwise afterwards, also after an
    error); on the CPU the budget allocator is installed in this process for the search and
    removed after; on CUDA the memory fraction is set and put back as the process had it (a
    fraction the process had set also caps the limit), and the cuBLAS workspaces and the
    allocator's cache are freed after each trial; gc.collect() runs before the search. One
    search at a time per process. Trial progress goes to the "autobatch" logger (INFO).

    Args:
        model (torch.nn.Module): the model to size, on the device it is sized on (never
            moved). At least one parameter must require grad; a TorchScript module, inference
            tensors, lazy (uninitialized) or meta parameters are UsageErrors. A model in eval()
            is trained in train mode and put back in eval mode.
        example_batch (Any): one batch of any size (one sample is enough): a tensor, a
            tuple/list, or a mapping (a dict, a tokenizer's BatchEncoding) of dense tensors
            sharing the leading (batch) dimension, e.g. torch.randn(1, 3, 224, 224) or
            {"input_ids": ids, "labels": ids} with ids of shape [1, T]. A batch of B samples
            repeats its samples in order along dimension 0; the model is called as
            model(**batch) for a mapping, model(*batch) for a tuple/list, model(batch) for a
            tensor.
        optimizer (torch.optim.Optimizer | Callable[..., Any] | str | None): a factory
            `lambda params: torch.optim.AdamW(params, lr=1e-3)`, called with the trainable
            parameters and returning a new optimizer each call; an optimizer instance (a fresh
            one of its class, param groups and options is built per trial; the instance is
            never stepped); a torch.optim.Optimizer subclass (built with its defaults); "none"
            (no optimizer step); or None (default: AdamW with PyTorch's defaults, as the
            command). LBFGS, a factory that returns an existing optimizer, and a factory that
            fails when called are UsageErrors.
        loss_fn (Callable[..., Any] | None): `loss_fn(output, batch) -> scalar tensor`. Default
            None: the output's `.loss`, its ["loss"], a scalar output itself, a tuple's first
            element, else the output's mean. Not with `step`.
        precision (str | torch.dtype | None): None or "fp32" (default: no autocast),
            "amp-bf16" or "amp-fp16" (torch.autocast around forward and loss); "bf16", "fp16",
            torch.float32, torch.bfloat16 and torch.float16 are read as those. An enclosing
            torch.autocast is not the trials' (the result's warnings say so).
        device (str | torch.device | None): "cpu", "cuda" or "cuda:N". Default None: the
            model's device (a model on several devices, or on another one than `device`, is a
            UsageError).
        memory_limit (int | str | None): bytes (an int > 0) or a size ("8GiB", "512MB",
            "1.5 GB": a space may stand between number and unit). Default None: the device's
            memory (CPU: the room this process has: cgroup, MemAvailable, RLIMIT_DATA /
            RLIMIT_AS). 0 is a UsageError, not "no limit"; above a GPU's memory it is clipped
            to it, with a warning.
        margin (float | int | str | None): headroom under the limit for the safe answer: a
            fraction in [0, 1) (0.05) or a percentage in [0, 100) ("5%"), or bytes (an int or
            "256MiB", less than the limit). Default None: 0.05.
        target_batch (int | None): the effective batch to plan gradient accumulation for:
            samples per optimizer step over all ranks, an int >= 1 and a multiple of
            `world_size`. Default None: no plan.
        world_size (int): the data-parallel ranks that share `target_batch`, 1 to 2^31 - 1
            (default 1). The trials run on this process alone; the plan is per rank.
        time_limit (float | None): seconds > 0 for the whole search, checked before each trial,
            each step and, on the CPU, each allocation inside a step. Default None: no limit.
        steps_per_trial (int): optimizer steps per trial, 1 to 2^31 - 1 (default 2: the
            optimizer's state exists from the first step on). 1 only with optimizer="none" or
            torch.optim.SGD without momentum, and zero_grad="none" (else UsageError).
        min_batch (int): the smallest micro-batch tried, samples, >= 1 (default 1).
        max_batch (int | None): the largest micro-batch it may answer, samples, >= min_batch.
            Default None: no bound.
        dataset_size (int | None): samples in the dataset: no micro-batch above it is tried.
            Default None: no bound.
        max_trials (int | None): the most trials for the whole search, 1 to 2^31 - 1. Default
            None: no limit.
        strategy (str): "guided" (default), "binsearch" or "power" (docs/search.md).
        plan (str): the primary plan: "fastest" (default, as the command's --plan: of the exact
            plans, the one whose measured step times train the most samples per second),
            "auto", "uniform" or "balanced" (docs/search.md, "Headroom, plan").
        reserve (int | str | None): bytes (an int or "1GiB") the rest of the job needs beside
            the step, taken off the limit; less than the limit. Default None: 0.
        progress (bool | None): True: a tqdm bar of trials (UsageError without tqdm); False:
            none; None (default): a bar when tqdm is installed and stderr is a terminal.
        step (Callable[..., Any] | None): `step(model, batch) -> loss`, the forward and loss of
            one micro-batch in place of model(batch) and loss_fn (a framework's own step:
            autobatch.lightning passes training_step); it must return a scalar tensor that
            requires grad (else ModelError). Backward, the optimizer step and zero_grad stay
            autobatch's. Not with `loss_fn`.
        ddp (bool): True when the job wraps the model in DistributedDataParallel: every trial
            holds one buffer of the trained parameters' gradient bytes (DDP's gradient
            buckets, which a job with gradient_as_bucket_view=True does not hold beside the
            gradients) from its start to its end, as `autobatch --ddp` does. Default False.
        zero_grad (str): "none" (default: zero_grad(set_to_none=True), PyTorch's default, the
            gradients freed after each step) or "zeros" (set_to_none=False: kept allocated).
        keep_output (bool): True (default, the command's --keep-output yes): the model's output
            stays alive through backward, as `out = model(**batch); out.loss.backward()`;
            False: dropped before backward, as a Lightning training_step or the Hugging Face
            Trainer (the drop-ins pass False).
        eval (bool | str): False (default: training only); True: also the largest evaluation
            batch with the training state resident (the command's --eval; Result.eval_safe_batch);
            "only": an evaluation job alone, the parameters resident (--eval-only; not with
            target_batch). docs/evaluation.md, "From Python".
        cache (bool | str | os.PathLike[str] | None): the command's result cache (--cache,
            docs/cache.md): None or False (default: off), True (the default folder:
            $AUTOBATCH_CACHE_DIR, else $XDG_CACHE_HOME/autobatch/results, else
            ~/.cache/autobatch/results) or a folder path. A search keyed as an earlier one (the
            model's fingerprint, the step, the limit as resolved, margin, bounds, device and
            versions; not the target, world size or plan) is answered from the entry after one
            confirming trial; a miss searches and stores. Result.cache says which. Not with eval=.
        cache_trust (bool): answer a cache hit without the confirming trial (--cache-trust).
            Needs `cache`. Default False.
        autocast_cache (bool): with an amp precision, torch.autocast's cache_enabled: True
            (default, PyTorch's: a weight's cast made once per forward) or False (a cast per
            use, as Lightning's mixed precision runs; its drop-in passes False). Either way the
            casts are freed when the forward and loss end.

    Returns:
        Result: the largest micro-batch seen to fit (`max_micro_batch`), the largest under the
        limit less the margin (`safe_micro_batch`, > 0), the plan for `target_batch` (None
        without one), every trial, the model's memory and the report (`raw`, `text`, `env`);
        with eval=, the evaluation batches too (with eval="only", `max_micro_batch` and
        `safe_micro_batch` are the evaluation batch's).

    Raises:
        UsageError: a bad argument (the message says what was expected and what was given),
            before any trial; also a call inside torch.inference_mode(), a second search while
            one runs in the process, a margin or reserve that leaves nothing of the limit.
        DoesNotFit: nothing fits at min_batch, or only above the limit less the margin, or a
            trial or time budget ran out before any size was verified; with eval=, the training
            state does not fit beside evaluation, or no evaluation batch fits under the margin.
            `.result` holds the trials.
        ModelError: the step (model, loss or optimizer) raised an error that is not out of
            memory; `__cause__` is the original, `.micro_batch` the size, `.result` the sizes
            verified before it.
        Cancelled: Ctrl-C; the trial in progress is abandoned, the model restored, and
            `.result` holds the best verified size.

    Examples:
        >>> result = autobatch.find(torchvision.models.resnet18(), torch.randn(1, 3, 64, 64),
        ...                         optimizer=lambda params: torch.optim.AdamW(params),
        ...                         device="cpu", memory_limit="512MiB", target_batch=256)
        >>> result.safe_micro_batch, str(result.plan)  # on one 2-core CPU machine
        (184, 'uniform plan: micro-batch 128 x 2 accumulation steps x 1 rank(s) = 256')
    """
    eval_state = eval_state_of(eval, target_batch)
    cache_dir = _cache_dir(cache, cache_trust, eval_state)
    session = _Session(
        model,
        example_batch,
        optimizer,
        loss_fn,
        precision,
        device,
        memory_limit,
        margin,
        target_batch,
        world_size,
        time_limit,
        steps_per_trial,
        min_batch,
        max_batch,
        dataset_size,
        max_trials,
        strategy,
        plan,
        reserve,
        step,
        ddp,
        zero_grad,
        keep_output,
        autocast_cache,
    )
    if eval_state:
        session.key = fingerprint(model, example_batch, base=session.key, eval=eval_state)
    probes = []

    def search(probe, facts):
        probes.append(probe)
        probe.bar = _progress_bar(progress)
        evaluator = EvalProbe(probe) if eval_state else None
        where = None
        if cache_dir is not None:
            where = {
                "dir": cache_dir,
                "trust": cache_trust,
                "fields": _cache_key_fields(session, facts),
            }
        try:
            return _core.search(
                probe.stopping_at_model_error,
                session.options,
                facts,
                probe.cancel,
                evaluator,
                eval_state,
                where,
                measure=probe.measuring_at_model_error,
            )
        finally:
            if probe.bar is not None:
                probe.bar.close()

    out = session.run(search)
    result = Result.from_report(
        session.describe(json.loads(out["json"]), probes[0]), out["text"], out["env"], session.key
    )
    if probes[0].stopped_by is not None:  # raised with what the search verified before it
        error = probes[0].stopped_by
        raise ModelError(str(error), result, error.micro_batch) from error.__cause__
    if probes[0].interrupted:
        raise Cancelled("interrupted: the search stopped at Ctrl-C; the model is restored", result)
    if eval_state == "parameters-only" and result.eval_safe_batch == 0:  # the evaluation's words
        raise DoesNotFit(eval_nothing_fits_message(result), result)
    if result.safe_micro_batch == 0:  # the command's exit status 3, whatever ended the search
        raise DoesNotFit(_nothing_fits_message(result), result)
    if eval_state and result.eval_safe_batch == 0:  # --eval's exit 3
        raise DoesNotFit(eval_nothing_fits_message(result), result)
    return result


def job_fields(model_digest: str, example_batch: Any, options: Mapping[str, Any]) -> dict[str, str]:
    """What one rank's plan depends on, for the ranks of a running job to compare before any
    trial (_ranks.compare_job), as the command's ranks compare theirs: the model's digest as the
    caller computes it, the example's inputs without the batch dimension, the step, loss and
    optimizer by their code, and the options that change the trials or the plan. Never the
    device, the memory limit, reserve or margin, or the search's bounds (ranks on other devices
    are what the minimum over the ranks is for)."""

    def code(fn):
        if fn is None or isinstance(fn, str):
            return repr(fn)
        if isinstance(fn, torch.optim.Optimizer):
            return f"{type(fn).__qualname__} {sorted((k, repr(v)) for k, v in fn.defaults.items())}"
        return f"{_name(fn)} {_code_digest(fn)}"

    plain = (
        ("target_batch", None),
        ("plan", "fastest"),
        ("steps_per_trial", 2),
        ("precision", None),
        ("zero_grad", "none"),
        ("keep_output", True),
        ("autocast_cache", True),
        ("eval", False),
        ("ddp_kwargs", None),
    )
    return {
        "model": model_digest,
        "inputs": " ".join(_inputs(example_batch)),
        "step": code(options.get("step")),
        "loss_fn": code(options.get("loss_fn")),
        "optimizer": code(options.get("optimizer")),
        **{k: repr(options.get(k, default)) for k, default in plain},
    }


def _cache_dir(cache, trust, eval_state):
    """The results folder for find(cache=...): None (off), True (the default folder, as the
    command's --cache), or a folder path; UsageError for anything else, for cache_trust without a
    cache, and for a cache with eval= (as the command refuses --cache with --eval)."""
    if not isinstance(trust, bool):
        raise UsageError(f"cache_trust: expected True or False, but got {trust!r}")
    if cache is None or cache is False:
        if trust:
            raise UsageError(
                "cache_trust=True needs cache= (True for the default folder, or a folder path)"
            )
        return None
    if eval_state:
        raise UsageError(
            "cache: the result cache keeps training searches only; drop cache= when you pass eval="
        )
    if cache is True:
        return _core.default_cache_dir()
    if isinstance(cache, (str, os.PathLike)) and os.fspath(cache):
        return os.fspath(cache)
    raise UsageError(
        f"cache: expected True (the default folder, $AUTOBATCH_CACHE_DIR or "
        f"~/.cache/autobatch/results), a folder path, or None, but got {cache!r}"
    )


def _cache_key_fields(session, facts):
    """What the answer of find() depends on, as (name, value) text pairs in a fixed order (the
    command's key fields where they mean the same, docs/cache.md): the model's fingerprint (its
    structure, settings and forward code, the example's shapes), the step (loss, user step,
    optimizer and the code of its factory, zero_grad, precision, steps, DDP's bucket), the limit
    as resolved (not as asked: the room left differs between machines), reserve, margin, the
    search's bounds and strategy, the device (name and total memory), torch, CUDA and autobatch
    versions and the allocator's configuration. Not the target batch, world size or plan: a hit
    plans again from the cached safe micro-batch."""
    o, model, device = session.options, facts["model"], session.device
    device_name, total = "cpu", 0
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name, total = props.name, props.total_memory
    fields = [
        ("format", "python-eager"),
        ("model", fingerprint(session.model, session.example)),
        ("inputs", " ".join(_inputs(session.example))),
        ("loss", f"{_loss_name(session, 'default')} {_code_digest(session.loss_fn)}"),
        ("step", f"{_name(session.step)} {_code_digest(session.step)}"),
        (
            "optimizer",
            f"{facts['optimizer']} {session.optimizer_name} "
            f"{session.optimizer_code} {facts['optimizer_options']}",
        ),
        ("optimizer_impl", model["optimizer_impl"] or "none"),
        ("zero_grad", session.zero_grad),
        ("keep_output", session.keep_output),
        ("precision", session.precision),
        ("autocast_cache", session.autocast_cache),
        ("steps_per_trial", session.steps),
        ("ddp_bucket_bytes", session.ddp_bucket_bytes),
        ("memory_limit_bytes", facts["context"]["memory_limit_bytes"]),
        ("reserve_bytes", o["reserve_bytes"]),
        ("margin", f"{o['margin_fraction']} {o['margin_bytes']}"),
        ("strategy", o["strategy"]),
        ("min_batch", o["min_batch"]),
        ("max_batch", o["max_batch"]),
        ("dataset_size", o["dataset_size"]),
        ("device", f"{device_name} {total}"),
        ("torch", torch.__version__),
        ("cuda", torch.version.cuda or "none"),
        ("autobatch", _core.version()),
        (
            "allocator_conf",
            f"{os.environ.get('PYTORCH_ALLOC_CONF', '')} "
            f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}",
        ),
    ]
    return [(k, str(v)) for k, v in fields]


def _progress_bar(progress):
    """A tqdm bar of trials when `progress` is True, or None (auto) and tqdm is installed and
    stderr is a terminal; else None."""
    import sys

    if (
        progress not in (None, True, False)
        or isinstance(progress, (int, float))
        and not isinstance(progress, bool)
    ):
        raise UsageError(
            f"progress: expected True (a tqdm bar of trials), False or None (a bar "
            f"when tqdm is installed and stderr is a terminal), but got {progress!r}"
        )
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            raise UsageError("progress=True needs tqdm (pip install tqdm)") from None
        return None
    return tqdm(desc="autobatch", unit="trial")


def check_batch(
    model: torch.nn.Module,
    example_batch: Any,
    micro_batch: int,
    *,
    micro_batches_per_step: int = 1,
    **options: Any,
) -> Trial:
    """Runs one trial of the user's step at `micro_batch` (`autobatch --check-batch`).

    The same trial as find()'s (`steps_per_trial` optimizer steps, each of
    `micro_batches_per_step` micro-batches), measured the same way, with the model restored
    afterwards; no search and no plan.

    Args:
        model (torch.nn.Module): the model, as for find().
        example_batch (Any): one batch whose samples are repeated, as for find().
        micro_batch (int): the micro-batch to run, samples, >= 1.
        micro_batches_per_step (int): micro-batches accumulated before each optimizer step, 1
            to 2^31 - 1 (default 1; 2 holds the first micro-batch's gradients through the
            second, as a plan with accumulation does).
        **options (Any): find()'s options for the step and the memory: optimizer, loss_fn,
            step, precision, device, memory_limit, margin, reserve, steps_per_trial, ddp,
            zero_grad, keep_output, autocast_cache, with find()'s types and defaults. The
            options that bound or plan a search (target_batch, world_size, time_limit,
            min_batch, max_batch, dataset_size, max_trials, strategy, plan) are UsageErrors
            unless left at their defaults, as are progress, cache, cache_trust and eval.

    Returns:
        Trial: `outcome` "fits", "out-of-memory" or "size-limit" (out of memory is an outcome
        here, never DoesNotFit), the peaks in bytes (per phase too), the failed phase, the step
        time.

    Raises:
        UsageError: a bad argument (micro_batch or micro_batches_per_step not an int >= 1, a
            search option, an unknown option), or as find() raises it.
        ModelError: the step raised an error that is not out of memory (`.result` is None).
        Cancelled: Ctrl-C during the trial (the model is restored; `.result` is None).

    Examples:
        >>> trial = autobatch.check_batch(model, torch.randn(1, 256), 1024,
        ...                               memory_limit="64MiB")
        >>> trial.outcome in ("fits", "out-of-memory", "size-limit")
        True
        >>> trial.peak_bytes, trial.phase_peaks, trial.failed_phase  # bytes; "" when it fits
    """
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise UsageError(f"micro_batch: expected an int >= 1, but got {micro_batch!r}")
    if micro_batches_per_step is None:
        raise UsageError(
            "micro_batches_per_step: expected an int >= 1 (the micro-batches "
            "accumulated into one optimizer step), but got None"
        )
    _count(micro_batches_per_step, "micro_batches_per_step", maximum=_INT32_MAX)
    _refuse_search_options(options, "check_batch")
    session = _session_of(model, example_batch, options, "check_batch")
    record = session.run(lambda probe, facts: probe(micro_batch, micro_batches_per_step))
    record.setdefault("outcome", "fits")
    record.update(micro_batch_size=micro_batch, micro_batches_per_step=micro_batches_per_step)
    if record.get("cancelled"):
        raise Cancelled("interrupted: the trial stopped at Ctrl-C; the model is restored")
    return Trial.from_json(record)


def check_option_names(
    options: Mapping[str, Any],
    fn: Callable[..., Any],
    who: str,
    leave_out: Sequence[str] = (),
    shown_out: Sequence[str] = (),
    where: str = "",
) -> None:
    """UsageError, before any work, for an option `fn` does not take: the callers pass find()'s
    options on (the drop-ins, find_sharded) or take fewer (one trial's calls), and an unknown name
    would otherwise leave as `fn`'s TypeError late, naming another function. `leave_out`: its
    parameters that are not options (the model, the example); `shown_out`: those the caller sets
    itself (left out of the names the message lists); `where`: where those come from."""
    takes = set(inspect.signature(fn).parameters) - {"self", "model", "example_batch", *leave_out}
    unknown = sorted(set(options) - takes)
    if unknown:
        source = f" (the others come from {where})" if where else ""
        raise UsageError(
            f"{who}: no option {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(takes - set(shown_out)))}{source}"
        )


def _session_of(model, example_batch, options, who):
    """A _Session for one trial's call (check_batch, check_eval_batch): find()'s search options
    (progress, cache, ...) are UsageErrors."""
    check_option_names(options, _Session.__init__, who)
    return _Session(model, example_batch, **options)


def _check_trainable_module(model):
    """What find() cannot train, said before any trial (each would otherwise leave find() as
    torch's own error from inside the first trial)."""
    if isinstance(model, (torch.jit.ScriptModule, torch.jit.RecursiveScriptModule)):
        raise UsageError(
            "model: a TorchScript module (torch.jit.script or torch.jit.trace); "
            "autobatch.find trains eager modules: pass the module before scripting "
            "it, or run the command on the saved archive (autobatch --model net.pt)"
        )
    inference = [
        name
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if not torch.nn.parameter.is_lazy(t) and t.is_inference()
    ]
    if inference:
        raise UsageError(
            f"model: {len(inference)} of its tensors ({inference[0]}, ...) are "
            "inference tensors, made under torch.inference_mode(), which autograd "
            "cannot train; build the model outside inference_mode (or load its "
            "weights there)"
        )


def _check_dense(example):
    """Batches are made by repeating the example's rows (_batches.make_batch), which needs dense
    (strided) tensors: a sparse one would otherwise leave find() as NotImplementedError."""
    for path, t in example_tensors(example):
        if t.layout != torch.strided:
            raise UsageError(
                f"{path}: expected dense tensors, but got a {t.layout} tensor; "
                "pass the dense example (.to_dense()) and make it sparse inside "
                "step(model, batch) if the model needs it"
            )


def _nothing_fits_message(result):
    r = result.raw.get("result") or {}
    if result.status in ("trial-budget", "time-budget"):
        budget = "trial" if result.status == "trial-budget" else "time"
        return (
            f"no micro-batch was verified before the {budget} budget ran out "
            f"({len(result.trials)} trial(s)); raise time_limit / max_trials"
        )
    if result.max_micro_batch > 0:
        return (
            f"nothing fits under the margin: micro-batch {result.max_micro_batch} fits, but "
            f"its peak is above the limit of {result.memory_limit_bytes} bytes less the margin "
            f"of {result.margin_bytes} bytes"
        )
    # The smallest micro-batch tried is min_batch, not 1 (with min_batch 6000, 1 may well fit).
    smallest = min((t.micro_batch_size for t in result.trials), default=1)
    return (
        f"nothing fits: micro-batch {smallest} does not fit under {result.memory_limit_bytes} "
        f"bytes; it needs at least {r.get('min_batch_needs_at_least_bytes', 0)} bytes (a "
        "smaller min_batch, a higher memory_limit or a smaller model)"
    )


def _distinct_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (tied weights counted once)."""
    seen, total = set(), 0
    for t in tensors:
        st = local_tensor(t).untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def _facts(session, state, meter):
    """What the report says of the model and the run (MemoryBreakdown and RunContext's fields)."""
    device, model = session.device, session.model
    baseline = session.untracked if device.type == "cpu" else torch.cuda.memory_allocated(device)
    loss = _loss_name(session, "the output's .loss, else its mean")
    first = session.make_optimizer()  # built once: its class and implementation for the report
    optimizer = (
        f"{type(first).__module__}.{type(first).__qualname__}" if first is not None else "none"
    )
    impl = _impl(first, device)
    # The defaults, and each param group's own options where they differ (a group's momentum
    # makes SGD's buffers, so the cache's key must see it)
    options = (
        (
            repr(sorted((k, repr(v)) for k, v in first.defaults.items()))
            + repr(
                [
                    sorted(
                        (k, repr(v))
                        for k, v in g.items()
                        if k != "params" and first.defaults.get(k, object()) != v
                    )
                    for g in first.param_groups
                ]
            )
        )
        if first
        else ""
    )
    del first
    return {
        "optimizer": optimizer,
        "optimizer_options": options,
        "name": f"{type(model).__module__}.{type(model).__qualname__}",
        "device": str(device),
        "steps_per_trial": session.steps,
        "fingerprint": session.key,
        "step": f"the user's eager step: inputs {_describe(session.example)}, loss {loss}, "
        f"optimizer {optimizer}, {session.precision}"
        f"{'' if session.autocast_cache or session.precision == 'fp32' else _CACHE_OFF}",
        "model": {
            "parameter_count": sum(p.numel() for p in session.trained),
            "parameter_bytes": _distinct_bytes(model.parameters()),
            "gradient_bytes": session.gradient_bytes,
            "optimizer_state_bytes": 0,
            "baseline_bytes": baseline,
            "ddp_bucket_bytes": session.ddp_bucket_bytes,
            "optimizer_impl": impl,
            "model_format": "python",
        },
        "context": {"device": str(device), "micro_batches_per_trial": 1, **meter.context()},
        "cuda_devices": _cuda_devices(device),
    }


def _cuda_devices(device):
    """The CUDA device of the run as torch sees it (the report's device name and total memory)."""
    if device.type != "cuda":
        return []
    p = torch.cuda.get_device_properties(device)
    return [
        {
            "index": device.index,
            "name": p.name,
            "total_bytes": p.total_memory,
            "major": p.major,
            "minor": p.minor,
        }
    ]


def _name(fn):
    """A function's qualified name for reports and the fingerprint (never its address)."""
    if fn is None:
        return None
    return getattr(fn, "__qualname__", type(fn).__qualname__)


def _loss_name(session, rule):
    if session.step is not None:
        return f"step {_name(session.step)}"
    return "loss_fn" if session.loss_fn is not None else rule


def _inputs(x):
    """The example's tensors as input specs of the command's syntax (docs/inputs.md), in order."""
    if isinstance(x, torch.Tensor):
        return [_describe(x)]
    values = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    return [spec for v in values for spec in _inputs(v)]


def _describe(x):
    if isinstance(x, torch.Tensor):
        dims = "x".join(str(d) for d in x.shape[1:]) or "scalar"
        return f"{str(x.dtype).replace('torch.', '')}:{dims}"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        return "(" + ", ".join(_describe(v) for v in x) + ")"
    return type(x).__name__
