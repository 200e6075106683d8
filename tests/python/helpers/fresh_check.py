"""Checks micro-batches of a tiny model in a fresh process (what the search found must hold in a
process that never ran the search): python fresh_check.py MODEL LIMIT B [B ...] prints one JSON
line {B: outcome}. Options as the test's find() call: AdamW, 2 steps per trial. The model runs on
$AUTOBATCH_TEST_DEVICE (default cpu; test_cuda.py sets cuda)."""
import json
import os
import sys

import torch  # noqa: F401  (before autobatch, as the package does)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

name, limit, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
model, example = tiny_models.MODELS[name]()
device = torch.device(os.environ.get("AUTOBATCH_TEST_DEVICE", "cpu"))
model = model.to(device)
example = {k: v.to(device) for k, v in example.items()} if isinstance(example, dict) \
    else example.to(device)
out = {}
for b in batches:
    trial = autobatch.check_batch(model, example, b, memory_limit=limit,
                                  optimizer=lambda p: torch.optim.AdamW(p))
    out[b] = trial.outcome
print(json.dumps(out))
