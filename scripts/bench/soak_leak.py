"""The figures of docs/soak.md: autobatch.soak on the tests' leaking and non-leaking MLPs
(tests/python/helpers/soak_models.py) against the user's plain loop in a fresh process under the
same CPU budget (tests/python/helpers/soak_loop.py). Prints each soak's report and the loop's
step. About 30 s on 2 cores.

Usage: python scripts/bench/soak_leak.py   (the project's environment, the package installed)
"""
import json
import os
import subprocess
import sys

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python",
                       "helpers")
sys.path.insert(0, HELPERS)

import autobatch  # noqa: E402
import soak_models  # noqa: E402

MIB = 1 << 20


def loop_step(name, limit, size=32, steps=400):
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "soak_loop.py"), name, str(limit),
                          str(size), str(steps)], capture_output=True, text=True, check=True,
                         cwd=HELPERS)
    return json.loads(out.stdout.strip().splitlines()[-1])["failed_step"]


def soak(name, steps, limit):
    return autobatch.soak(soak_models.MODELS[name](), soak_models.example(), 32, steps=steps,
                          memory_limit=limit, step=soak_models.step,
                          optimizer=soak_models.optimizer)


def main():
    for name, steps, limit in (("hook_store", 10, 10 * MIB), ("hook_store", 400, 6 * MIB),
                               ("cache_once", 14, 64 * MIB), ("plain", 10, 64 * MIB)):
        r = soak(name, steps, limit)
        print(f"== {name}, {steps} steps under {limit // MIB} MiB")
        print(r)
        print(f"plain loop in a fresh process: out of memory at step "
              f"{loop_step(name, limit)} (None: never in 400 steps)\n")


if __name__ == "__main__":
    main()
