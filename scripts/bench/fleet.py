#!/usr/bin/env python3
"""The fleet table's cost (issue 31, docs/fleet.md): one `autobatch --fleet A,B,C,D` run against
four separate `--memory-limit` runs of the same sizes, same model and options. Prints, per size,
both answers (max and safe micro-batch) and whether they agree, the trials each ran (the fleet's
run and reused), and the wall times; exits 1 when an answer differs or the fleet ran as many
trials as the separate runs, 2 when a run fails.

    python scripts/bench/fleet.py --model models/resnet18.pt --input 3x64x64 \\
        --sizes 1GiB,768MiB,512MiB,384MiB --target-batch 512

The CLI: --autobatch, else build/bin/autobatch. Extra flags for every run: --extra "...".
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cli, args, out):
    t0 = time.monotonic()
    done = subprocess.run([cli, *args, "--json", out], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode not in (0, 3):
        sys.stderr.write(done.stderr[-4000:])
        sys.exit(f"fleet.py: {' '.join(args)} exited {done.returncode}")
    with open(out) as f:
        return json.load(f), wall


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--autobatch", default=os.path.join(HERE, "..", "..", "build", "bin",
                                                       "autobatch"))
    p.add_argument("--model", required=True)
    p.add_argument("--input", default=None)
    p.add_argument("--sizes", required=True, help="comma-separated, as --fleet takes them")
    p.add_argument("--target-batch", default=None)
    p.add_argument("--extra", default="", help="more flags for every run")
    a = p.parse_args()
    common = ["--model", a.model, "--device", "cpu", *shlex.split(a.extra)]
    if a.input:
        common += ["--input", a.input]
    if a.target_batch:
        common += ["--target-batch", a.target_batch]
    sizes = a.sizes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        fleet, fleet_s = run(a.autobatch, [*common, "--fleet", a.sizes], f"{tmp}/fleet.json")
        rows = {r["name"]: r for r in fleet["fleet"]["rows"]}
        separate, separate_s, ok = 0, 0.0, True
        print(f"load at start: {open('/proc/loadavg').read().strip()}")
        print("| size | fleet max / safe | separate max / safe | same | fleet trials (run + "
              "reused) | separate trials | separate wall |")
        print("| --- | --- | --- | --- | --- | --- | ---: |")
        for size in sizes:
            one, wall = run(a.autobatch, [*common, "--memory-limit", size], f"{tmp}/one.json")
            r, o = rows[size], one["result"]
            same = (r["max_micro_batch"], r["safe_micro_batch"]) == (o["max_micro_batch"],
                                                                     o["safe_micro_batch"])
            ok &= same
            separate += len(one["trials"])
            separate_s += wall
            print(f"| {size} | {r['max_micro_batch']} / {r['safe_micro_batch']} | "
                  f"{o['max_micro_batch']} / {o['safe_micro_batch']} | {'yes' if same else 'NO'} "
                  f"| {r['trials_run'] + r['trials_reused']} ({r['trials_run']} + "
                  f"{r['trials_reused']}) | {len(one['trials'])} | {wall:.1f} s |")
    run_total = fleet["fleet"]["trials_run"]
    print(f"| all | | | {'yes' if ok else 'NO'} | {run_total} run | {separate} | "
          f"{separate_s:.1f} s |")
    print(f"fleet: {run_total} trials run in {fleet_s:.1f} s; separate runs: {separate} trials in "
          f"{separate_s:.1f} s ({' '.join(shlex.quote(x) for x in common)})")
    print(f"load at end: {open('/proc/loadavg').read().strip()}")
    return 0 if ok and run_total < separate else 1


if __name__ == "__main__":
    sys.exit(main())
