"""autobatch.find_ddp: a DistributedDataParallel job sized from inside it (issue 43 item 3, "DDP
goes the same way" as find_sharded's job path, _in_job.py).

1. Each rank sizes itself: find() on the bare module with `ddp=True` (every trial holds one
   buffer of the gradient bytes, as DDP's reducer holds its buckets from construction, also with
   gradient_as_bucket_view: the buckets then hold the gradients), no
   collective in its step (find's CollectiveGuard refuses one), so no rank ever waits for another
   that tries another batch or failed.
2. The ranks agree on the smallest safe micro-batch through the job's store (_ranks.py).
3. One real lock-step step verifies it: the module wrapped in DistributedDataParallel over a new
   group of the job's backend whose timeout is `verify_timeout` (the reducer's real buckets, the
   backend's real all-reduce), `steps_per_trial` steps at the agreed micro-batch under the same
   memory limit; outcomes exchanged through the store, so a rank that fails that step ends every
   rank with one ModelError within 3 x `verify_timeout` seconds at most (checked on gloo). Then the
   wrapper and the group are
   gone and the module is put back as find() leaves it (weights, gradients, flags, RNG states).

Why not DDP over a fake group in the search, as find_sharded shards over one: the reducer
allocates its buckets when it is built, before the search's meter exists, and outside the module's
tensors, so on the CPU budget its buckets would go uncounted; the emulated bucket is the same
bytes (the trained parameters' gradient bytes) held for the same time, and the verification runs
the real reducer.
"""

from __future__ import annotations

import gc
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .._errors import UsageError
from .._find import find
from .._options import _device_of
from .._ranks import plan_at, search_and_agree
from .._result import Plan, Result
from .._state import ModelState
from ._in_job import check_timeout

_OURS = ("process_group", "device_mesh")  # the verification's group, set here


@dataclass
class JobResult:
    """What find_ddp answered on this rank.

    Attributes:
        rank (int): this process's rank in the job.
        world_size (int): the job's ranks.
        micro_batch (int): the micro-batch every rank agreed on (the smallest of the ranks'
            safe micro-batches, samples) and verified by one real DDP step.
        plan (Plan | None): the plan for target_batch at micro_batch over the job's ranks (None
            without a target).
        result (Result): this rank's own search (its trials, report and memory: it may allow
            more than the agreed micro-batch); its JSON report has a "job" section.
        verified (bool): the agreed micro-batch was verified by the real DDP step (always True
            on a returned JobResult: a failed verification raises).

    Examples:
        >>> r = autobatch.find_ddp(model, example_batch, target_batch=1024)
        >>> r.micro_batch, r.plan.accumulation_steps
        >>> print(r)
    """

    rank: int
    world_size: int
    micro_batch: int
    plan: Optional[Plan]
    result: Result = field(repr=False)
    verified: bool = True

    @property
    def safe_micro_batch(self) -> int:
        """The same as micro_batch: the agreed, verified micro-batch (samples)."""
        return self.micro_batch

    def to_dict(self) -> dict:
        """The JSON section "job" of this rank's report (docs/report.md): plain data.

        Returns:
            dict: kind ("ddp"), rank, world_size, agreed_micro_batch, verified,
            own_safe_micro_batch and own_max_micro_batch (this rank's own search).
        """
        return {
            "kind": "ddp",
            "rank": self.rank,
            "world_size": self.world_size,
            "agreed_micro_batch": self.micro_batch,
            "verified": self.verified,
            "own_safe_micro_batch": self.result.safe_micro_batch,
            "own_max_micro_batch": self.result.max_micro_batch,
        }

    def __str__(self) -> str:
        """A text summary: the agreed micro-batch, this rank's own answer, the plan."""
        lines = [
            f"DDP job: world size {self.world_size}, agreed micro-batch {self.micro_batch}, "
            f"verified by one real DDP step on every rank; this rank ({self.rank}) alone: "
            f"safe {self.result.safe_micro_batch}, max {self.result.max_micro_batch}"
        ]
        if self.plan is not None:
            lines.append(f"  {self.plan}")
        return "\n".join(lines)


