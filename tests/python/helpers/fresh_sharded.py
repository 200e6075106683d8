"""The user's own FSDP2 loop as rank RANK of a world of WORLD, in a fresh process, under the
budget allocator's LIMIT: python fresh_sharded.py WORLD RANK LIMIT B [B ...] prints one JSON line
{B: "fits" | "out-of-memory"}. The truth for find_sharded (test_sharded.py): torch's fake process
group set up with torch's own calls (not autobatch's), the model tiny_models.ShardedMlp built on
the meta device, tiny_models.shard_units, to_empty and reset_parameters, then per batch two plain
training steps (forward, cross-entropy, backward, AdamW(foreach=False) step, zero_grad)."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from autobatch import _budget  # noqa: E402
from autobatch._options import _bytes  # noqa: E402
import tiny_models  # noqa: E402

world, rank, limit = int(sys.argv[1]), int(sys.argv[2]), _bytes(sys.argv[3], "limit")
dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
backend = _budget.backend(limit, 0)  # every CPU tensor from here on is counted
backend.finish_setup(0)
out = {}
for b in map(int, sys.argv[4:]):
    with torch.device("meta"):
        model = tiny_models.ShardedMlp()
    tiny_models.shard_units(model, init_device_mesh("cpu", (world,)))
    try:
        model.to_empty(device="cpu")
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        x, y = tiny_models.sharded_mlp_batch()
        x, y = x.repeat(b, 1), y.repeat(b)
        optimizer = tiny_models.adamw(model.parameters())
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        out[b] = "fits"
    except torch.OutOfMemoryError:
        out[b] = "out-of-memory"
    del model
    import gc
    gc.collect()
backend.remove()
dist.destroy_process_group()
print(json.dumps(out))
