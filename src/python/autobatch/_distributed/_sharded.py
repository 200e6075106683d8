"""autobatch.find_sharded: one rank of an FSDP2 job of any world size, sized from one process
(issue 43, docs/sharded.md "Sharded jobs").

torch's fake process group (`dist.init_process_group("fake", rank=r, world_size=N)`) runs no
collective, yet FSDP2 (`fully_shard`) allocates what rank r of a world of N allocates: its padded
parameter shard, the all-gather outputs of the unsharded parameters, the reduce-scatter inputs of
the gradients, the sharded gradients, and an optimizer state built from the shard. The model is
built on the meta device, sharded by the user's own function, and materialized with `to_empty`:
only rank r's shard is ever allocated, so one device holds one rank of a job far larger than
itself. The search is find()'s, with the user's real step on the real device.

Which ranks are sized: FSDP2 splits dim 0 of each parameter (or the dim the user's
`shard_placement_fn` names) in chunks of ceil(d/N) rows, as torch.chunk does; ranks whose local
row counts are equal for every parameter allocate the same, and a rank whose every shard is no
larger than another's allocates no more than it (each of FSDP2's per-rank allocations follows the
local shard; the all-gather and reduce-scatter buffers are the same on every rank). So the ranks
sized are the largest of the classes no other class covers, at most three, and the answer is the
smallest of their safe micro-batches.

Inside a running job (a real default process group): every rank sizes itself beside it, the ranks
agree, and one real step verifies (_in_job.py).

Not measured here: the collective backend's own buffers (gloo's, NCCL's), which the fake group
never allocates; the result says so. Against real torchrun jobs on gloo, the rest of each rank's
peak (FSDP2's and the step's) equals the emulation's to the byte (scripts/bench/fsdp_fidelity.py,
docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union, overload

import torch

from .._errors import DoesNotFit, ModelError, UsageError
from .._find import find
from .._options import _checked_device, _count, _target
from .._session import _check_arity, check_option_names
from ._layout import (
    _build,
    _mesh,
    fake_group,
    layout,
    local_bytes,
    rank_classes,
    ranks_to_size,
    reset_parameters,
)
from ._sharded_result import RankResult, ShardedResult, ShardedTable, _span

# ---- find_sharded -------------------------------------------------------------------------


@overload
def find_sharded(
    build: Callable[[], torch.nn.Module],
    shard: Callable[..., Any],
    example_batch: Any,
    *,
    world_size: Union[List[int], Tuple[int, ...]],
    ranks: Optional[Sequence[int]] = None,
    init: Optional[Callable[..., Any]] = None,
    device: Union[str, torch.device, None] = None,
    verify_timeout: float = 120,
    **options: Any,
) -> ShardedTable: ...


@overload
def find_sharded(
    build: Callable[[], torch.nn.Module],
    shard: Callable[..., Any],
    example_batch: Any,
    *,
    world_size: Optional[int] = None,
    ranks: Optional[Sequence[int]] = None,
    init: Optional[Callable[..., Any]] = None,
    device: Union[str, torch.device, None] = None,
    verify_timeout: float = 120,
    **options: Any,
) -> ShardedResult: ...


def find_sharded(
    build: Callable[[], torch.nn.Module],
    shard: Callable[..., Any],
    example_batch: Any,
    *,
    world_size: Union[int, List[int], Tuple[int, ...], None] = None,
    ranks: Optional[Sequence[int]] = None,
    init: Optional[Callable[..., Any]] = None,
    device: Union[str, torch.device, None] = None,
    verify_timeout: float = 120,
    **options: Any,
) -> Union[ShardedResult, ShardedTable]:
    """Sizes the ranks of an FSDP2 job of `world_size` ranks from this one process.

    torch's fake process group (`init_process_group("fake", rank=r, world_size=N)`) runs no
    collective, yet FSDP2 allocates what rank r of N allocates: its padded parameter shard, the
    all-gather outputs, the reduce-scatter inputs, the sharded gradients and the optimizer state
    built from the shard. The model is built on the meta device, sharded by `shard`,
    materialized with `to_empty` (only rank r's shard is allocated) and initialized by `init`;
    then find() searches with the user's real step on the real device. The ranks sized are the
    shard classes no other covers (at most three; rank 0 alone with dim-0 sharding), and the
    answer is the smallest of their safe micro-batches. See the module's docstring and
    docs/sharded.md, "Sharded jobs". Not measured: the collective backend's own buffers (give
    `margin=` room for them).

    Inside a running job (every rank of torchrun calls it after init_process_group, with
    world_size=None): each rank sizes itself with its model sharded over a fake group made
    beside the real one, the ranks agree on the smallest safe micro-batch through the job's
    store, and one real lock-step step at it verifies it on every rank (_in_job.py).

    Side effects: find()'s, for each rank sized; the fake group is set up and torn down here
    (the process is left without one), with sys.excepthook and torch's random state as they
    were. The errors of build, shard and init propagate unchanged (the group torn down first).

    Args:
        build (Callable[[], torch.nn.Module]): `build() -> torch.nn.Module`, called under
            torch.device("meta") (nothing allocated): the model's constructor as the training
            job calls it (e.g. `LlamaForCausalLM(config)`, not from_pretrained).
        shard (Callable[..., Any]): `shard(model, mesh)`: the job's own fully_shard calls on
            the 1-D DeviceMesh of `world_size` ranks it is given (units, MixedPrecisionPolicy,
            reshard_after_forward, OffloadPolicy), e.g. `for b in model.layers:
            fully_shard(b, mesh=mesh)`, then `fully_shard(model, mesh=mesh)`.
        example_batch (Any): one sample (or a few) on `device`, as for find().
        world_size (int | list[int] | tuple[int, ...] | None): the job's ranks, an int from 1
            to 2^20 (far beyond this machine: only one rank's shard is allocated), or a list of
            them ([8, 64, 512]): then a ShardedTable, one measured row per world size. None
            (default): the running job's; outside a job that is a UsageError.
        ranks (Sequence[int] | None): which ranks to size, each below every world size; the
            answer then covers the ranks named only. Default None: derived from the shard
            layout. Not inside a job (each rank sizes itself).
        init (Callable[..., Any] | None): `init(model)` after `to_empty`, under no_grad.
            Default None: each module's reset_parameters() (buffers built in a constructor,
            such as position ids, keep what to_empty left: fill them here when the step indexes
            with them).
        device (str | torch.device | None): where the rank runs. Default None: CUDA's current
            device when CUDA is available, else the CPU.
        verify_timeout (float): inside a job, the seconds the verification step's collectives
            wait for a rank, > 0 and at most 1e6 (default 120); a rank that fails that step
            ends every rank within 3 x verify_timeout at most, with a ModelError naming it.
        **options (Any): find()'s options (optimizer, step or loss_fn, precision,
            memory_limit, margin, target_batch: the global batch over all ranks, a multiple of
            every world size; time_limit, max_trials, eval, ...), not world_size, ddp or cache.
            time_limit and max_trials bound each rank's search in turn, not the whole call.
            eval=True also sizes each rank's evaluation batch beside its training state,
            eval="only" the evaluation batch alone (the parameters resident); the result's
            eval_safe_batch / eval_max_batch are the smallest over the ranks sized.

    Returns:
        ShardedResult | ShardedTable: for one world size a ShardedResult (`micro_batch`,
        `plan`, every rank sized, the layout; in a job the agreed, verified micro-batch), for a
        list a ShardedTable with one ShardedResult per world size.

    Raises:
        UsageError: bad arguments (a build that allocates outside the meta device, a shard
            that shards nothing or on another mesh, a target not a multiple of a world size,
            ...), a call outside the main thread (after FSDP2 has sharded on fake tensors in
            another thread, torch crashes the next call), a process already in a fake process
            group, or outside a job without world_size; inside a job, also another rank's bad
            arguments, named.
        DoesNotFit: nothing fits for a rank (the message names the world size and the rank).
        ModelError: the step raised an error that is not out of memory (naming the world size
            and rank); inside a job, on every rank when the verification step fails on any.
        Cancelled: Ctrl-C, as for find().

    Examples:
        >>> def build():
        ...     return LlamaForCausalLM(config)
        >>> def shard(model, mesh):
        ...     for layer in model.model.layers:
        ...         fully_shard(layer, mesh=mesh)
        ...     fully_shard(model, mesh=mesh)
        >>> r = autobatch.find_sharded(build, shard, {"input_ids": ids, "labels": ids},
        ...                            world_size=64, target_batch=1024,
        ...                            optimizer=lambda p: torch.optim.AdamW(p))
        >>> r.micro_batch, r.plan
    """
    in_job = _in_job()
    if not in_job:
        _refuse_worker_thread()
    try:
        world_size, sizes, ranks, init, device = _checked(
            build, shard, world_size, ranks, init, device, verify_timeout, options
        )
    except UsageError as e:
        if in_job:  # one rank's bad argument: it still joins the others' steps, then all raise
            from ._in_job import join_and_raise

            join_and_raise(e)
        raise

    if in_job:
        return _size_in_job(
            build, shard, init, device, example_batch, world_size, ranks, verify_timeout, options
        )
    # The caller's random state as it was: init (reset_parameters by default) draws from it
    # outside find()'s own snapshot (else a seeded job that sized first would build other
    # weights)
    with _random_state_kept():
        if isinstance(world_size, (list, tuple)):
            return ShardedTable(
                [
                    _size_world(w, build, shard, init, device, example_batch, ranks, options)
                    for w in sizes
                ]
            )
        return _size_world(sizes[0], build, shard, init, device, example_batch, ranks, options)


def _eval_state(value):
    """find()'s eval= in the report's words ("" when absent or False)."""
    return (
        {True: "training-resident", "only": "parameters-only"}.get(value, "")
        if value is not False and value is not None
        else ""
    )


def _refuse_worker_thread():
    """UsageError outside the main thread: after fully_shard has run on fake tensors in a worker
    thread (an executor, a notebook's background thread), the next call in any thread crashes
    the process inside torch's fake-tensor code (a segmentation fault, torch 2.11; torch alone
    reproduces it), so it is never run there."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        raise UsageError(
            f"find_sharded: called in the thread {threading.current_thread().name!r}, not the "
            "main thread; it shards the model with FSDP2 on fake tensors, and after that has run "
            "in another thread the next call crashes the process inside torch (a segmentation "
            "fault), so it runs in the main thread only: call it there, or in a subprocess "
            "(multiprocessing with the 'spawn' start method)"
        )


