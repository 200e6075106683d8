"""The figures of docs/soak.md: autobatch.soak on the tests' leaking and non-leaking MLPs
(tests/python/helpers/soak_models.py) against the user's plain loop in a fresh process under the
same CPU budget (tests/python/helpers/soak_loop.py). Prints each soak's report and the loop's
step. About 40 s on 2 cores.

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
                          memory_limit=limit,
                          step=soak_models.STEPS.get(name, soak_models.step),
                          optimizer=soak_models.optimizer)


def lasting():
    """The largest micro-batch that lasts 150 steps under 12 MiB, from soaks at 64 and 32, and
    the plain loop at it and at one sample more."""
    limit, job = 12 * MIB, 150
    r = autobatch.soak(soak_models.hook_store(), soak_models.example(), 64, steps=10,
                       memory_limit=limit, step=soak_models.step,
                       optimizer=soak_models.optimizer, job_steps=job)
    print(f"== hook_store at 64, 10 steps under 12 MiB, job_steps {job}")
    print(r)
    b = r.lasting_micro_batch
    for size in (b, b + 1):
        print(f"plain loop at {size} for {job} steps: out of memory at step "
              f"{loop_step('hook_store', limit, size, job)}")


def main():
    for name, steps, limit in (("hook_store", 10, 10 * MIB), ("hook_store", 400, 6 * MIB),
                               ("cache_once", 14, 64 * MIB), ("plain", 10, 64 * MIB),
                               ("running", 10, 10 * MIB)):
        r = soak(name, steps, limit)
        print(f"== {name}, {steps} steps under {limit // MIB} MiB")
        print(r)
        print(f"plain loop in a fresh process: out of memory at step "
              f"{loop_step(name, limit)} (None: never in 400 steps)\n")
    lasting()


if __name__ == "__main__":
    main()
