"""The user's own plain loop under autocast in a fresh process, on the CPU under the budget
allocator (test_find.py's autocast test): python plain_amp_check.py LIMIT_BYTES PRECISION B
prints one JSON line {"outcome": "fits" | "out-of-memory"}. The allocator is installed before the
model is built, so the model counts as find()'s baseline does (the race harness's way,
scripts/bench/race.py). The loop: AmpMlp (tiny_models.py), 2 steps of AdamW, torch.autocast
around forward and loss as its outermost autocast (tiny_models.amp_mlp_step),
zero_grad(set_to_none=True)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fresh_budget import print_outcome  # noqa: E402
import tiny_models  # noqa: E402

limit, precision, b = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}[precision]


def job():
    model, (x, y) = tiny_models.amp_mlp()
    x, y = x.repeat(b, 1), y.repeat(b)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        with torch.autocast("cpu", dtype=dtype):
            loss = tiny_models.amp_mlp_step(model, (x, y))
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)


print_outcome(limit, job)
