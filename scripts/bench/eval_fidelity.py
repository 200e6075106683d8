#!/usr/bin/env python3
"""autobatch's evaluation trial against an eager PyTorch evaluation loop (issue 31, item 3).

For each case (model, evaluation batch, optimizer, zero_grad mode) it measures, on the CPU:
- eager: the training state made as in the middle of training (model.train(), one training step
  at batch 1 with PyTorch's defaults, then optimizer.zero_grad(set_to_none=...)), then an
  evaluation loop of 2 batches (model.eval(), torch.no_grad(), `out = model(x)` kept in a
  variable until the next batch's forward returns, the loss computed from it) under
  torch.profiler with profile_memory=True: its CPU allocation events summed in time order, the
  maximum taken, plus the bytes alive before the profile (parameters, buffers, gradients,
  optimizer state);
- autobatch: `autobatch --check-eval-batch B --memory-limit 4GiB --json`, trials[0] (the
  evaluation trial).peak_allocated_bytes;
and prints the difference in %. Target: every row within 1% (fidelity.py's tolerance).

  eval_fidelity.py --md table.md   # the table of docs/evaluation.md ("Measured: ...")

The eager models are the nn.Modules of scripts/export_models.py; the archives are read from
--models (scripts/bootstrap.sh exports them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import fidelity  # noqa: E402
from autobatch_export import profiled_peak  # noqa: E402


@dataclass
class EvalCase:
    model: str  # a name of export_models.MODELS
    batch: int  # the evaluation batch
    optimizer: str = "adamw"
    zero_grad: str = "none"  # none, zeros
    input: str | None = None  # --input for the vision models (e.g. 3x64x64)

    def label(self) -> str:
        parts = [self.model, f"E={self.batch}", self.optimizer]
        if self.zero_grad != "none":
            parts.append(f"zero_grad {self.zero_grad}")
        if self.input:
            parts.append(self.input)
        return ", ".join(parts)


def loss_of(logits: torch.Tensor, loss_kind: str) -> torch.Tensor:
    if loss_kind == "cross-entropy":
        classes = logits.shape[-1]
        y = torch.randint(0, classes, (logits.numel() // classes,))
        return F.cross_entropy(logits.reshape(-1, classes), y)
    if loss_kind == "mse":
        return F.mse_loss(logits, torch.randn_like(logits))
    return logits.mean()


def resident_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in opt.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def eager_eval_peak(case: EvalCase) -> int:
    torch.manual_seed(0)
    model, example, loss_kind, int_high = fidelity.build(case.model)
    sample = tuple(example[0].shape[1:])
    if case.input:
        sample = tuple(int(d) for d in case.input.split("x"))
    high = int_high.get(0) if int_high else None

    def batch(n: int) -> torch.Tensor:
        return torch.randint(0, high, (n, *sample)) if high is not None else torch.randn(n, *sample)

    model.train()
    opt = fidelity.make_optimizer(fidelity.Case(case.model, 1, case.optimizer),
                                  [p for p in model.parameters() if p.requires_grad])
    opt.zero_grad(set_to_none=True)
    loss_of(model(batch(1)), loss_kind).backward()  # the training step that makes the state
    opt.step()
    opt.zero_grad(set_to_none=case.zero_grad == "none")
    before = resident_bytes(model, opt)
    model.eval()
    x = out = None  # the loop's variables: alive until rebound
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            for _ in range(2):
                x = batch(case.batch)
                out = model(x)
                loss = loss_of(out, loss_kind)
                del loss
    del x, out
    model.train()
    return before + profiled_peak(prof)


def autobatch_eval_peak(case: EvalCase, cli: str, models: str, workdir: str) -> int:
    os.makedirs(workdir, exist_ok=True)
    report = os.path.join(workdir, "eval_fidelity.json")
    cmd = [cli, "--model", os.path.join(models, f"{case.model}.pt"), "--device", "cpu",
           "--memory-limit", "4GiB", "--check-eval-batch", str(case.batch), "-q",
           "--optimizer", case.optimizer, "--optimizer-impl", "loop", "--zero-grad",
           case.zero_grad, "--json", report]
    if case.input:
        cmd += ["--input", case.input]
    doc = fidelity.cli_report(cmd, report)
    assert doc["trials"][0].get("eval"), "trials[0] is not an evaluation trial"
    return int(doc["trials"][0]["peak_allocated_bytes"])


def cases() -> list[EvalCase]:
    out = []
    for b in (16, 64):
        out.append(EvalCase("resnet18", b, input="3x64x64"))
        out.append(EvalCase("mobilenet_v3_large", b, input="3x64x64"))
        out.append(EvalCase("mlp_8x2048", b))
    for b in (4, 16):
        out.append(EvalCase("decoder_lm_small", b))
    out.append(EvalCase("decoder_lm_small", 16, zero_grad="zeros"))
    out.append(EvalCase("resnet18", 16, "sgd", input="3x64x64"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--autobatch", default=os.path.join(HERE, "..", "..", "build", "bin",
                                                            "autobatch"))
    parser.add_argument("--models", default=os.path.join(HERE, "..", "..", "models"))
    parser.add_argument("--workdir", default="/tmp/autobatch-eval-fidelity")
    parser.add_argument("--md", help="write the table as markdown to this file")
    parser.add_argument("--only", nargs="+", metavar="MODEL", help="only these models' cases")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows, failed, t0 = [], 0, time.time()
    for case in cases():
        if args.only and case.model not in args.only:
            continue
        t = time.time()
        eager = eager_eval_peak(case)
        ours = autobatch_eval_peak(case, args.autobatch, args.models, args.workdir)
        diff = 100.0 * (ours - eager) / eager
        ok = abs(diff) <= fidelity.TOLERANCE_PCT
        failed += 0 if ok else 1
        rows.append((case, eager, ours, diff, ok))
        print(f"{'ok  ' if ok else 'FAIL'} {case.label():<50} eager {eager:>13,} autobatch "
              f"{ours:>13,} {diff:+7.3f}% {time.time() - t:.1f} s", flush=True)
    elapsed = time.time() - t0
    print(f"eval fidelity: {len(rows) - failed} passed, {failed} failed ({elapsed:.0f} s)")
    if args.md:
        lines = ["| case | eager eval peak (bytes) | autobatch eval peak (bytes) | difference |",
                 "| --- | ---: | ---: | ---: |"]
        lines += [f"| {c.label()} | {e:,} | {o:,} | {d:+.3f}% |" for c, e, o, d, _ in rows]
        with open(args.md, "w") as f:
            f.write(f"<!-- written by scripts/bench/eval_fidelity.py in {elapsed:.0f} s -->\n" +
                    "\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
