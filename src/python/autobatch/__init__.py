"""autobatch: the largest micro-batch a PyTorch model trains with, measured by real training steps.

    import torch, autobatch
    result = autobatch.find(model, example_batch, optimizer=lambda p: torch.optim.AdamW(p),
                            memory_limit="8GiB", target_batch=512)
    print(result.safe_micro_batch, result.plan)

The trial is the user's own eager step (forward, loss, backward, optimizer step) on the real device;
the search, the planner and the report are the C++ library's (autobatch._core), the same as the
`autobatch` command's. docs/python.md describes every option, the result and the errors.
"""
# torch first: a CUDA build's libraries (the CUDA runtime) must be the ones loaded when the budget
# module or anything else binds to them; _core itself links no torch library.
import torch  # noqa: F401  (imported for its side effect: LibTorch loaded first)


def _load_core():
    """autobatch._core, or an ImportError that says what is missing. _core includes no torch
    header, so it loads with any torch; what can fail is the platform (a shared library the
    system lacks, a wheel built for another Python or C library)."""
    try:
        from . import _core as core
    except ImportError as e:
        raise ImportError(_load_failure(str(e))) from e
    return core


def _load_failure(text):
    """The words for an extension that does not load: a shared library the system lacks is named
    as such (the dynamic loader's "libX.so.N: cannot open shared object file"), not blamed on
    torch; anything else says to reinstall."""
    import re
    missing = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", text)
    if missing:
        return (f"autobatch._core needs the shared library {missing.group(1)}, which this system "
                f"does not have ({text}); install the system package that provides it, or "
                "install autobatch from a wheel that carries it (README, Install)")
    return (f"autobatch._core does not load ({text}); reinstall autobatch for this Python: "
            "pip install --force-reinstall --no-deps <the wheel or the source folder>")


_core = _load_core()
from ._errors import AutobatchError, Cancelled, DoesNotFit, ModelError, UsageError
from ._export import export, export_pt2
from ._check_eval import check_eval_batch
from ._find import check_batch, find, fingerprint
from ._result import EvalCheck, Plan, Result, Trial
from ._sharded import RankResult, ShardedResult, ShardedTable, find_sharded
from ._ddp_job import JobResult, find_ddp

__version__ = "0.1.0"


def plan(max_micro_batch: int, target_batch: int, world_size: int = 1, kind: str = "auto") -> Plan:
    """Plans gradient accumulation for a target batch, without any trial (the planner alone).

    The library's planner, the one find() and the `autobatch` command use (docs/search.md,
    "Headroom, plan"): per rank, micro-batches of at most `max_micro_batch` samples that add up
    to exactly target_batch / world_size, with each micro-batch's loss weight.

    Args:
        max_micro_batch (int): the largest micro-batch a rank may run (e.g. a Result's
            safe_micro_batch), samples, >= 1.
        target_batch (int): the effective batch, samples per optimizer step over all ranks,
            >= 1 and < 2^63, a multiple of `world_size`.
        world_size (int): the data-parallel ranks that share the target, 1 to 2^31 - 1 (default
            1; None is read as 1).
        kind (str): "uniform" (equal micro-batches, the largest that divides the per-rank
            batch), "balanced" (the fewest accumulation steps, sizes differing by at most one
            sample), or "auto" (default: uniform, unless its micro-batch is under half of
            min(max_micro_batch, the per-rank batch): then balanced).

    Returns:
        Plan: the plan of that kind (micro_batches, accumulation_steps, loss_weights, groups,
        per_rank_batch, effective_batch == target_batch).

    Raises:
        UsageError: max_micro_batch or target_batch missing or not an int >= 1, world_size out
            of range, an unknown kind, or a target that is not a multiple of world_size (the
            message names the nearest valid targets).

    Examples:
        >>> str(autobatch.plan(184, 256))
        'uniform plan: micro-batch 128 x 2 accumulation steps x 1 rank(s) = 256'
        >>> autobatch.plan(100, 250, kind="balanced").groups
        ((84, 1, 0.336), (83, 2, 0.332))
    """
    import json

    from ._options import _INT32_MAX, _count, _target

    if max_micro_batch is None or target_batch is None:
        raise UsageError("plan: expected max_micro_batch and target_batch as ints >= 1, but got "
                         f"{max_micro_batch!r} and {target_batch!r}")
    max_micro_batch = _count(max_micro_batch, "max_micro_batch")
    target_batch = _target(target_batch)
    # C++ ints (2**31 and kind=None would otherwise leave pybind11's TypeError)
    world_size = _count(world_size, "world_size", none_is=1, maximum=_INT32_MAX)
    if kind not in ("auto", "uniform", "balanced"):
        raise UsageError(f"plan: kind: expected 'auto', 'uniform' or 'balanced', but got {kind!r}")
    try:
        plans = json.loads(_core.plan(max_micro_batch, target_batch, world_size, kind))
    except _core.Error as e:
        raise UsageError(str(e)) from None
    return Plan.from_json(plans[plans["primary"]])


__all__ = ["find", "find_sharded", "find_ddp", "JobResult", "ShardedResult", "ShardedTable", "RankResult", "check_batch", "check_eval_batch", "EvalCheck", "fingerprint", "export", "export_pt2", "plan", "Result", "Plan", "Trial", "AutobatchError",
           "DoesNotFit", "UsageError", "ModelError", "Cancelled"]
