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
agree, and one real step verifies (_sharded_job.py).

Not measured here: the collective backend's own buffers (gloo's, NCCL's), which the fake group
never allocates; the result says so. Against real torchrun jobs on gloo, the rest of each rank's
peak (FSDP2's and the step's) equals the emulation's to the byte (scripts/bench/fsdp_fidelity.py,
docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union, overload

import torch

from . import _fsdp
from ._errors import DoesNotFit, ModelError, UsageError
from ._find import _check_arity, check_option_names, find
from ._options import _checked_device, _count, _target
from ._result import Plan, Result

BACKEND_NOT_MEASURED = (
    "the collective backend's own buffers: the fake process group runs no collective. On gloo "
    "they are what it allocates inside each collective's call and on its worker threads "
    "(scripts/bench/fsdp_fidelity.py: 0 to 2.1 MB of a 14 MB rank peak on a small MLP, varying "
    "with the run's timing; 0 on a tiny Llama); on NCCL they are not measured. Keep that room, "
    "or verify on the real job"
)


@dataclass
class RankResult:
    """One sized rank of a ShardedResult.

    Attributes:
        rank (int): the rank sized, 0 to world size - 1.
        ranks_alike (list[int]): the ranks whose shards are alike (the class it stands for).
        parameter_bytes (int): the padded parameter shard FSDP2 allocates, bytes (every rank:
            ceil(d0/N) rows per parameter).
        local_parameter_bytes (int): the bytes of the rows this rank owns (less on the last
            ranks).
        result (Result): find()'s Result for the rank (its trials, plan and memory).

    Examples:
        >>> r = autobatch.find_sharded(build, shard, example, world_size=64)
        >>> [(x.rank, x.parameter_bytes, x.result.safe_micro_batch) for x in r.ranks]
    """

    rank: int
    ranks_alike: List[int]
    parameter_bytes: int
    local_parameter_bytes: int
    result: Result = field(repr=False)


