#!/usr/bin/env python3
"""FSDP2 per-rank peaks: the one-process emulation (torch's fake process group, as
autobatch.find_sharded runs it) against each rank of a real torchrun job on gloo (issue 43 item 5).

Both sides run the same code: the model built on the meta device, every unit and the root
fully_shard'ed on a 1-D mesh, materialized with to_empty, then two training steps (forward, loss,
backward, AdamW step with foreach=False, zero_grad) at one batch, under autobatch's CPU budget
allocator with no limit; the figure is the peak of tensor bytes over the two steps, counted from
before the first step (the sharded parameters included). The only difference is the process
group: fake (collectives do nothing, one process per world, each rank in turn) or gloo (N
processes). A rank's real peak above its emulated one is the collective backend's part.

Usage (from the checkout, the project's Python; about 4 minutes on 2 cores):
  scripts/bench/fsdp_fidelity.py [--worlds 2,4] [--cases mlp,llama,llama-keep,llama-bf16]
                                 [--batch 8] [--json OUT]
Prints one row per (case, world, rank): the emulated peak; the real rank's peak without the
backend's bytes (FSDP2's and the step's: the budget allocator sets apart what is allocated
inside a c10d collective's call, marked by a TorchDispatchMode, and on gloo's worker threads,
while it is held); the real rank's whole peak and the backend's part of it (whole less the
rest); what gloo's worker threads allocated in all. Exits
1 when a rank's FSDP2 part differs from the emulation by more than --tolerance (0.5%, the issue's
bound), or when a job fails. Internal modes (run by the table): --emulate CASE WORLD BATCH, --real CASE BATCH OUTDIR.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = {
    # name: (model, fully_shard options)
    "mlp": ("mlp", {}),
    "llama": ("llama", {}),
    "llama-keep": ("llama", {"reshard_after_forward": False}),
    "llama-bf16": ("llama", {"mp": "bf16"}),
}


def build(model_name):
    import torch
    from torch import nn
    if model_name == "mlp":
        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

            def forward(self, x):
                return x + self.down(torch.relu(self.up(self.norm(x))))

        class Net(nn.Module):
            def __init__(self, d=257, depth=3, classes=10):
                super().__init__()
                self.layers = nn.ModuleList(Block(d) for _ in range(depth))
                self.head = nn.Linear(d, classes)

            def forward(self, x):
                for b in self.layers:
                    x = b(x)
                return self.head(x)
        return Net()
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=503, hidden_size=96, intermediate_size=250,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def units(model):
    return list(model.layers) if hasattr(model, "layers") and not hasattr(model, "model") \
        else list(model.model.layers)


def shard(model, mesh, options):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {k: v for k, v in options.items() if k != "mp"}
    if options.get("mp") == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for u in units(model):
        fully_shard(u, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)


def batch(model_name, size):
    import torch
    g = torch.Generator().manual_seed(0)
    if model_name == "mlp":
        return (torch.randn(size, 257, generator=g), torch.randint(0, 10, (size,), generator=g))
    ids = torch.randint(0, 503, (size, 32), generator=g)
    return {"input_ids": ids, "labels": ids}


def loss(model_name, model, b):
    import torch
    if model_name == "mlp":
        return torch.nn.functional.cross_entropy(model(b[0]), b[1])
    return model(**b).loss


def collectives_apart():
    """A TorchDispatchMode that marks each c10d collective's call (FSDP2's all-gathers and
    reduce-scatters reach the dispatcher as c10d ops) so that the budget allocator sets apart what
    the backend allocates inside it: gloo allocates on the caller's thread there, and its worker
    frees it when the collective is done (measured: 4 to 13 MB over the 22 collectives of two MLP
    steps, varying with the run's timing)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from autobatch import _core

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not str(func).startswith("c10d."):
                return func(*args, **(kwargs or {}))
            _core.backend_scope(True)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                _core.backend_scope(False)
    return Mode()


def peak(case, world, size):
    """{peak: the two steps' peak, own_peak: the same without the bytes the backend allocated
    (inside a collective's call, or on another thread) and still held at the time,
    other_threads_allocated} in this process's current group (fake or real)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from autobatch import _budget, _core
    from autobatch._distributed import _layout
    from autobatch._meter import Meter
    model_name, options = CASES[case]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build(model_name)
    shard(model, init_device_mesh("cpu", (world,)), options)
    meter = Meter.cpu(1 << 40, 0)
    try:
        model.to_empty(device="cpu")
        with torch.no_grad():
            _layout.reset_parameters(model)
        meter.finish_setup(0)
        data = batch(model_name, size)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
        foreign = _budget.foreign_allocations()[1]
        meter.begin()
        with collectives_apart():
            for _ in range(2):
                loss(model_name, model, data).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        own_peak, _ = _budget.own_peak()
        peaks = meter.end()
        return {"peak": int(peaks["peak_allocated_bytes"]), "own_peak": own_peak,
                "other_threads_allocated": _budget.foreign_allocations()[1] - foreign}
    finally:
        meter.remove()


def emulate(case, world, size):
    import gc

    import torch.distributed as dist
    from autobatch._distributed._layout import fake_group
    out = []
    for rank in range(world):
        with fake_group(rank, world):
            out.append(peak(case, world, size))
        assert not dist.is_initialized()
        # FSDP2's states hold reference cycles: without a collection the previous rank's shards
        # stay alive and count in the next rank's peak (measured: rank 1 of 2 read 3.2 MB high)
        gc.collect()
    return out


def real(case, size, outdir):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    try:
        value = peak(case, dist.get_world_size(), size)
        with open(os.path.join(outdir, f"rank-{dist.get_rank()}.json"), "w") as f:
            json.dump(value, f)
    finally:
        dist.destroy_process_group()


def run_real(case, world, size, port):
    with tempfile.TemporaryDirectory() as outdir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-port", str(port), os.path.abspath(__file__), "--real", case, str(size),
               outdir]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun {case} world {world}: exit {done.returncode}\n"
                               f"{done.stderr[-3000:]}")
        return [json.load(open(os.path.join(outdir, f"rank-{r}.json"))) for r in range(world)]


def run_emulated(case, world, size):
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--emulate", case,
                           str(world), str(size)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"emulation {case} world {world}: exit {done.returncode}\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(args):
    rows, failed = [], 0
    print(f"fsdp_fidelity: batch {args.batch}, load {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} cores")
    print(f"{'case':<11} {'world':>5} {'rank':>4} {'emulated':>12} {'real: FSDP2':>12} "
          f"{'diff':>7} {'real: all':>12} {'backend part':>12} {'gloo allocated':>14}")
    port = 29600 + os.getpid() % 300
    for case in args.cases.split(","):
        for world in map(int, args.worlds.split(",")):
            t = time.time()
            emulated = run_emulated(case, world, args.batch)
            measured = run_real(case, world, args.batch, port)
            port += 1
            for rank, (e, m) in enumerate(zip(emulated, measured)):
                # the real job's step thread (FSDP2 and the step) against the emulation; the
                # backend's part is what the real peak holds above it
                own, whole = m["own_peak"], m["peak"]
                rel = (own - e["peak"]) / e["peak"]
                rows.append({"case": case, "world": world, "rank": rank,
                             "emulated_bytes": e["peak"], "real_fsdp2_bytes": own,
                             "real_bytes": whole, "backend_bytes": whole - own,
                             "gloo_threads_allocated_bytes": m["other_threads_allocated"]})
                print(f"{case:<11} {world:>5} {rank:>4} {e['peak']:>12,} {own:>12,} {rel:>7.3%} "
                      f"{whole:>12,} {whole - own:>12,} {m['other_threads_allocated']:>14,}")
                # FSDP2's allocations within the issue's 0.5% on every rank; the emulation's
                # process has no other thread allocating
                if abs(rel) > args.tolerance or e["other_threads_allocated"] or \
                        e["own_peak"] != e["peak"]:
                    failed += 1
            print(f"  ({time.time() - t:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if failed:
        print(f"fsdp_fidelity: {failed} row(s) outside the bounds")
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tolerance", type=float, default=0.005)
    p.add_argument("--json")
    p.add_argument("--emulate", nargs=3)
    p.add_argument("--real", nargs=3)
    args = p.parse_args()
    if args.emulate:
        case, world, size = args.emulate
        print(json.dumps(emulate(case, int(world), int(size))))
        return 0
    if args.real:
        case, size, outdir = args.real
        real(case, int(size), outdir)
        return 0
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
