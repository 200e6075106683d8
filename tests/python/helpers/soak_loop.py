"""The truth for the soak's prediction (test_soak.py): the user's own plain loop, run in a fresh
process with the CPU budget allocator installed before anything is built (fresh_budget.py's
rule), for at most STEPS optimizer steps at micro-batch B. Prints {"failed_step": k} (0-based, the
step that ran out of memory) or {"failed_step": null}.

  python soak_loop.py MODEL LIMIT_BYTES B STEPS

With --soak, the other side in a fresh process too: autobatch.soak of the same model, STEPS steps
at B under memory_limit=LIMIT_BYTES (its own meter; JOB_STEPS as job_steps when given), printed as
its to_dict(). A soak in the tests' own process counts what earlier tests left alive there (as a
user's process would), which the plain loop's fresh process does not hold.

  python soak_loop.py --soak MODEL LIMIT_BYTES B STEPS [JOB_STEPS]
"""
import json
import sys

import torch

from autobatch import _budget

import soak_models


def main(name, limit, size, steps):
    backend = _budget.backend(limit, 0)
    backend.finish_setup(0)  # from here every CPU tensor counts, the model's too
    failed = None
    try:
        model = soak_models.MODELS[name]()
        example = soak_models.example()
        opt = soak_models.optimizer(model.parameters())
        x = None
        for k in range(steps):
            failed = k
            x = example.repeat(size, 1)  # a new batch each step; the previous one goes now
            soak_models.STEPS.get(name, soak_models.step)(model, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            failed = None
    except torch.OutOfMemoryError:
        pass
    finally:
        backend.remove()
    print(json.dumps({"failed_step": failed}))


def soak(name, limit, size, steps, job_steps=None):
    import autobatch

    r = autobatch.soak(soak_models.MODELS[name](), soak_models.example(), size, steps=steps,
                       memory_limit=limit, step=soak_models.STEPS.get(name, soak_models.step),
                       optimizer=soak_models.optimizer, job_steps=job_steps)
    print(json.dumps(r.to_dict()))


if __name__ == "__main__":
    if sys.argv[1] == "--soak":
        soak(sys.argv[2], *map(int, sys.argv[3:]))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