@dataclass
class ShardedResult:
    """What find_sharded measured for one world size.

    `micro_batch`, `max_micro_batch`, `safe_micro_batch` and `plan` are the binding rank's (the
    sized rank with the smallest safe micro-batch): every rank of the job can train with them;
    inside a running job, the micro-batch the ranks agreed on and verified. `str(r)` is a text
    report; `to_dict()` the JSON section "sharded".

    Attributes:
        world_size (int): the job's ranks.
        binding_rank (int): the sized rank with the smallest safe micro-batch (in a job: this
            rank).
        ranks (list[RankResult]): every rank sized.
        layout (list[dict]): the classes of ranks whose shards are alike, largest first:
            {"ranks": [first, last], "count", "local_parameter_bytes"} ([] in a job).
        backend (str): what is not measured (the collective backend's own buffers).
        agreed_micro_batch (int): inside a running job, the micro-batch the ranks agreed on and
            verified by a real step; 0 otherwise.
        agreed_plan (Plan | None): inside a job, the plan for target_batch at it.
        eval (str): find()'s eval= as given: "" (training only), "training-resident" (eval=True)
            or "parameters-only" (eval="only": micro_batch and max_micro_batch are then the
            evaluation batch's, as find()'s Result gives them).

    Examples:
        >>> r = autobatch.find_sharded(build, shard, example, world_size=64, target_batch=1024)
        >>> r.micro_batch, str(r.plan)
        >>> print(r)  # per sized rank: its shard, optimizer state, max and safe micro-batch
    """

    world_size: int
    binding_rank: int
    ranks: List[RankResult]
    layout: list
    backend: str = BACKEND_NOT_MEASURED
    # inside a running job: the micro-batch the ranks agreed on and verified by a real step, and
    # the plan for target_batch at it (this rank's own `result` may allow more)
    agreed_micro_batch: int = 0
    agreed_plan: Optional[Plan] = None
    # find()'s eval= as given: "" (training only), "training-resident" (eval=True: also the
    # evaluation batch beside the training state) or "parameters-only" (eval="only": the
    # evaluation batch alone; micro_batch and max_micro_batch are then the evaluation's, as
    # find()'s Result gives them)
    eval: str = ""

    @property
    def eval_safe_batch(self) -> int:
        """The evaluation batch every sized rank holds (the smallest of their safe evaluation
        batches); 0 without eval=."""
        return min((r.result.eval_safe_batch for r in self.ranks), default=0) if self.eval else 0

    @property
    def eval_max_batch(self) -> int:
        """The raw evaluation maximum of the rank whose safe evaluation batch binds; 0 without
        eval=."""
        if not self.eval or not self.ranks:
            return 0
        return min(
            self.ranks, key=lambda r: (r.result.eval_safe_batch, r.rank)
        ).result.eval_max_batch

    @property
    def result(self) -> Result:
        """find()'s Result for the binding rank (its trials, plan and report)."""
        return next(r.result for r in self.ranks if r.rank == self.binding_rank)

    @property
    def micro_batch(self) -> int:
        """The micro-batch to train with: the agreed one in a job, else the binding rank's safe
        one."""
        return self.agreed_micro_batch or self.result.safe_micro_batch

    @property
    def safe_micro_batch(self) -> int:
        """The same as micro_batch: the agreed micro-batch in a job, else the binding rank's safe
        one (samples)."""
        return self.agreed_micro_batch or self.result.safe_micro_batch

    @property
    def max_micro_batch(self) -> int:
        """The binding rank's largest micro-batch seen to fit (raw, no headroom), samples."""
        return self.result.max_micro_batch

    @property
    def plan(self) -> Optional[Plan]:
        """The plan for target_batch at micro_batch over the world size (None without a
        target)."""
        return self.agreed_plan if self.agreed_micro_batch else self.result.plan

    def to_dict(self) -> dict:
        """The JSON section "sharded" (docs/report.md): plain data.

        Returns:
            dict: world_size, binding_rank, ranks (each: rank, ranks_alike, parameter_bytes,
            local_parameter_bytes, gradient_bytes, optimizer_state_bytes, max_micro_batch,
            safe_micro_batch, trials), layout, backend_buffers; agreed_micro_batch and verified
            in a job; eval with eval=.
        """
        return {
            "world_size": self.world_size,
            "binding_rank": self.binding_rank,
            "ranks": [
                {
                    "rank": r.rank,
                    "ranks_alike": _span(r.ranks_alike),
                    "parameter_bytes": r.parameter_bytes,
                    "local_parameter_bytes": r.local_parameter_bytes,
                    "gradient_bytes": r.result.memory.get("gradient_bytes", 0),
                    "optimizer_state_bytes": r.result.memory.get("optimizer_state_bytes", 0),
                    "max_micro_batch": r.result.max_micro_batch,
                    "safe_micro_batch": r.result.safe_micro_batch,
                    "trials": len(r.result.trials),
                }
                for r in self.ranks
            ],
            "layout": self.layout,
            "backend_buffers": self.backend,
            **(
                {"agreed_micro_batch": self.agreed_micro_batch, "verified": True}
                if self.agreed_micro_batch
                else {}
            ),
            **(
                {
                    "eval": {
                        "state": self.eval,
                        "safe_batch": self.eval_safe_batch,
                        "max_batch": self.eval_max_batch,
                        "ranks": [
                            {
                                "rank": r.rank,
                                "max_batch": r.result.eval_max_batch,
                                "safe_batch": r.result.eval_safe_batch,
                            }
                            for r in self.ranks
                        ],
                    }
                }
                if self.eval
                else {}
            ),
        }

    def __str__(self) -> str:
        """The text report: the world size, the answer, one line per sized rank, the plan."""
        if self.eval == "parameters-only":
            return self._eval_only_text()
        lines = [
            f"sharded (FSDP2, fake process group): world size {self.world_size}, "
            f"micro-batch {self.safe_micro_batch} (max {self.max_micro_batch}), binding "
            f"rank {self.binding_rank}"
        ]
        if self.eval:
            lines.append(
                f"  evaluation batch {self.eval_safe_batch} (max "
                f"{self.eval_max_batch}) beside the training state, on every rank sized"
            )
        if self.agreed_micro_batch:
            lines[0] = (
                f"sharded (FSDP2, in the job): world size {self.world_size}, agreed "
                f"micro-batch {self.agreed_micro_batch}, verified by one real step on "
                f"every rank; this rank ({self.binding_rank}) alone: safe "
                f"{self.result.safe_micro_batch}, max {self.max_micro_batch}"
            )
        for r in self.ranks:
            lines.append(
                f"  rank {r.rank} (as ranks {_text_span(r.ranks_alike)}): parameter "
                f"shard {r.parameter_bytes} bytes ({r.local_parameter_bytes} its own "
                f"rows), optimizer state "
                f"{r.result.memory.get('optimizer_state_bytes', 0)} bytes, max "
                f"{r.result.max_micro_batch}, safe {r.result.safe_micro_batch}, "
                f"{len(r.result.trials)} trials"
            )
        if self.plan is not None:
            lines.append(f"  {self.plan}")
        lines.append(f"  not measured: {self.backend}")
        return "\n".join(lines)

    def _eval_only_text(self):
        """eval="only": every figure is an evaluation batch's (the parameters alone resident)."""
        lines = [
            f"sharded (FSDP2, fake process group): world size {self.world_size}, "
            f"evaluation batch {self.eval_safe_batch} (max {self.eval_max_batch}) with the "
            f"parameters alone resident (eval='only': no training batch sized)"
        ]
        for r in self.ranks:
            lines.append(
                f"  rank {r.rank} (as ranks {_text_span(r.ranks_alike)}): parameter "
                f"shard {r.parameter_bytes} bytes, evaluation max "
                f"{r.result.eval_max_batch}, safe {r.result.eval_safe_batch}, "
                f"{len(r.result.trials)} trials"
            )
        lines.append(f"  not measured: {self.backend}")
        return "\n".join(lines)


