"""A scripted MLP archive for the CLI's shell tests (ranks_cli_test.sh, signals_cli_test.sh):
python mlp_archive.py OUT IN HIDDEN [SEED] writes Linear(IN, HIDDEN), ReLU, Linear(HIDDEN, 10)
with its input description ("IN", cross-entropy) inside."""
import sys

import torch

out, features, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                          torch.nn.Linear(hidden, 10))
inputs = f'{{"version": 1, "inputs": ["{features}"], "loss": "cross-entropy"}}'
torch.jit.save(torch.jit.script(net), out, _extra_files={"autobatch/inputs.json": inputs})
