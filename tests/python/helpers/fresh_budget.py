"""The fresh-process checks' one rule (outside_check.py, lightning_fit_check.py, hf_eval_check.py,
plain_amp_check.py): the user's own job run with the CPU budget allocator installed before
anything is built, so that every tensor counts as in the search's process, and its outcome
printed as the scripts' last line."""
import json

import torch

from autobatch import _budget


def print_outcome(limit_bytes, job):
    """Runs `job()` under a budget of `limit_bytes` installed first; prints
    {"outcome": "fits" | "out-of-memory"} (any other error propagates)."""
    backend = _budget.backend(limit_bytes, 0)
    backend.finish_setup(0)  # from here every CPU tensor counts, the model's too
    outcome = "fits"
    try:
        job()
    except torch.OutOfMemoryError:
        outcome = "out-of-memory"
    finally:
        backend.remove()
    print(json.dumps({"outcome": outcome}))
