#!/usr/bin/env python3
"""One model in both formats: its pt2 package against its TorchScript archive (issue 19).

The issue's "Done when": ResNet-18 exported at 3x64x64 in both formats, `--check-batch` at three
batch sizes in fresh processes with 1 and 2 micro-batches per step, peaks within 1% of each
other; a `--margin 0` search on the package finds the TorchScript maximum within 1.

For each batch and micro-batch count this runs `autobatch --check-batch B --accumulation-steps M`
once per format (each a fresh process, CPU, fp32, AdamW, output dropped) and prints both
trials[0].peak_allocated_bytes and the difference; then one `--margin 0` search per format under
--limit and prints both maxima. Both files come from scripts/pt2_packages.py (NAME and NAME.ts,
built from the same module and example, cached).

  formats.py [--package resnet18_64] [--input 3x64x64] [--batches 8,32,128] [--limit 300MiB]
             [--md docs/formats-resnet18.md] [--check]

Exit 1 when a run fails; with --check also when a target is not met.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fidelity import pt2_path as built  # noqa: E402  (scripts/pt2_packages.py NAME, cached)

TOLERANCE_PCT = 1.0


def autobatch(cli: str, model: str, args: list[str], workdir: str) -> dict:
    report = os.path.join(workdir, "formats.json")
    if os.path.exists(report):
        os.remove(report)
    cmd = [cli, "--model", model, "--device", "cpu", "-q", "--json", report, "--optimizer",
           "adamw", "--optimizer-impl", "loop", "--keep-output", "no"] + args
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if not os.path.exists(report):
        raise RuntimeError(f"{' '.join(cmd)}: exit {run.returncode}, no report\n"
                           f"{run.stderr[-2000:]}")
    with open(report) as f:
        doc = json.load(f)
    doc["_cmd"] = " ".join(cmd)
    doc["_exit"] = run.returncode
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--autobatch", default=os.path.join(HERE, "..", "..", "build", "bin",
                                                            "autobatch"))
    parser.add_argument("--package", default="resnet18_64", help="a scripts/pt2_packages.py name")
    parser.add_argument("--batches", default="8,32,128")
    parser.add_argument("--limit", default="300MiB", help="the searches' --memory-limit")
    parser.add_argument("--md", help="also write the tables here (Markdown)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    args = parser.parse_args()

    t0 = time.time()
    files = {"pt2": built(args.package), "torchscript": built(args.package + ".ts")}
    build_s = time.time() - t0
    print(f"models: {files['pt2']}, {files['torchscript']} ({build_s:.0f} s)", flush=True)
    workdir = tempfile.mkdtemp(prefix="autobatch-formats-")
    rows = []
    failed_runs = 0
    missed = 0
    for batch in [int(b) for b in args.batches.split(",")]:
        for micro in (1, 2):
            peaks = {}
            for fmt, path in files.items():
                doc = autobatch(args.autobatch, path, ["--memory-limit", "4GiB", "--check-batch",
                                                       str(batch), "--accumulation-steps",
                                                       str(micro)], workdir)
                trial = (doc.get("trials") or [{}])[0]
                if doc["_exit"] != 0 or trial.get("outcome") != "fits":
                    print(f"FAIL {doc['_cmd']}: exit {doc['_exit']}, {trial.get('outcome')}",
                          flush=True)
                    failed_runs += 1
                peaks[fmt] = int(trial.get("peak_allocated_bytes", 0))
            diff = (100.0 * (peaks["pt2"] - peaks["torchscript"]) / peaks["torchscript"]
                    if peaks["torchscript"] else float("nan"))
            ok = abs(diff) <= TOLERANCE_PCT
            missed += 0 if ok else 1
            rows.append((batch, micro, peaks["torchscript"], peaks["pt2"], diff, ok))
            print(f"{'ok  ' if ok else 'off '} B={batch:<4} x {micro}: torchscript "
                  f"{peaks['torchscript']:>13,} pt2 {peaks['pt2']:>13,} {diff:+7.3f}%", flush=True)
    searches = {}
    for fmt, path in files.items():
        t = time.time()
        doc = autobatch(args.autobatch, path, ["--memory-limit", args.limit, "--margin", "0"],
                        workdir)
        result = doc.get("result", {})
        if doc["_exit"] != 0:
            print(f"FAIL {doc['_cmd']}: exit {doc['_exit']}", flush=True)
            failed_runs += 1
        searches[fmt] = (int(result.get("max_micro_batch", 0)), int(result.get("trial_count", 0)),
                         time.time() - t)
        print(f"search {fmt}: max micro-batch {searches[fmt][0]} in {searches[fmt][1]} trials, "
              f"{searches[fmt][2]:.0f} s", flush=True)
    search_ok = abs(searches["pt2"][0] - searches["torchscript"][0]) <= 1
    missed += 0 if search_ok else 1
    elapsed = time.time() - t0
    print(f"formats: {len(rows) - sum(1 for r in rows if not r[5])}/{len(rows)} peaks within "
          f"{TOLERANCE_PCT}%, search {'within' if search_ok else 'NOT within'} 1 "
          f"({elapsed:.0f} s)")
    if args.md:
        lines = [f"<!-- written by scripts/bench/formats.py --package {args.package} --batches "
                 f"{args.batches} --limit {args.limit} in {elapsed:.0f} s -->",
                 "| micro-batch x micro-batches | TorchScript peak (bytes) | pt2 peak (bytes) | "
                 "pt2 vs TorchScript | within 1% |", "| --- | ---: | ---: | ---: | --- |"]
        for batch, micro, ts, pt2, diff, ok in rows:
            lines.append(f"| {batch} x {micro} | {ts:,} | {pt2:,} | {diff:+.3f}% | "
                         f"{'yes' if ok else 'NO'} |")
        lines += ["", f"| `--margin 0` search under {args.limit} | max micro-batch | trials | "
                  "seconds |", "| --- | ---: | ---: | ---: |"]
        for fmt, (found, trials, seconds) in searches.items():
            lines.append(f"| {fmt} | {found} | {trials} | {seconds:.0f} |")
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    if failed_runs:
        return 1
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
