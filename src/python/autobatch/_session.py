"""The search session of autobatch.find and check_batch: the options checked and put in the
library's terms, the user's model and step checked before any trial, the state captured and put
back around the search (one search at a time per process), the facts the report describes the job
with, and the C++ search run with the eager trial as its probe (`_Session.run`)."""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import torch

from . import _core
from ._collectives import refuse_collective_modules
from ._errors import UsageError
from ._fingerprint import _code_digest, fingerprint
from ._loader import is_loader
from ._loader import loader_batches as loader_batches_of
from ._meter import Meter
from ._optimizers import _impl, _optimizer_factory
from ._option_checks import _check_one_step, _outside_note
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
from ._state import ModelState, example_tensors, live_storages, local_tensor
from ._survivors import Survivors
from ._trial import EagerProbe, leading_size

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
    *,
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
    """find()'s search options, checked, as the C++ search takes them (_core.search); by keyword
    only, as find() names them. Raises UsageError naming the option and what was expected."""
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
        loader_batches=None,
    ):
        # The job's DataLoader in place of an example batch: its costliest samples (_loader.py).
        self.loader = None
        if is_loader(example_batch):
            self.loader = loader_batches_of(example_batch, loader_batches)
            example_batch = self.loader.example
            if dataset_size is None:
                dataset_size = self.loader.dataset_size
        elif loader_batches is not None:
            raise UsageError(
                f"loader_batches: only with a DataLoader as the example batch (the batches of "
                f"its IterableDataset to read), but the example is a "
                f"{type(example_batch).__name__}"
            )
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
            memory_limit=memory_limit,
            reserve=reserve,
            fraction=fraction,
            margin_bytes=margin_bytes,
            min_batch=min_batch,
            max_batch=max_batch,
            dataset_size=dataset_size,
            strategy=strategy,
            plan=plan,
            target_batch=target_batch,
            world_size=world_size,
            time_limit=time_limit,
            max_trials=max_trials,
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
            **({"loader": _loader_key(self.loader)} if self.loader else {}),
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
            if self.loader is not None:
                meter.notes.append(self.loader.note())
                if self.loader.collation == "concatenates":
                    probe.batches = self.loader.make
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


def _loader_key(loader):
    """The loader's part of the result cache's key: how its batches were made and what bound
    them (its example's shapes are keyed as an example batch's)."""
    return (loader.collation, loader.scope, loader.samples, sorted(loader.binding.items()))


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