@dataclass
class ShardedTable:
    """find_sharded over several world sizes: one ShardedResult per world size.

    Each row is measured (its own fake group and searches), none extrapolated. `str()` is the
    table; `to_dict()` the JSON, which `scripts/plot_report.py table.json table.png` draws.

    Attributes:
        rows (list[ShardedResult]): one per world size, in the order asked.

    Examples:
        >>> table = autobatch.find_sharded(build, shard, example, world_size=[2, 8, 64],
        ...                                optimizer=lambda p: torch.optim.AdamW(p),
        ...                                target_batch=4096)
        >>> print(table)
        >>> table[64].micro_batch
    """

    rows: List[ShardedResult]

    def __getitem__(self, world_size: int) -> ShardedResult:
        """The row of `world_size`.

        Raises:
            KeyError: the table has no row for that world size.
        """
        for r in self.rows:
            if r.world_size == world_size:
                return r
        raise KeyError(
            f"world size {world_size!r}: the table has {[r.world_size for r in self.rows]}"
        )

    def to_dict(self) -> dict:
        """The table as JSON data: {"world_sizes": [...], "rows": [each row's to_dict() with
        max_micro_batch, safe_micro_batch and the JSON report's plans]}."""
        return {
            "world_sizes": [r.world_size for r in self.rows],
            "rows": [
                {
                    **r.to_dict(),
                    "max_micro_batch": r.max_micro_batch,
                    "safe_micro_batch": r.safe_micro_batch,
                    "plan": r.result.raw.get("plans"),
                }
                for r in self.rows
            ],
        }

    def __str__(self) -> str:
        """The table: per world size, the binding rank, its shard and optimizer state, max and
        safe micro-batch, and the plan."""
        head = (
            f"{'world size':>10} {'rank':>5} {'parameter shard':>16} "
            f"{'optimizer state':>16} {'max':>7} {'safe':>7}  plan"
        )
        lines = ["sharded (FSDP2, fake process group), per rank:", head]
        for r in self.rows:
            b = next(x for x in r.ranks if x.rank == r.binding_rank)
            plan = str(r.plan) if r.plan is not None else "-"
            lines.append(
                f"{r.world_size:>10} {r.binding_rank:>5} {b.parameter_bytes:>16,} "
                f"{b.result.memory.get('optimizer_state_bytes', 0):>16,} "
                f"{r.max_micro_batch:>7} {r.safe_micro_batch:>7}  {plan}"
            )
        lines.append(f"not measured: {self.rows[0].backend}" if self.rows else "")
        return "\n".join(lines)


def _span(ranks):
    return [ranks[0], ranks[-1]] if ranks == list(range(ranks[0], ranks[-1] + 1)) else ranks


def _text_span(ranks):
    s = _span(ranks)
    if len(s) == 2 and s[1] - s[0] + 1 == len(ranks):
        return f"{s[0]}-{s[1]}" if s[0] != s[1] else f"{s[0]}"
    return ", ".join(map(str, s))