def find_ddp(
    model: torch.nn.Module,
    example_batch: Any,
    *,
    ddp_kwargs: Optional[dict] = None,
    verify_timeout: float = 120,
    **options: Any,
) -> JobResult:
    """Sizes the micro-batch of a DistributedDataParallel job from inside it.

    Every rank of torchrun calls it after init_process_group, with its module before it is
    wrapped. 0. The ranks compare what their plans depend on (the model's fingerprint, the
    example's inputs, the step, loss and optimizer by their code, the plan options, ddp_kwargs);
    a difference is a UsageError on every rank. 1. Each rank sizes itself with find(model,
    example_batch, ddp=True): every trial holds DDP's gradient buckets, and no collective runs
    in a trial. 2. The ranks agree on the smallest safe micro-batch through the job's store (no
    collective). 3. One real lock-step step at it verifies it: the module wrapped in
    DistributedDataParallel over a new group of the job's backend, `steps_per_trial` steps under
    the same memory limit. Then the wrapper and its group are gone and the module is put back
    as find() leaves it (see the module's docstring; docs/sharded.md, "DDP jobs").

    Side effects: find()'s; the module is restored after the verification step (weights bitwise:
    DDP's broadcast from rank 0 and the steps' updates undone), and the group made for the
    verification is destroyed.

    Args:
        model (torch.nn.Module): the module the job wraps in DistributedDataParallel, on this
            rank's device, not yet wrapped (find_ddp wraps it itself for the verification, then
            unwraps).
        example_batch (Any): one batch whose samples are repeated, as for find().
        ddp_kwargs (dict | None): the job's DistributedDataParallel arguments (bucket_cap_mb,
            gradient_as_bucket_view, static_graph, find_unused_parameters, ...), checked by
            name, type and value before the search; not module, process_group or device_mesh
            (the verification's own), nor delay_all_reduce_named_params,
            param_to_hook_all_reduce or mixed_precision (their hooks outlive the wrapper); no
            device_ids or output_device for a CPU module. The search holds DDP's bucket with or
            without gradient_as_bucket_view. Default None: {}.
        verify_timeout (float): seconds the verification's collectives wait for a rank, > 0
            and at most 1e6 (default 120); every rank ends within 3 x that at most when a rank
            fails the step (on gloo; NCCL's watchdog may abort a rank first). The user's
            `step(model, batch)` receives the DistributedDataParallel wrapper in the
            verification, as in the job.
        **options (Any): find()'s options (optimizer, step or loss_fn, precision,
            memory_limit, margin, target_batch: the global batch over all ranks, a multiple of
            the world size, ...); not world_size (the job's), ddp (always True here) or eval
            (the verification trains).

    Returns:
        JobResult: the agreed, verified micro-batch (`micro_batch`), the plan over the job's
        ranks (`plan`), and this rank's own search (`result`).

    Raises:
        UsageError: bad arguments; outside a running job (before the job, size one rank with
            find(model, example_batch, ddp=True, world_size=N): a DDP rank's memory does not
            depend on N); a module already wrapped in DistributedDataParallel; ranks that
            disagree on a compared field (naming it, the ranks and both values).
        AutobatchError: what find() raises for this rank (DoesNotFit, ModelError, ...); on the
            other ranks an error naming each rank that failed to size and its error ("another
            rank did not size (rank 1: UsageError: ...)": the arguments are checked inside the
            search, so a rank that refuses its own still answers the agreement).
        ModelError: on every rank when the verification step fails on any (its message names
            the rank and its error).

    Examples:
        >>> dist.init_process_group("nccl")  # torchrun's rank and world size
        >>> model = MyModel().to(device)
        >>> r = autobatch.find_ddp(model, example_batch, target_batch=1024,
        ...                        optimizer=lambda p: torch.optim.AdamW(p),
        ...                        ddp_kwargs={"bucket_cap_mb": 25})
        >>> model = DDP(model, bucket_cap_mb=25)  # then the job as it was
        >>> micro_batch, steps = r.plan.micro_batch_size, r.plan.accumulation_steps
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "fake":
        _checked(model, ddp_kwargs, verify_timeout, options)  # a bad argument's own error first
        raise UsageError(
            "find_ddp runs inside a running job: every rank of torchrun calls it "
            "after dist.init_process_group(); before the job, size one rank with "
            "autobatch.find(model, example_batch, ddp=True, world_size=N) (a DDP "
            "rank's memory does not depend on N)"
        )
    rank, n = dist.get_rank(), dist.get_world_size()
    checked = {}

    def search():
        # The arguments are checked inside the search: a rank that refuses its own (one rank's
        # ddp_kwargs differ) still reaches the agreement, so no rank waits for it and every
        # rank's error names it; the agreements' rounds stay in step for a later call.
        checked.update(_checked(model, ddp_kwargs, verify_timeout, options))
        # ddp=True whatever gradient_as_bucket_view says: with it, the buckets still exist from
        # the wrapper's construction and hold the gradients as views, so a search without the
        # bucket would undercount (an answer the real step then ran out of memory at).
        return find(
            model,
            example_batch,
            ddp=True,
            world_size=n,
            device=checked["device"],
            **checked["options"],
        )

    def job():  # what the ranks compare before any trial (_ranks.compare_job)
        from .._find import job_fields
        from .._fingerprint import fingerprint

        # A rank's bad argument is its own error (raised by its search), not a difference.
        _checked(model, ddp_kwargs, verify_timeout, options)
        return job_fields(
            fingerprint(model, example_batch),
            example_batch,
            {**options, "ddp_kwargs": sorted((ddp_kwargs or {}).items())},
        )

    result, agreed = search_and_agree(search, n, None, "find_ddp", job=job)
    options, device = checked["options"], checked["device"]
    _verify(model, example_batch, checked["kwargs"], options, device, agreed, verify_timeout)
    plan = plan_at(agreed, options, n)
    out = JobResult(rank, n, agreed, plan, result)
    result.raw["job"] = out.to_dict()
    return out


def _checked(model, ddp_kwargs, verify_timeout, options):
    """{"kwargs", "options", "device"}: the arguments checked (UsageError for a bad one)."""
    for name, why in (
        ("world_size", "the job's number of ranks"),
        ("ddp", "always True here (DDP's buckets are held by every trial)"),
    ):
        if name in options:
            raise UsageError(f"find_ddp: {name} is {why}; drop {name}=")
    if options.get("eval") not in (None, False):
        raise UsageError(
            "eval: find_ddp sizes and verifies the training step only; size the "
            "evaluation batch with find(model, example_batch, eval=...) on a rank"
        )
    check_timeout(verify_timeout)
    kwargs = _ddp_kwargs(ddp_kwargs, model)
    options = dict(options)
    device = _device_of(model, options.pop("device", None))
    for key in ("device_ids", "output_device"):  # DDP takes neither for a CPU module
        if device.type != "cuda" and kwargs.get(key) is not None:
            raise UsageError(
                f"ddp_kwargs: {key} is for a module on one CUDA device, and this "
                f"one is on {device}; drop {key} (DDP takes none for a CPU module)"
            )
    return {"kwargs": kwargs, "options": options, "device": device}


def _ddp_kwargs(ddp_kwargs, model):
    """The job's DDP arguments as a dict, checked against DistributedDataParallel's signature."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model: expected a torch.nn.Module, but got {type(model).__name__}")
    if isinstance(model, DistributedDataParallel):
        raise UsageError(
            "model: it is already wrapped in DistributedDataParallel, whose reducer "
            "runs an all-reduce in every backward (the ranks' searches would wait for "
            "each other); pass the module before wrapping it (model.module here), "
            "and the wrapper's arguments as ddp_kwargs="
        )
    if ddp_kwargs is None:
        return {}
    if not isinstance(ddp_kwargs, dict):
        raise UsageError(
            f"ddp_kwargs: expected a dict of DistributedDataParallel's arguments, "
            f"e.g. {{'bucket_cap_mb': 25}}, but got {type(ddp_kwargs).__name__}"
        )
    ours = [k for k in ddp_kwargs if k in _OURS or k == "module"]
    if ours:
        raise UsageError(
            f"ddp_kwargs: {ours[0]} is find_ddp's own (the verification runs on a "
            "group of its own, then destroys it); drop it"
        )
    try:
        inspect.signature(DistributedDataParallel.__init__).bind(None, model, **ddp_kwargs)
    except TypeError as e:
        raise UsageError(
            f"ddp_kwargs: not DistributedDataParallel's arguments in torch "
            f"{torch.__version__} ({e})"
        ) from None
    for key, value in ddp_kwargs.items():
        _check_value(key, value)
    return dict(ddp_kwargs)


