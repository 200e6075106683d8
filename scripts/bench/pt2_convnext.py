#!/usr/bin/env python3
"""The pt2 export of torchvision's ConvNeXt-tiny (LayerNorm over permuted tensors), the figures
docs/formats.md gives: export time, the gradient check and the memory check's peaks (eager step
against the package) at the example batch and at 8.

    python scripts/bench/pt2_convnext.py [--stochastic-depth P] [--out DIR]

Uses this checkout's export (scripts/autobatch_export.py) and build/bin/autobatch for the memory
check (or $AUTOBATCH_CLI). Exits 1 when the export is refused, printing why.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import zipfile

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import autobatch_export as ab  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stochastic-depth", type=float, default=0.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.convnext_tiny(num_classes=10,
                                             stochastic_depth_prob=args.stochastic_depth)
    out = args.out or tempfile.mkdtemp(prefix="pt2_convnext_")
    path = os.path.join(out, "convnext_tiny.pt2")
    cli = os.environ.get("AUTOBATCH_CLI",
                         os.path.join(HERE, "..", "..", "build", "bin", "autobatch"))
    start = time.monotonic()
    try:
        meta = json.loads(ab.export_pt2(model, path, (torch.randn(2, 3, 64, 64),),
                                        loss="cross-entropy", cli=cli))
    except ValueError as error:
        print(f"refused after {time.monotonic() - start:.0f} s: {error}")
        return 1
    print(f"exported in {time.monotonic() - start:.0f} s; gradient check {meta['gradient_check']}")
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("memory_check.json"))
        memory = json.loads(archive.read(name))
    print(f"memory check: {memory['status']}")
    for row in memory["rows"]:
        print(f"  batch {row['batch']}: eager {row['eager_peak_bytes']:,} B, package "
              f"{row['package_peak_bytes']:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
