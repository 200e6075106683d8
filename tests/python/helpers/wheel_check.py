"""One environment's check of an installed autobatch wheel (scripts/wheel_check.sh): `find` on the
CPU under a memory_limit (the CPU budget module compiled here on first use), then `check_batch`
of the answer and of one more in fresh processes under the same limit: the answer fits and one
more does not. Prints one line per step; exits non-zero on any disagreement.

Usage: python wheel_check.py            (the whole check, from a process of its own)
       python wheel_check.py BATCH      (one fresh-process check_batch; prints its outcome)
"""
import json
import os
import subprocess
import sys
import time

import torch

import autobatch

LIMIT = "64MiB"


def model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    return model, torch.randn(1, 256)


def adamw(params):
    return torch.optim.AdamW(params)


def check(batch):
    model, example = model_and_batch()
    trial = autobatch.check_batch(model, example, batch, optimizer=adamw, memory_limit=LIMIT,
                                  margin=0)
    return trial.outcome


def main():
    where = os.path.dirname(autobatch.__file__)
    print(f"wheel_check: autobatch {where}, torch {torch.__version__}")
    model, example = model_and_batch()
    t0 = time.monotonic()
    result = autobatch.find(model, example, optimizer=adamw, memory_limit=LIMIT, margin=0)
    print(f"wheel_check: find {result.status}: max {result.max_micro_batch}, "
          f"{len(result.trials)} trials, {time.monotonic() - t0:.1f} s (the budget module's "
          "first build included)")
    outcomes = {}
    for batch in (result.max_micro_batch, result.max_micro_batch + 1):
        run = subprocess.run([sys.executable, __file__, str(batch)], capture_output=True,
                             text=True, timeout=600)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            return 1
        outcomes[batch] = json.loads(run.stdout.strip().splitlines()[-1])["outcome"]
        print(f"wheel_check: fresh-process check_batch({batch}): {outcomes[batch]}")
    expected = {result.max_micro_batch: "fits", result.max_micro_batch + 1: "out-of-memory"}
    if outcomes != expected:
        print(f"wheel_check: FAILED, expected {expected}")
        return 1
    print("wheel_check: ok")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps({"outcome": check(int(sys.argv[1]))}))
        sys.exit(0)
    sys.exit(main())
