#!/usr/bin/env python3
"""The Python package's evaluation sizing (issue 31; docs/python.md, docs/evaluation.md): for each
tiny model of tests/python/helpers/tiny_models.py, autobatch.find(eval=True) and find(eval="only") at one
memory limit (AdamW, margin 0, the CPU budget allocator's real out-of-memory), and the evaluation
answer E checked in a fresh process with check_eval_batch (E fits, E+1 does not). Prints a
Markdown table.

  PYTHONPATH=... python scripts/bench/python_eval.py
"""
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "tests", "python", "helpers")
sys.path.insert(0, TESTS)
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

CASES = [("mlp", "48MiB"), ("resnet18", "210MiB"), ("llama", "40MiB"), ("gpt2", "40MiB")]


def fresh(name, limit, *batches):
    out = subprocess.run([sys.executable, os.path.join(TESTS, "fresh_eval_check.py"), name, limit,
                          *map(str, batches)], check=True, capture_output=True, text=True)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main():
    print("| model | memory_limit | training batch | eval=True batch | eval trials | "
          "eval='only' batch | resident (eval=True) | E fits / E+1 does not (fresh) | time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for name, limit in CASES:
        model, example = tiny_models.MODELS[name]()
        kw = dict(optimizer=lambda p: torch.optim.AdamW(p), memory_limit=limit, margin=0,
                  min_batch=2 if name == "resnet18" else 1)
        t0 = time.time()
        r = autobatch.find(model, example, eval=True, **kw)
        seconds = time.time() - t0
        alone = autobatch.find(model, example, eval="only", **kw)
        e = r.eval_max_batch
        check = fresh(name, limit, e, e + 1)
        ok = check == {e: [True, True, "fits"], e + 1: [True, False, "out-of-memory"]}
        print(f"| {name} | {limit} | {r.max_micro_batch} | {e} | "
              f"{sum(t.eval for t in r.trials)} | {alone.eval_max_batch} | "
              f"{r.eval['resident_bytes']:,} | {'yes / yes' if ok else check} | {seconds:.1f} s |",
              flush=True)


if __name__ == "__main__":
    main()
