"""The TorchScript export: `export` (a model scripted or traced in training mode, saved with its
input description) and the command line of ``python scripts/autobatch_export.py``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, Mapping, Optional, Sequence, Union

import torch

from ._pt2 import export_pt2
from ._step import (
    EXPORT_FILE,
    EXTRA_FILE,
    LOSSES,
    check_example_inputs,
    metadata,
    model_kept,
    unwrap,
)


def export(
    model: torch.nn.Module,
    path: Union[str, os.PathLike],
    example_inputs: Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]],
    loss: str = "mean",
    method: Optional[str] = None,
    int_high: Optional[Dict[int, int]] = None,
) -> str:
    """Scripts (or traces) ``model`` in training mode and saves it with its input description.

    The TorchScript archive carries its inputs (extra file ``autobatch/inputs.json``), so the
    command sizes it without ``--input``: ``autobatch --model net.pt --target-batch 512``. The
    user's module is left as it was, whatever happens (its training flags, BatchNorm's running
    statistics and tied weights are put back). A model that returns a dict or a ModelOutput is
    unwrapped (see unwrap: to its loss when it computes one from the example's labels, else to
    its logits). Errors of torch.jit.script and torch.jit.trace propagate unchanged (for a model
    that does not script, pass ``method="trace"``).

    Args:
        model (torch.nn.Module): the model to export.
        path (str | os.PathLike): where the archive is written (``mynet.pt``).
        example_inputs (Sequence[torch.Tensor] | Mapping[str, torch.Tensor]): a tuple or list of
            tensors (positional inputs) or a dict of tensors (keyword inputs, as Hugging Face
            models take them; the archive's inputs follow the dict's order), each with the
            batch as its first dimension (any size: the command varies it). dtypes float32,
            float16, bfloat16, int64, int32 or bool. Integer inputs (token ids, labels) take
            their range [0, max + 1) from the example unless ``int_high`` names it.
        loss (str): the training loss on the output: "mean" (default: the output's mean),
            "cross-entropy" (random class targets below the output's last dimension), "mse"
            (a random target of the output's shape) or "model" (forward returns the loss, or a
            tuple whose first entry / a dict whose "loss" entry is it).
        method (str | None): "script" (torch.jit.script), "trace" (torch.jit.trace with the
            example: control flow is frozen to the example's path), or None (default: script,
            but trace a model that needed unwrapping; transformers models do not script).
        int_high (dict[int, int] | None): per input index, the exclusive upper bound (>= 1) of
            an integer input's values, e.g. ``{0: 32000}`` for a vocabulary of 32000.

    Returns:
        str: the metadata JSON written into the archive, e.g. ``{"version": 1, "inputs":
        ["3x224x224"], "loss": "cross-entropy"}`` (each input in the command's ``--input``
        syntax, docs/inputs.md).

    Raises:
        ValueError: bad arguments, before anything is written: a model that is no
            torch.nn.Module, example_inputs that are not a non-empty tuple, list or dict of
            tensors (a bare tensor: pass ``(x,)``), a scalar input or an unsupported dtype, an
            int_high key that is no input index or a bound below 1, an unknown loss or method,
            a dict output with no tensor entry.

    Examples:
        >>> import torch
        >>> from autobatch import export
        >>> export(MyNet(), "mynet.pt", example_inputs=(torch.randn(4, 3, 224, 224),),
        ...        loss="cross-entropy")
        '{"version": 1, "inputs": ["3x224x224"], "loss": "cross-entropy"}'
    """
    check_example_inputs(example_inputs, int_high)
    if method not in (None, "script", "trace"):
        raise ValueError(f"unknown method '{method}': expected script or trace")
    with model_kept(model):  # its mode, statistics and slots as they were, whatever happens
        model = model.train()
        wrapped, example_inputs, loss = unwrap(model, example_inputs, loss)
        if method is None:
            method = "trace" if wrapped is not model else "script"
        model = wrapped
        meta = metadata(example_inputs, loss, int_high)
        if method == "script":
            scripted = torch.jit.script(model)
        else:
            scripted = torch.jit.trace(model, example_inputs)
        how = json.dumps({"version": 1, "method": method})
        torch.jit.save(scripted, os.fspath(path), _extra_files={EXTRA_FILE: meta, EXPORT_FILE: how})
    return meta


def main() -> None:
    """The command line of ``python scripts/autobatch_export.py MODEL OUT``.

    Exports a torchvision model (``MODEL``, e.g. resnet18, without weights) at
    ``--image-size`` (default 224) with ``--loss`` (default cross-entropy) to ``OUT``: a
    TorchScript archive, or with ``--format pt2`` an AOTInductor package of one training step
    (``--autobatch PATH`` and ``--no-memory-check`` for its memory check). Prints the metadata
    JSON.

    Raises:
        SystemExit: bad arguments (argparse), or the export's ValueError as
            "autobatch_export.py: error: ...".

    Examples:
        python scripts/autobatch_export.py resnet18 models/resnet18.pt --image-size 64
    """
    parser = argparse.ArgumentParser(description="Export a torchvision model for autobatch.")
    parser.add_argument("model", help="torchvision.models name, e.g. resnet18")
    parser.add_argument("out", help="output .pt path")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--loss", default="cross-entropy", choices=LOSSES)
    parser.add_argument(
        "--format",
        default="torchscript",
        choices=("torchscript", "pt2"),
        help="torchscript: a TorchScript archive (.pt); pt2: a torch.export + "
        "AOTInductor package of one training step (.pt2, CPU, fp32)",
    )
    parser.add_argument(
        "--autobatch",
        metavar="PATH",
        help="pt2: the autobatch executable that checks the package's peaks "
        "against the eager step's (default: $AUTOBATCH_CLI, this checkout's "
        "build/bin/autobatch, or autobatch on PATH)",
    )
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="pt2: write the package without that check (every run on it warns)",
    )
    args = parser.parse_args()
    import torchvision

    net = getattr(torchvision.models, args.model)(weights=None)
    example = torch.randn(2, 3, args.image_size, args.image_size)
    try:
        if args.format == "pt2":
            print(
                export_pt2(
                    net,
                    args.out,
                    (example,),
                    loss=args.loss,
                    check_memory=not args.no_memory_check,
                    cli=args.autobatch,
                )
            )
        else:
            print(export(net, args.out, (example,), loss=args.loss))
    except ValueError as error:
        raise SystemExit(f"autobatch_export.py: error: {error}") from None