# DistributedDataParallel's flags (torch 2.11): a value of another type fails only inside its
# constructor, in the verification after the whole search (a string is truthy).
_FLAGS = (
    "broadcast_buffers",
    "init_sync",
    "find_unused_parameters",
    "check_reduction",
    "gradient_as_bucket_view",
    "static_graph",
    "skip_all_reduce_unused_params",
)
# Arguments that install hooks on the module or its parameters which outlive the wrapper
# (torch 2.11 distributed.py: _delayed_all_reduce_hook on a parameter, mixed precision's
# forward-pre-hooks on every submodule): the module would not be put back as it was.
_REFUSED = ("delay_all_reduce_named_params", "param_to_hook_all_reduce", "mixed_precision")


def _check_value(key, value):
    if key in _REFUSED and value is not None:
        raise UsageError(
            f"ddp_kwargs: {key} is not supported by find_ddp: DDP installs hooks "
            "for it on the module or its parameters that outlive the wrapper, so "
            "the module could not be put back as it was; size without it"
        )
    if key in _FLAGS and not isinstance(value, bool):
        raise UsageError(f"ddp_kwargs: {key} expects True or False, but got {value!r}")
    if (
        key == "bucket_cap_mb"
        and value is not None
        and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value > 0
            or not math.isfinite(value)
        )
    ):  # inf would fail only in the verification, after the search
        raise UsageError(
            f"ddp_kwargs: bucket_cap_mb expects megabytes > 0 (DDP's default is "
            f"25), but got {value!r}"
        )
    if (
        key == "bucket_cap_mb_list"
        and value is not None
        and (
            not isinstance(value, (list, tuple))
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        )
    ):
        raise UsageError(
            f"ddp_kwargs: bucket_cap_mb_list expects a list of megabytes > 0, but got {value!r}"
        )


def _verify(model, example_batch, kwargs, options, device, micro_batch, timeout_s):
    """The real lock-step DDP step (_in_job.verify), the module put back after it."""
    from torch.nn.parallel import DistributedDataParallel

    from ._in_job import verify

    state = ModelState(model, example_batch)
    state.detach_grads()  # the user's gradients are put back, untouched by the steps
    wrapped = []

    def build_on(group):
        model.train()  # as find()'s trials; put back with the rest
        wrapped.append(DistributedDataParallel(model, process_group=group, **kwargs))
        return wrapped[-1]

    try:
        verify(
            build_on,
            example_batch,
            options,
            device,
            micro_batch,
            timeout_s,
            who="find_ddp",
            setup_bytes=state.untracked_bytes,
        )
    finally:
        wrapped.clear()  # the reducer's buckets and hooks go with the wrapper
        gc.collect()
        state.restore()