@contextlib.contextmanager
def _random_state_kept():
    """torch's CPU generator and, where CUDA is initialized, its devices' put back afterwards."""
    cpu = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


_MAX_WORLD = 1 << 20


def _check_signatures(build, init):
    """find_sharded's callables checked against how they are called (UsageError naming the
    function and its signature)."""
    for fn, name, args, form in (
        (build, "build", (), "build() -> torch.nn.Module"),
        (init, "init", (None,), "init(model)"),
    ):
        try:
            if callable(fn):
                inspect.signature(fn).bind(*args)
        except TypeError:
            raise UsageError(
                f"{name}: expected a function called as {form}, but its signature "
                f"is {inspect.signature(fn)}"
            ) from None
        except ValueError:  # a builtin without a signature: tried as it is
            pass


def _checked(build, shard, world_size, ranks, init, device, verify_timeout, options):
    """find_sharded's arguments checked (UsageError for a bad one): (world_size, the world sizes
    in order, ranks, init, device)."""
    if "world_size" in options or "ddp" in options:
        raise UsageError(
            "find_sharded: world_size is the job's (the fake group's), given once; "
            "ddp does not apply to a sharded model"
        )
    check_option_names(options, find, "find_sharded", leave_out=("device",))
    _check_signatures(build, init)
    if options.get("cache") not in (None, False):
        raise UsageError(
            "cache: find_sharded does not use the result cache (its key holds "
            "neither the world size nor the rank's shard); drop cache="
        )
    from ._in_job import check_timeout

    check_timeout(verify_timeout)
    if _in_job():
        from ._in_job import check_job

        check_job(world_size, ranks)
        world_size = torch.distributed.get_world_size()
    elif world_size is None:
        raise UsageError(
            "world_size: expected the job's number of ranks (an int >= 1, or a list "
            "of them for a table); None means the running job's, and this process "
            "is in no process group"
        )
    sizes = world_size if isinstance(world_size, (list, tuple)) else [world_size]
    # each once, in order; at most 2^20 ranks: torch's fake group keeps a table over every rank
    # (2^31 - 1 exhausts a machine's memory in init_process_group, and 2^31 reaches its
    # constructor's cast)
    sizes = list(dict.fromkeys(_count(w, "world_size", maximum=_MAX_WORLD) for w in sizes))
    if not sizes:
        raise UsageError("world_size: expected an int >= 1 or a non-empty list of them, but got []")
    for fn, name, form, example in (
        (build, "build", "build() -> torch.nn.Module", "lambda: MyModel(config)"),
        (
            shard,
            "shard",
            "shard(model, mesh)",
            "lambda model, mesh: [fully_shard(b, mesh=mesh) for b in model.layers] and "
            "fully_shard(model, mesh=mesh)",
        ),
    ):
        if not callable(fn):
            raise UsageError(
                f"{name}: expected a function {form}, but got {type(fn).__name__}; e.g. {example}"
            )
    _check_arity(
        shard, "shard", "shard(model, mesh)", "lambda model, mesh: fully_shard(model, mesh=mesh)"
    )
    if init is not None and not callable(init):
        raise UsageError(f"init: expected a function init(model), but got {type(init).__name__}")
    device = _checked_device(
        device if device is not None else "cuda" if torch.cuda.is_available() else "cpu"
    )
    init = init or reset_parameters
    target = _target(options.get("target_batch"))
    for w in sizes:  # every world size's plan is possible, before any search
        if target and target % w:
            raise UsageError(
                f"target_batch: {target} is not a multiple of the world size {w} "
                "(every rank takes an equal share)"
            )
    if ranks is not None:
        if not isinstance(ranks, (list, tuple)):
            raise UsageError(f"ranks: expected a list of ranks, e.g. [0, 63], but got {ranks!r}")
        ranks = list(dict.fromkeys(_count(r, "ranks[]", minimum=0) for r in ranks))
        if not ranks or any(r >= min(sizes) for r in ranks):
            raise UsageError(
                f"ranks: expected a non-empty list of ranks below every world size "
                f"({min(sizes)}), but got {ranks!r}"
            )
    return world_size, sizes, ranks, init, device


