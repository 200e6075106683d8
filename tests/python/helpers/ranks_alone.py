"""One rank of the tests of ranks that size their batch on their own (issue 39, rows 5 and 6), run
by torchrun (2 CPU ranks, gloo): each rank runs autobatch.find through the drop-ins' agreement
(search_and_agree) and writes what it ended with to OUT/rank-<r>.json.

  collective: the model calls dist.all_reduce in its forward (refused before it runs, naming the
    module, on every rank);
  error: rank 1's search raises an error that is not an AutobatchError (a RuntimeError from the
    user's code around find), rank 0's succeeds: both must end, neither waits for the other.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import autobatch
from autobatch._ranks import search_and_agree


class Reducing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = self.body(x)
        dist.all_reduce(h.detach().clone())  # a metric synced across ranks, inside the step
        return self.head(h)


def main(out, mode):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Reducing() if mode == "collective" else torch.nn.Sequential(
        torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    x = torch.randn(1, 32)

    def search():
        if mode == "error" and rank == 1:
            raise RuntimeError("rank 1's preparation is broken")
        return autobatch.find(model, x, memory_limit="24MiB", max_batch=64, world_size=2)
    record = {"rank": rank}
    try:
        _, agreed = search_and_agree(search, 2, "cpu", "test")
        record.update(outcome="agreed", agreed=agreed)
    except Exception as e:  # noqa: BLE001  the test reads the type and message
        record.update(outcome="error", type=type(e).__name__, message=str(e))
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
