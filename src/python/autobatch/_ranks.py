"""The ranks of a distributed job agree on one micro-batch: the smallest of every rank's own
safe micro-batch, through the job's own process group (torch.distributed, already initialized by
the framework). The `autobatch` command's file-store agreement (docs/launchers.md) is for
separate processes that share nothing; a framework's ranks share a process group, so one
all_reduce is all it takes."""
import torch

from ._errors import AutobatchError, DoesNotFit, UsageError


def search_and_agree(search, world_size, device, who):
    """Runs `search()` (-> Result) on this rank and agrees with the others. Returns (result,
    agreed micro-batch). Every rank reaches the all_reduce, also when its own search failed (0:
    nothing fits; -1: any other error), so no rank waits for one that raised; then every rank
    raises: its own error, or one naming the other rank."""
    mine, error, result = 0, None, None
    try:
        result = search()
        mine = result.safe_micro_batch
    except DoesNotFit as e:
        result, error = e.result, e
    except AutobatchError as e:
        mine, error = -1, e
    agreed = _all_min(mine, device) if world_size > 1 else mine
    if agreed > 0:
        return result, agreed
    if error is not None:
        raise error
    what = "has no micro-batch that fits" if agreed == 0 else "failed to size (see its error)"
    kind = DoesNotFit if agreed == 0 else UsageError
    raise kind(f"{who}: another rank {what}; this rank's safe micro-batch is {mine}", result)


def _all_min(value, device):
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise UsageError("the world size is above 1 but torch.distributed is not initialized: "
                         "launch the ranks with torchrun (or the framework's launcher)")
    t = torch.tensor([value], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return int(t.item())