def _in_job():
    """True inside a running job: a real (not fake) default process group exists."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_backend() != "fake"


def _size_in_job(build, shard, init, device, example_batch, world_size, ranks, timeout, options):
    """Every rank of a running job sizes itself, the ranks agree, one real step verifies
    (_in_job.py); the result is this rank's, with the agreed micro-batch."""
    from ._in_job import size_on_job

    dist = torch.distributed
    rank, n = dist.get_rank(), dist.get_world_size()
    padded_local = []

    def build_on(mesh):
        model = _build(build, shard, init, device, mesh)
        params, padded = layout(model, n)
        padded_local[:] = [padded, sum(local_bytes(params, n, rank))]
        return model

    def job():  # what the ranks compare before any trial (_ranks.compare_job)
        from .._find import job_fields
        from .._session import _code_digest, _name

        digest = " ".join(f"{_name(f)} {_code_digest(f)}" for f in (build, shard, init))
        return job_fields(digest, example_batch, options)

    result, agreed = size_on_job(build_on, example_batch, options, device, timeout, job)
    from .._ranks import plan_at

    plan = plan_at(agreed, options, n)
    out = ShardedResult(
        n,
        rank,
        [RankResult(rank, [rank], *padded_local, result)],
        [],
        agreed_micro_batch=agreed,
        agreed_plan=plan,
    )
    out.result.raw["sharded"] = out.to_dict()
    return out


