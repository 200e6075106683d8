"""The ranks of a distributed job agree on one micro-batch: the smallest of every rank's own
safe micro-batch. The `autobatch` command's file-store agreement (docs/launchers.md) is for
separate processes that share nothing; a framework's ranks share a process group, and agree here
through its store (the TCPStore that torchrun and init_process_group already run), never through a
collective: after a fatal CUDA error (a sticky illegal address or device-side assert) no device
call works, not even `torch.tensor(..., device="cuda")`, so an NCCL all_reduce would raise on the
failed rank and leave the others waiting until NCCL's timeout. The store needs no device."""
import datetime
import itertools

import torch

from ._errors import AutobatchError, DoesNotFit, UsageError

# Each agreement has its own keys: every rank agrees the same number of times, in the same order.
_ROUNDS = itertools.count()
# When the store has no timeout of its own: torch's default for a process group (30 minutes).
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def search_and_agree(search, world_size, device, who):
    """Runs `search()` (-> Result) on this rank and agrees with the others. Returns (result,
    agreed micro-batch). Every rank reaches the agreement, also when its own search failed (0:
    nothing fits; -1: any other error, an AutobatchError or not, its text given with it), so no
    rank waits for one that raised; then every rank raises: its own error, or one naming each
    rank that failed and its error."""
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
    raise kind(f"{who}: another rank did not size ({text}); this rank's safe micro-batch is "
               f"{mine}", result)


def _all_min(value, device=None):
    """The smallest `value` over the ranks of the default process group (see _gather)."""
    return min(v for v, _ in _gather(value, "", device))


def _gather(value, note="", device=None):
    """[(value, note)] of every rank of the default process group, by rank, through its store
    (set, then wait for every rank's key within the store's timeout); `note`: this rank's error
    text, if any. `device` is unused (the agreement needs none); kept for the callers' symmetry.
    Raises UsageError naming the ranks that did not answer in time."""
    del device
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError("the world size is above 1 but torch.distributed is not initialized: "
                         "launch the ranks with torchrun (or the framework's launcher)")
    store = dist.distributed_c10d._get_default_store()  # private, in torch since 1.x; 2.11 too
    rank, world = dist.get_rank(), dist.get_world_size()
    prefix = f"autobatch/agree/{next(_ROUNDS)}/"
    keys = [f"{prefix}{r}" for r in range(world)]
    store.set(keys[rank], f"{int(value)}|{note}")
    timeout = getattr(store, "timeout", None) or _DEFAULT_TIMEOUT
    try:
        store.wait(keys, timeout)
    except (RuntimeError, AutobatchError) as e:  # DistStoreError is a RuntimeError
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise UsageError(f"ranks {missing} did not give their micro-batch within {timeout} (the "
                         f"process group's store timeout): a rank died or is still searching; "
                         f"this rank's is {value} ({e})") from None
    out = []
    for k in keys:
        v, _, n = store.get(k).decode(errors="replace").partition("|")
        out.append((int(v), n))
    return out


def plan_at(micro_batch, options, world_size):
    """The plan for find()'s target_batch in `options` at the agreed micro-batch over the job's
    ranks (None without a target): autobatch.plan, the library's planner."""
    from . import plan
    target = options.get("target_batch")
    return plan(micro_batch, target, world_size, options.get("plan", "auto")) if target else None
