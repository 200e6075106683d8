#!/usr/bin/env python3
"""How far a pt2 package's gradients are from the truth, beside eager float32's (docs/formats.md).

Builds (cached) the package NAME with scripts/pt2_packages.py, runs its plain model at each batch
and the eager model from the same stored weights in float64 and three float32 ways (PyTorch's
default kernels, channels_last, oneDNN off: each a valid float32 computation of the same step),
and prints, for the worst parameters, the largest difference from float64 relative to that
gradient's largest element. A package is as exact as eager when its column is of the size of the
eager float32 columns; where those columns disagree with each other as much, the step itself is
sensitive to float32 rounding at that batch (docs/formats.md, "Gradient accuracy").

  pt2_gradients.py [--package resnet18_64] [--batches 16,32]

Exit 1 when the build or a run fails.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
from fidelity import pt2_path  # noqa: E402
import pt2_export_test as api  # noqa: E402  (its loader: weights supplied as the runner does)
import pt2_packages  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="resnet18_64")
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--show", type=int, default=3, help="parameters shown per batch")
    args = parser.parse_args()
    path = pt2_path(args.package)
    loader, meta, state = api.load(path)
    model, example, loss, _ = pt2_packages.MODELS[args.package]()
    model.load_state_dict({k[len("model."):]: v for k, v in state.items()})
    model.train()
    model64 = copy.deepcopy(model).double()
    channels_last = copy.deepcopy(model).to(memory_format=torch.channels_last)
    classes = int(meta["targets"][0].split("<")[-1]) if meta["targets"] else 0
    for batch in [int(b) for b in args.batches.split(",")]:
        torch.manual_seed(batch)
        x = torch.randn((batch,) + tuple(example[0].shape[1:]))
        y = torch.randint(0, classes, (batch,)) if classes else None
        outputs = loader.run([x, y] if y is not None else [x])
        targets = (y,) if y is not None else ()
        _, eager32 = api.eager_grads(model, (x,), loss, targets)
        if x.dim() == 4:
            _, last = api.eager_grads(channels_last, (x.to(memory_format=torch.channels_last),),
                                      loss, targets)
        else:
            last = eager32  # channels_last applies to 4-d inputs only
        with torch.backends.mkldnn.flags(enabled=False):
            _, no_onednn = api.eager_grads(model, (x,), loss, targets)
        _, eager64 = api.eager_grads(model64, (x.double(),), loss, (y,) if y is not None else ())
        rows = []
        for name, grad in zip(meta["gradients"], outputs[1:]):
            key = name[len("model."):]
            scale = eager64[key].abs().max().item() or 1.0
            rows.append(tuple((g.double() - eager64[key]).abs().max().item() / scale
                              for g in (grad, eager32[key], last[key], no_onednn[key])) + (key,))
        print(f"batch {batch}: difference from float64 (relative to the gradient's largest "
              f"element), package | eager float32: default, channels_last, oneDNN off")
        worst = [max(r[i] for r in rows) for i in range(4)]
        print(f"  {'worst of all parameters':<32} " + "  ".join(f"{w:.2e}" for w in worst))
        for row in sorted(rows, reverse=True)[:args.show]:
            print(f"  {row[4]:<32} " + "  ".join(f"{w:.2e}" for w in row[:4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
