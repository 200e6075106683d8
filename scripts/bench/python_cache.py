#!/usr/bin/env python3
"""The Python package's result cache (issue 29; docs/python.md "Repeat searches", docs/cache.md):
for each tiny model of tests/python/helpers/tiny_models.py, autobatch.find(cache=FOLDER) into an empty
folder (a miss: search and store), again (a hit: one confirming trial), and again with
cache_trust=True (no trial). AdamW, target batch 1024, the CPU budget allocator. Prints a
Markdown table of trials and wall time (time.perf_counter around each call, the model built
before). Exits non-zero when a hit's answer differs from the search's.

  python scripts/bench/python_cache.py [--only resnet18 llama]
"""
import argparse
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python", "helpers"))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

CASES = {"resnet18": "210MiB", "llama": "40MiB", "gpt2": "40MiB"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, autobatch {autobatch.__version__}, "
          f"{os.cpu_count()} CPUs\n")
    print("| model | limit | run | outcome | trials | safe micro-batch | wall s |")
    print("|---|---|---|---|---:|---:|---:|")
    bad = 0
    for name in args.only:
        limit = CASES[name]
        model, example = tiny_models.MODELS[name]()
        with tempfile.TemporaryDirectory() as folder:
            answers = []
            for run, trust in (("first", False), ("again", False), ("trusted", True)):
                start = time.perf_counter()
                r = autobatch.find(model, example, optimizer=lambda p: torch.optim.AdamW(p),
                                   memory_limit=limit, target_batch=1024, min_batch=2,
                                   cache=folder, cache_trust=trust)
                wall = time.perf_counter() - start
                answers.append((r.max_micro_batch, r.safe_micro_batch))
                print(f"| {name} | {limit} | {run} | {r.cache['outcome']} | {len(r.trials)} | "
                      f"{r.safe_micro_batch} | {wall:.1f} |", flush=True)
            if len(set(answers)) != 1:
                print(f"{name}: a hit's answer differs from the search's: {answers}",
                      file=sys.stderr)
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
