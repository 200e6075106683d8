"""The ranks of a distributed job agree on one micro-batch: the smallest of every rank's own
safe micro-batch. The `autobatch` command's file-store agreement (docs/launchers.md) is for
separate processes that share nothing; a framework's ranks share a process group, and agree here
through its store (the TCPStore that torchrun and init_process_group already run), never through a
collective: after a fatal CUDA error (a sticky illegal address or device-side assert) no device
call works, not even `torch.tensor(..., device="cuda")`, so an NCCL all_reduce would raise on the
failed rank and leave the others waiting until NCCL's timeout. The store needs no device."""

import datetime
import itertools
import json

import torch

from ._errors import AutobatchError, DoesNotFit, UsageError

# Each agreement has its own keys: every rank agrees the same number of times, in the same order.
_ROUNDS = itertools.count()
# When the store has no timeout of its own: torch's default for a process group (30 minutes).
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def search_and_agree(search, world_size, device, who, job=None):
    """Runs `search()` (-> Result) on this rank and agrees with the others. Returns (result,
    agreed micro-batch). Every rank reaches the agreement, also when its own search failed (0:
    nothing fits; -1: any other error, an AutobatchError or not, its text given with it), so no
    rank waits for one that raised; then every rank raises: its own error, or one naming each
    rank that failed and its error. `job()`, when given, returns what this rank's plan depends on
    ({name: text}); before any trial the ranks compare it (compare_job) and every rank raises
    UsageError when one differs."""
    if job is not None and world_size > 1:
        compare_job(job, who)
    mine, error, result = 0, None, None
    try:
        result = search()
        mine = result.safe_micro_batch
    except DoesNotFit as e:
        result, error = e.result, e
    except Exception as e:  # noqa: BLE001  every error still reaches the agreement, then leaves
        mine, error = -1, e
    note = "" if error is None else f"{type(error).__name__}: {str(error)[:300]}"
    values = _gather(mine, note, device) if world_size > 1 else [(mine, note)]
    agreed = min(v for v, _ in values)
    if agreed > 0:
        return result, agreed
    if error is not None:
        raise error
    failed = [(r, v, n) for r, (v, n) in enumerate(values) if v <= 0]
    text = "; ".join(f"rank {r}: {n or 'no micro-batch fits'}" for r, v, n in failed)
    kind = DoesNotFit if all(v == 0 for _, v, _ in failed) else UsageError
    raise kind(
        f"{who}: another rank did not size ({text}); this rank's safe micro-batch is {mine}", result
    )


def _all_min(value, device=None):
    """The smallest `value` over the ranks of the default process group (see _gather)."""
    return min(v for v, _ in _gather(value, "", device))


def compare_job(job, who):
    """Every rank's job fields compared with rank 0's, as the command's ranks compare theirs
    (docs/launchers.md, "What the ranks compare"): UsageError on every rank naming the first field
    that differs, the ranks and both values (one rank's other model, target or step would make
    the ranks' plans differ, and their collectives mismatch hours later). `job()` -> {name: text};
    a rank whose `job()` raises sends its error instead, and no rank compares (its own search
    raises that error where it would have)."""
    try:
        mine = {str(k): str(v) for k, v in job().items()}
    except Exception as e:  # noqa: BLE001  the search raises it, in the agreement's order
        mine = {"__error__": f"{type(e).__name__}: {e}"}
    texts = _exchange(json.dumps(mine, sort_keys=True), "job")
    records = [json.loads(t) for t in texts]
    if any("__error__" in r for r in records):
        return
    first = records[0]
    for name, value in first.items():
        others = [
            (r, rec.get(name, "(none)"))
            for r, rec in enumerate(records)
            if r > 0 and rec.get(name, "(none)") != value
        ]
        if others:
            theirs = ", ".join(f"rank {r} has {v!r}" for r, v in others)
            raise UsageError(
                f"{who}: the ranks disagree on {name}: rank 0 has {value!r}, "
                f"{theirs}; every rank of one job must size the same model with the "
                f"same step and plan options (their plans would differ)"
            )


def _gather(value, note="", device=None):
    """[(value, note)] of every rank of the default process group, by rank, through its store
    (set, then wait for every rank's key within the store's timeout); `note`: this rank's error
    text, if any. `device` is unused (the agreement needs none); kept for the callers' symmetry.
    Raises UsageError naming the ranks that did not answer in time."""
    del device
    out = []
    for text in _exchange(f"{int(value)}|{note}", "agree", value):
        v, _, n = text.partition("|")
        out.append((int(v), n))
    return out


def _exchange(text, kind, value=None):
    """Every rank's `text` of one round, by rank, through the default group's store."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            "the world size is above 1 but torch.distributed is not initialized: "
            "launch the ranks with torchrun (or the framework's launcher)"
        )
    store = dist.distributed_c10d._get_default_store()  # private, in torch since 1.x; 2.11 too
    rank, world = dist.get_rank(), dist.get_world_size()
    prefix = f"autobatch/{kind}/{next(_ROUNDS)}/"
    keys = [f"{prefix}{r}" for r in range(world)]
    store.set(keys[rank], text)
    timeout = getattr(store, "timeout", None) or _DEFAULT_TIMEOUT
    try:
        store.wait(keys, timeout)
    except (RuntimeError, AutobatchError) as e:  # DistStoreError is a RuntimeError
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        what = "their micro-batch" if kind == "agree" else "what their plan depends on"
        mine = f"; this rank's is {value}" if value is not None else ""
        raise UsageError(
            f"ranks {missing} did not give {what} within {timeout} (the process "
            f"group's store timeout): a rank died or is still searching{mine} "
            f"({e})"
        ) from None
    return [store.get(k).decode(errors="replace") for k in keys]


def plan_at(micro_batch, options, world_size):
    """The plan for find()'s target_batch in `options` at the agreed micro-batch over the job's
    ranks (None without a target): autobatch.plan, the library's planner."""
    from ._plans import plan

    target = options.get("target_batch")
    return plan(micro_batch, target, world_size, options.get("plan", "auto")) if target else None