# ---- the fake process group ---------------------------------------------------------------


@contextlib.contextmanager
def fake_group(rank: int, world_size: int) -> Iterator[None]:
    """torch's fake process group as rank `rank` of `world_size`, destroyed on leaving."""
    dist = torch.distributed
    if not dist.is_available():
        raise UsageError("find_sharded needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        raise UsageError(
            f"find_sharded sets up its own (fake) process group, and this process is already in "
            f"one (backend {dist.get_backend()!r}, world size {dist.get_world_size()}); destroy "
            "it first (dist.destroy_process_group()). In a running job with a real group, every "
            "rank calls find_sharded with world_size=None instead"
        )
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise UsageError(
            f"find_sharded needs torch's fake process group "
            f"(torch.testing._internal.distributed.fake_pg), which torch "
            f"{torch.__version__} does not import: {e}"
        ) from None
    # torch's init_process_group wraps sys.excepthook with a "[rankN]:" prefix that
    # destroy_process_group never removes (a later error would print "[rank3]: [rank0]:
    # Traceback"); put back with the group. The group is torn down even when
    # init_process_group itself fails (torch sets the default group before some of its errors).
    hook = sys.excepthook
    try:
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        _fsdp.forget_meshes()  # no DTensor op after this may reuse the fake group's mesh
        sys.excepthook = hook


def _build(build, shard, init, device, mesh, materialize=True):
    """The model as this rank of `mesh`'s group: built on the meta device and sharded by the
    user's `shard(model, mesh)`; with `materialize`, moved to `device` with to_empty (only this
    rank's shard is allocated) and initialized by `init`."""
    with torch.device("meta"):
        model = build()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"build: expected a function that returns a torch.nn.Module, but it "
            f"returned {type(model).__name__}"
        )
    where = sorted({str(p.device) for p in model.parameters() if p.device.type != "meta"})
    if where:
        raise UsageError(
            f"build: it is called under torch.device('meta') and must construct the "
            f"model there (nothing allocated, only rank r's shard is materialized), "
            f"but it returned parameters on {where}: construct a fresh model without "
            "device= or a checkpoint (e.g. LlamaForCausalLM(config), not "
            "from_pretrained); load the weights in init= if their values matter"
        )
    shard(model, mesh)
    modules = _fsdp.fsdp_modules(model)
    if not modules:
        raise UsageError(
            "shard: after shard(model, mesh) no module of the model is an FSDP2 "
            "module; call fully_shard(module, mesh=mesh) on each unit and on the "
            "root, e.g. for layer in model.layers: fully_shard(layer, mesh=mesh), "
            "then fully_shard(model, mesh=mesh)"
        )
    group = mesh.get_group().group_name
    other = sorted(
        {
            n
            for n, p in model.named_parameters()
            if getattr(p, "device_mesh", None) is not None
            and p.device_mesh.get_group().group_name != group
        }
    )
    if other:
        raise UsageError(
            f"shard: parameter {other[0]} is sharded on another mesh than the one "
            "shard(model, mesh) was given (fully_shard without mesh= takes the "
            "default group's: inside a job the real one, whose collectives would "
            "wait for ranks that try other batches); pass mesh=mesh to every "
            "fully_shard call"
        )
    missing = _fsdp.check_internals(modules)
    if missing:
        raise UsageError(
            f"find_sharded puts FSDP2 back between trials through names private to "
            f"torch's FSDP2, and torch {torch.__version__} lacks "
            f"{', '.join(missing)}; it was checked on torch 2.11 and 2.15"
        )
    if not materialize:
        return model
    with warnings.catch_warnings():
        # DTensor's random ops warn on a CPU mesh; the values do not change any allocation.
        warnings.filterwarnings("ignore", message="DTensor random operators")
        model.to_empty(device=device)
        with torch.no_grad():
            init(model)
    return model


def _mesh(device, world_size):
    """The 1-D mesh of the fake default group, named so that it never stands for another mesh
    over the same ranks (_sharded_job.mesh_names)."""
    from torch.distributed.device_mesh import init_device_mesh

    from ._sharded_job import mesh_names

    return init_device_mesh(device.type, (world_size,), mesh_dim_names=mesh_names("fake"))