def _size_world(n, build, shard, init, device, example_batch, ranks, options):
    """One world size: the layout from a build on the meta device (nothing allocated), then a
    search per rank to size."""
    with fake_group(0, n):
        params, padded = layout(
            _build(build, shard, init, device, _mesh(device, n), materialize=False), n
        )
    classes = rank_classes(params, n)
    todo = list(ranks) if ranks is not None else [rs[0] for _, rs in ranks_to_size(classes)]
    sized = []
    for rank in todo:
        with fake_group(rank, n):
            model = _build(build, shard, init, device, _mesh(device, n))
            try:
                try:
                    result = find(model, example_batch, world_size=n, device=device, **options)
                except (DoesNotFit, ModelError) as e:
                    # which rank of which world size (a table's failing row says neither
                    # otherwise); the same class, its result and cause kept
                    e.args = (f"world size {n}, rank {rank}: {e.args[0]}",) + e.args[1:]
                    raise
                alike = next(rs for _, rs in classes if rank in rs)
                sized.append(
                    RankResult(rank, alike, padded, sum(local_bytes(params, n, rank)), result)
                )
            finally:
                del model
                gc.collect()
    binding = min(sized, key=lambda r: (r.result.safe_micro_batch, r.rank)).rank
    table = [
        {"ranks": _span(rs), "count": len(rs), "local_parameter_bytes": sum(sig)}
        for sig, rs in classes
    ]
    out = ShardedResult(n, binding, sized, table, eval=_eval_state(options.get("eval")))
    out.result.raw["sharded"] = out.to_dict()  # the binding rank's JSON report carries it
    return out
