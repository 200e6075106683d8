#!/usr/bin/env python3
"""How far a pt2 package's gradients are from the truth, beside eager float32's (docs/formats.md).

Builds (cached) the package NAME with scripts/pt2_packages.py, runs its plain model at each batch
and the eager model from the same stored weights in float32 and float64, and prints, for the
worst parameters, the largest difference from float64 relative to that gradient's largest
element: package and eager float32 side by side. A package is as exact as eager when its column
is of the same size as eager's.

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
    classes = int(meta["targets"][0].split("<")[-1]) if meta["targets"] else 0
    for batch in [int(b) for b in args.batches.split(",")]:
        torch.manual_seed(batch)
        x = torch.randn((batch,) + tuple(example[0].shape[1:]))
        y = torch.randint(0, classes, (batch,)) if classes else None
        outputs = loader.run([x, y] if y is not None else [x])
        _, eager32 = api.eager_grads(model, (x,), loss, (y,) if y is not None else ())
        _, eager64 = api.eager_grads(model64, (x.double(),), loss, (y,) if y is not None else ())
        rows = []
        for name, grad in zip(meta["gradients"], outputs[1:]):
            key = name[len("model."):]
            scale = eager64[key].abs().max().item() or 1.0
            rows.append(((grad.double() - eager64[key]).abs().max().item() / scale,
                         (eager32[key].double() - eager64[key]).abs().max().item() / scale, key))
        rows.sort(reverse=True)
        print(f"batch {batch}: worst parameters, difference from float64 (relative to the "
              f"gradient's largest element)")
        for package_diff, eager_diff, key in rows[:args.show]:
            print(f"  {key:<32} package {package_diff:.2e}  eager float32 {eager_diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
