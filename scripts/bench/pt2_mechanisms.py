#!/usr/bin/env python3
"""What each of export_pt2's memory mechanisms is worth (issue 26; docs/formats.md).

Exports a model of scripts/pt2_packages.py (or gelu_mlp_nodrop, below) with one mechanism turned
off and prints the export's own memory check (the package's peak against the eager step's, at the
example batch and at 4x it, or the refusal with both peaks). Variants:
  final      export_pt2 as it is
  fused      no _eager_buffers: Inductor inlines pointwise values into their consumers and fuses
             (max_fusion_size 64), with its kernel groups and buffer reuse
  groups     _eager_buffers' realized results and no fusion, but Inductor's C++ kernel groups and
             buffer reuse kept (the export at commit f8c8f4e)
  mask       no _eager_dropout: dropout as torch.export decomposes it (native_dropout's bool mask)
  lifetimes  no _eager_lifetimes: a buffer is freed after the last kernel that reads it, not after
             the last op that takes it (avg_pool2d_backward takes its input and reads its sizes)

  pt2_mechanisms.py gpt2_lm_small --variants final fused mask
  pt2_mechanisms.py vit_small_64 --variants final groups
  pt2_mechanisms.py densenet121_64 --variants final lifetimes
  pt2_mechanisms.py gelu_mlp_nodrop --variants final     # docs/formats.md "Known gaps"

Needs the autobatch executable (build/bin/autobatch, as the export's check). Exit 1 when an
export fails for another reason than the memory check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import pt2_packages as pp  # noqa: E402

ab = pp.ab


class GeluMlpNoDrop(torch.nn.Module):
    """tests/python/pt2_export_test.py's GeluMlp without its dropout: it peaks in the backward of
    the GELU's last multiply (an autograd node of two outputs), where the package is under."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 512)
        self.down = torch.nn.Linear(512, 10)

    def forward(self, x):
        h = self.up(x)
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.down(h)


EXTRA = {"gelu_mlp_nodrop": lambda: (GeluMlpNoDrop(), (torch.randn(8, 16, 64),),
                                     "cross-entropy", None)}


def apply(variant: str) -> None:
    """Turns the variant's mechanism off in this process (each variant runs in its own)."""
    if variant == "fused":
        ab.inductor_patches._eager_buffers = contextlib.nullcontext
        ab._INDUCTOR_OVERRIDES.update(max_fusion_size=64, allow_buffer_reuse=True)
    elif variant == "groups":
        from torch._inductor.codegen.cpp import CppScheduling

        buffers = ab.inductor_patches._eager_buffers

        class realized_only(buffers):  # results realized, no fusion; kernel groups kept
            def __enter__(self):
                super().__enter__()
                CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = self._args
                return self
        ab.inductor_patches._eager_buffers = realized_only
        ab._INDUCTOR_OVERRIDES["allow_buffer_reuse"] = True
    elif variant == "mask":
        ab.inductor_patches._eager_dropout = contextlib.nullcontext
    elif variant == "lifetimes":
        ab.inductor_patches._eager_lifetimes = contextlib.nullcontext
    elif variant != "final":
        raise SystemExit(f"pt2_mechanisms: unknown variant '{variant}'")


def child(name: str, variant: str) -> int:
    apply(variant)
    torch.manual_seed(0)
    model, example, loss, int_high = {**pp.MODELS, **EXTRA}[name]()
    with tempfile.TemporaryDirectory(prefix="pt2-mechanisms-") as folder:
        path = os.path.join(folder, f"{name}.pt2")
        try:
            ab.export_pt2(model, path, example, loss=loss, int_high=int_high)
        except ValueError as error:
            if "under the eager step's" not in str(error):
                print(f"{name} {variant}: export failed: {error}", file=sys.stderr)
                return 1
            print(f"{name:18s} {variant:7s} refused: {str(error).split(':')[0]}")
            return 0
        with zipfile.ZipFile(path) as archive:
            member = next(n for n in archive.namelist() if n.endswith(ab.PT2_MEMORY_CHECK))
            rows = json.loads(archive.read(member))["rows"]
    for r in rows:
        pct = 100.0 * (r["package_peak_bytes"] / r["eager_peak_bytes"] - 1)
        print(f"{name:18s} {variant:7s} batch {r['batch']:3d}: package {r['package_peak_bytes']:,} "
              f"eager {r['eager_peak_bytes']:,} ({pct:+.3f}%)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--variants", nargs="+",
                        default=["final", "fused", "groups", "mask", "lifetimes"])
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model not in pp.MODELS and args.model not in EXTRA:
        parser.error(f"unknown model '{args.model}': expected one of "
                     f"{', '.join(sorted([*pp.MODELS, *EXTRA]))}")
    if args.child:
        return child(args.model, args.child)
    failed = 0
    for variant in args.variants:  # each in a fresh process: the patches are process-wide
        run = subprocess.run([sys.executable, os.path.abspath(__file__), args.model,
                              "--child", variant], check=False)
        failed |= run.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