def reset_parameters(model):
    """find_sharded's default init: reset_parameters() of every module that has one (what
    torch's FSDP2 examples call after to_empty). Buffers computed in a constructor keep whatever
    to_empty left: rotary frequencies change no allocation, but an index buffer (position ids)
    can then index out of range; pass init= that fills such buffers."""
    for m in model.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()


# ---- the shard layout ---------------------------------------------------------------------


def shard_rows(d, world_size, rank):
    """Rows of a dimension of size `d` that rank `rank` owns when FSDP2 shards it over
    `world_size` ranks: chunks of ceil(d/N) as torch.chunk makes them, the last ones shorter or
    empty (FSDP2 pads every rank's storage to the first chunk)."""
    chunk = math.ceil(d / world_size)
    return max(0, min(chunk, d - rank * chunk))


def layout(model, world_size):
    """The model's sharded parameters as [(global shape, shard dim or None, itemsize)], and the
    padded shard bytes every rank allocates."""
    params, padded = [], 0
    for p in model.parameters():
        placements = getattr(p, "placements", None)
        if placements is None:  # not sharded: every rank holds it whole
            params.append((tuple(p.shape), None, p.element_size()))
            padded += p.numel() * p.element_size()
            continue
        if len(placements) != 1 or not (placements[0].is_shard() or placements[0].is_replicate()):
            raise UsageError(
                f"find_sharded sizes FSDP2 on a 1-D mesh (fully_shard's Shard "
                f"placements), and a parameter has placements {placements}; pass "
                "shard() that calls fully_shard with a 1-D mesh"
            )
        dim = placements[0].dim if placements[0].is_shard() else None
        shape = tuple(p.shape)
        rows = math.ceil(shape[dim] / world_size) if dim is not None else 1
        per_row = p.numel() // shape[dim] if dim is not None and shape[dim] else p.numel()
        params.append((shape, dim, p.element_size()))
        padded += (rows * per_row if dim is not None else p.numel()) * p.element_size()
    return params, padded


def local_bytes(params, world_size, rank):
    """Bytes of the rows rank `rank` owns, per parameter (a tuple: the rank's shard signature)."""
    out = []
    for shape, dim, itemsize in params:
        numel = math.prod(shape)
        if dim is None or not shape[dim]:
            out.append(numel * itemsize)
        else:
            out.append(shard_rows(shape[dim], world_size, rank) * (numel // shape[dim]) * itemsize)
    return tuple(out)


def rank_classes(params, world_size):
    """Ranks grouped by their shard signature, largest total first: [(signature, [ranks])].
    The signature changes at most at the few ranks where chunks run short, so this walks runs."""
    classes = {}
    for r in range(world_size):
        classes.setdefault(local_bytes(params, world_size, r), []).append(r)
    return sorted(classes.items(), key=lambda kv: (-sum(kv[0]), kv[1][0]))


def ranks_to_size(classes, limit=3):
    """The representative (first) rank of each class no other class covers (a class covers
    another when each of its parameters' local bytes is at least the other's), largest first, at
    most `limit`."""
    chosen = []
    for signature, ranks in classes:
        if any(all(a >= b for a, b in zip(s, signature)) for s, _ in chosen):
            continue
        chosen.append((signature, ranks))
    return chosen[:limit]


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
    store, and one real lock-step step at it verifies it on every rank (_sharded_job.py).

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
            from ._sharded_job import join_and_raise

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
    from ._sharded_job import check_timeout

    check_timeout(verify_timeout)
    if _in_job():
        from ._sharded_job import check_job

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
    (_sharded_job.py); the result is this rank's, with the agreed micro-batch."""
    from ._sharded_job import size_on_job

    dist = torch.distributed
    rank, n = dist.get_rank(), dist.get_world_size()
    padded_local = []

    def build_on(mesh):
        model = _build(build, shard, init, device, mesh)
        params, padded = layout(model, n)
        padded_local[:] = [padded, sum(local_bytes(params, n, rank))]
        return model

    def job():  # what the ranks compare before any trial (_ranks.compare_job)
        from ._find import _code_digest, _name, job_fields

        digest = " ".join(f"{_name(f)} {_code_digest(f)}" for f in (build, shard, init))
        return job_fields(digest, example_batch, options)

    result, agreed = size_on_job(build_on, example_batch, options, device, timeout, job)
    from ._ranks import plan_at

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
