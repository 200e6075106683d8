"""autobatch.find on CUDA in a process of its own (test_cuda.py): python cuda_find.py MODEL LIMIT
prints one JSON line: status, max_micro_batch, the micro-batches that fit (1 per step) and that ran
out of memory, backend, and torch.cuda.memory_allocated() before and after the search. A process
of its own, so that the fresh processes that check the answer do not share the GPU with it."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

name, limit = sys.argv[1], sys.argv[2]
precision = sys.argv[3] if len(sys.argv) > 3 else None
model, example = tiny_models.MODELS[name]()
model = model.cuda()
example = ({k: v.cuda() for k, v in example.items()} if isinstance(example, dict)
           else example.cuda())
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
reserved_before = torch.cuda.memory_reserved()
r = autobatch.find(model, example, optimizer=lambda p: torch.optim.AdamW(p), memory_limit=limit,
                   target_batch=4096, precision=precision)
torch.cuda.synchronize()
print(json.dumps({
    "status": r.status, "max_micro_batch": r.max_micro_batch,
    "fits": sorted({t.micro_batch_size for t in r.trials
                    if t.outcome == "fits" and t.micro_batches_per_step == 1}),
    "oom": sorted({t.micro_batch_size for t in r.trials if t.outcome == "out-of-memory"}),
    "backend": r.raw["device"]["backend"], "before": before,
    "after": torch.cuda.memory_allocated(), "reserved_before": reserved_before,
    "reserved_after": torch.cuda.memory_reserved(), "limit": r.memory_limit_bytes,
    "device": r.raw["device"], "driver": r.raw["fingerprint"]["cuda_driver_version"]}))
