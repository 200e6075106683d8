"""Checks evaluation batches of a tiny model in a fresh process (what find(eval=True) found must
hold in a process that never ran the search): python fresh_eval_check.py MODEL LIMIT E [E ...]
prints one JSON line {E: [state_fits, fits, outcome]}. Options as the test's find() call: AdamW,
margin 0, min_batch 2 for resnet18 (its BatchNorm cannot train on one sample)."""
import json
import os
import sys

import torch  # noqa: F401  (before autobatch, as the package does)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

name, limit, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
model, example = tiny_models.MODELS[name]()
out = {}
for e in batches:
    check = autobatch.check_eval_batch(model, example, e, memory_limit=limit, margin=0,
                                       optimizer=lambda p: torch.optim.AdamW(p),
                                       min_batch=2 if name == "resnet18" else 1)
    out[e] = [check.state_fits, check.fits, check.trial.outcome]
print(json.dumps(out))
