"""The user's own eager job at one micro-batch on CUDA, in a fresh process, without autobatch
(test_cuda.py): python eager_check.py MODEL B [PRECISION] prints one JSON line with what the
device itself says at the step's peak: `device_use_bytes` = the memory outside the caching
allocator (total - free - reserved, read after the steps) + max_memory_reserved over them, and
`peak_allocated_bytes`. AdamW, 2 steps, the loss from the output (.loss, else its mean), the
output alive through backward (find's keep_output=True), autocast for amp-bf16 / amp-fp16:
find's defaults."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models  # noqa: E402

name, b = sys.argv[1], int(sys.argv[2])
dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(
    sys.argv[3] if len(sys.argv) > 3 else "fp32")
model, example = tiny_models.MODELS[name]()
model = model.cuda()


def grow(v):
    return v.cuda().repeat(b, *([1] * (v.dim() - 1)))


batch = {k: grow(v) for k, v in example.items()} if isinstance(example, dict) else grow(example)
opt = torch.optim.AdamW(model.parameters())
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
outcome = "fits"
try:
    for _ in range(2):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            out = model(**batch) if isinstance(batch, dict) else model(batch)
            loss = out.loss if hasattr(out, "loss") else out.float().mean()
        loss.backward()  # the output alive through it: find's keep_output=True
        del loss, out
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
except torch.OutOfMemoryError:
    outcome = "out-of-memory"
free, total = torch.cuda.mem_get_info()
outside = total - free - torch.cuda.memory_reserved()
print(json.dumps({"outcome": outcome, "device_use_bytes": outside + torch.cuda.max_memory_reserved(),
                  "peak_allocated_bytes": torch.cuda.max_memory_allocated()}))
