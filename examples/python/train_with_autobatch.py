"""Size a PyTorch training loop with autobatch, then train with the plan it returns.

The recipe of docs/python.md, end to end:
1. export the nn.Module with its input description (scripts/autobatch_export.py);
2. run the autobatch CLI with --json - and read the primary accumulation plan;
3. train: per optimizer step, the plan's micro-batches, each micro-batch's mean loss weighted by
   its share of the step's samples, one optimizer.step() after the last one.

Usage:
    python examples/python/train_with_autobatch.py --autobatch build/bin/autobatch \\
        --memory-limit 12MiB --target-batch 4000 --steps 3

The CLI comes from --autobatch, else $AUTOBATCH_CLI, else `autobatch` on PATH. Exits with the
CLI's code when it does not find a plan (3: does not fit, 2: usage), so a job script stops before
training. Run by ctest (PythonExampleTest) with the project's Python environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from autobatch_export import export  # noqa: E402


class Classifier(torch.nn.Module):
    """[batch, 256] float32 -> [batch, 10] logits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                        torch.nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def run_autobatch(cli: str, model_path: str, memory_limit: str, target_batch: int) -> dict:
    """Runs the CLI; returns its JSON report. Exits with the CLI's code when it found no plan."""
    cmd = [cli, "--model", model_path, "--device", "cpu", "--memory-limit", memory_limit,
           "--optimizer", "adamw", "--target-batch", str(target_batch), "--json", "-", "-q"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or report.get("plans") is None:
        sys.stderr.write(proc.stderr)
        print(f"autobatch exited {proc.returncode} ({report.get('status')}): "
              f"{report.get('error') or 'no plan'}; not training", file=sys.stderr)
        sys.exit(proc.returncode or 1)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--autobatch", default=os.environ.get("AUTOBATCH_CLI")
                        or shutil.which("autobatch"), help="the autobatch binary")
    parser.add_argument("--memory-limit", default="12MiB")
    parser.add_argument("--target-batch", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the archive goes (default: temp)")
    args = parser.parse_args()
    if not args.autobatch:
        parser.error("no autobatch binary: pass --autobatch or set AUTOBATCH_CLI")
    torch.manual_seed(0)
    torch.set_num_threads(1)

    model = Classifier()
    workdir = args.workdir or tempfile.mkdtemp(prefix="autobatch-py-")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "classifier.pt")
    # 1. Export: the example's batch dimension (4) is arbitrary; autobatch varies it.
    export(model, path, example_inputs=(torch.randn(4, 256),), loss="cross-entropy")

    # 2. Ask autobatch.
    report = run_autobatch(args.autobatch, path, args.memory_limit, args.target_batch)
    result, plans = report["result"], report["plans"]
    plan = plans[plans["primary"]]
    # The groups describe one step always ("micro_batches" lists the sizes only up to 4096
    # accumulation steps, docs/report.md): count micro-batches of micro_batch_size each.
    groups = [(g["micro_batch_size"], g["count"]) for g in plan["groups"]]
    per_rank = plan["per_rank_batch"]
    print(f"autobatch: safe micro-batch {result['safe_micro_batch']} "
          f"(max {result['max_micro_batch']}, {len(report['trials'])} trials); plan {plan['kind']}: "
          f"{' + '.join(f'{count} x {size}' for size, count in groups)} = {per_rank} per step, "
          f"{plan['accumulation_steps']} accumulation steps x {plan['world_size']} rank(s) = "
          f"{plan['effective_batch']}")
    assert plan["effective_batch"] == args.target_batch, plan
    assert sum(size * count for size, count in groups) * plan["world_size"] == args.target_batch
    assert sum(count for _, count in groups) == plan["accumulation_steps"], plan
    assert max(size for size, _ in groups) <= result["safe_micro_batch"], (plan, result)

    # 3. Train with the plan (the model object itself, not the archive).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        samples, step_loss, micro_batches = 0, 0.0, 0
        for size in (size for size, count in groups for _ in range(count)):
            x, y = torch.randn(size, 256), torch.randint(0, 10, (size,))
            # Weight each micro-batch's mean loss by its share: the accumulated gradient is the
            # mean over the whole step, also when a balanced plan's sizes differ by one.
            loss = loss_fn(model(x), y) * (size / per_rank)
            loss.backward()
            samples += size
            micro_batches += 1
            step_loss += loss.item()
        optimizer.step()
        print(f"step {step}: {micro_batches} micro-batches, {samples} samples, "
              f"loss {step_loss:.4f}")
        assert samples * plan["world_size"] == args.target_batch
    print(f"trained {args.steps} optimizer steps, effective batch {args.target_batch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
