"""autobatch.plan: the library's accumulation planner alone, without any trial."""

from __future__ import annotations

import json

from . import _core
from ._errors import UsageError
from ._options import _INT32_MAX, _count, _target
from ._result import Plan


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
    if max_micro_batch is None or target_batch is None:
        raise UsageError(
            "plan: expected max_micro_batch and target_batch as ints >= 1, but got "
            f"{max_micro_batch!r} and {target_batch!r}"
        )
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
