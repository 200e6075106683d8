"""Traces one autobatch search under RLIMIT_DATA: the process's VmData between trials.

Reproduces the drift figures of docs/benchmarks.md ("autobatch under a real cap"): the data
segment ratchets up over the trials although every tensor is freed. With --mmap-threshold N the
child runs with glibc's MALLOC_MMAP_THRESHOLD_=N (a fixed threshold), the lead tried there.

  python scripts/bench/vmdata_trace.py --model models/resnet18.pt --input 3x64x64 --cap-mib 1536
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def vm_data_mib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--autobatch", default=os.path.join(ROOT, "build", "bin", "autobatch"))
    p.add_argument("--model", required=True)
    p.add_argument("--input", default="")
    p.add_argument("--cap-mib", type=int, required=True, help="RLIMIT_DATA of the whole process")
    p.add_argument("--mmap-threshold", type=int, default=0, help="MALLOC_MMAP_THRESHOLD_ (bytes)")
    p.add_argument("extra", nargs="*", help="more autobatch flags (after --)")
    args = p.parse_args()
    cap = args.cap_mib << 20
    env = dict(os.environ)
    if args.mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    report = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    argv = [args.autobatch, "--model", args.model, "--margin", "0", "--json", report, "-v",
            *(["--input", args.input] if args.input else []), *args.extra]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (cap, cap)))
    t0, samples = time.time(), []
    while proc.poll() is None:
        v = vm_data_mib(proc.pid)
        if v is not None:
            samples.append((time.time() - t0, v))
        time.sleep(0.1)
    log.seek(0)
    trial_lines = [line.strip() for line in log if "trial batch" in line]
    print(f"cap {args.cap_mib} MiB, MALLOC_MMAP_THRESHOLD_ {args.mmap_threshold or 'unset'}; "
          f"exit {proc.returncode}")
    print("VmData MiB, every 0.5 s: " + " ".join(
        str(v) for i, (t, v) in enumerate(samples) if i % 5 == 0))
    if samples:
        print(f"VmData first {samples[0][1]} MiB, highest {max(v for _, v in samples)} MiB, "
              f"last {samples[-1][1]} MiB")
    for line in trial_lines:
        print("  " + line.split("info: ", 1)[-1])
    try:
        with open(report) as f:
            result = json.load(f).get("result") or {}
        print(f"max micro-batch {result.get('max_micro_batch')}, "
              f"{result.get('trial_count')} trials")
    except (OSError, ValueError):
        pass
    os.unlink(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
