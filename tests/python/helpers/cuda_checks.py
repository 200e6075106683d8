"""One CUDA check of the package in a process of its own (test_cuda.py): python cuda_checks.py
CHECK prints one JSON line.

  preset-fraction: the user's process set set_per_process_memory_fraction(0.02) before find():
    the limit is that share of the card, and the fraction is 0.02 again afterwards;
  refused-setting: run with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: find() raises
    UsageError naming it, before any trial;
  device-assert: a model whose forward indexes out of range on the device above micro-batch 4 (a
    device-side assert, a sticky error): find() ends in ModelError, and nothing hangs;
  eval: find(eval=True) on CUDA, then check_eval_batch at the answer in the same process;
  garbage: a reference cycle holding 64 MiB of CUDA memory, the collector disabled, before
    find(): the search's answer equals the answer without it, and a warning names the bytes freed.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402


def mlp():
    model, example = tiny_models.MODELS["mlp"]()
    return model.cuda(), example.cuda()


def main(check):
    out = {"check": check}
    if check == "preset-fraction":
        model, example = mlp()
        torch.cuda.set_per_process_memory_fraction(0.02)
        r = autobatch.find(model, example, max_batch=256)
        out.update(limit=r.memory_limit_bytes,
                   expected=int(0.02 * torch.cuda.get_device_properties(0).total_memory),
                   source=r.raw["device"]["memory_limit_source"],
                   after=torch.cuda.get_per_process_memory_fraction())
    elif check == "refused-setting":
        model, example = mlp()
        try:
            autobatch.find(model, example, memory_limit="2GiB")
            out.update(outcome="no error")
        except autobatch.UsageError as e:
            out.update(outcome="UsageError", message=str(e))
    elif check == "device-assert":
        class Indexing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(16, 4)

            def forward(self, x):
                if x.shape[0] > 4:  # an index past the end, checked on the device
                    x = x[torch.tensor([x.shape[0] * 10], device=x.device)]
                return self.lin(x)
        try:
            autobatch.find(Indexing().cuda(), torch.randn(1, 16, device="cuda"),
                           memory_limit="2GiB", max_batch=64)
            out.update(outcome="no error")
        except autobatch.ModelError as e:
            out.update(outcome="ModelError", message=str(e))
    elif check == "eval":
        model, example = mlp()
        r = autobatch.find(model, example, memory_limit="2GiB", eval=True)
        trial = autobatch.check_eval_batch(model, example, r.eval_safe_batch, memory_limit="2GiB")
        out.update(eval_safe_batch=r.eval_safe_batch, fits=trial.fits)
    elif check == "garbage":
        import gc
        model, example = mlp()
        clean = autobatch.find(model, example, memory_limit="2GiB", margin=0.0)
        gc.disable()
        cycle = {"tensor": torch.empty(64 << 20, dtype=torch.uint8, device="cuda")}
        cycle["self"] = cycle
        del cycle
        r = autobatch.find(model, example, memory_limit="2GiB", margin=0.0)
        gc.enable()
        out.update(clean=clean.max_micro_batch, answer=r.max_micro_batch,
                   warnings=[w for w in r.warnings if "garbage collection" in w])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
