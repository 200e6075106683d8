"""Export a PyTorch nn.Module as a TorchScript archive that autobatch can train and size.

The archive carries its own input description (extra file ``autobatch/inputs.json``), so that
``autobatch --model net.pt --target-batch 512`` needs no ``--input`` flag.

Usage from a training codebase::

    import torch
    from autobatch_export import export

    model = MyNet()
    example = torch.randn(8, 3, 224, 224)          # any batch size: the first dim is the batch
    export(model, "mynet.pt", example_inputs=(example,), loss="cross-entropy")

Each example input must have the batch as its first dimension; autobatch varies it. For integer
inputs (token ids, labels) the value range is taken as [0, max+1) unless ``int_high`` names it
(e.g. ``int_high={0: 32000}`` for a vocabulary of 32000). ``method="script"`` (default) uses
torch.jit.script; ``"trace"`` uses torch.jit.trace with the example inputs (for models that do not
script; control flow is then frozen to the example's path).

Loss kinds: "mean" (mean of the output), "cross-entropy" (random class targets below the output's
last dimension), "mse" (random target of the output's shape), "model" (forward returns the loss,
or a tuple whose first entry / a dict whose "loss" entry is it).

The metadata schema (version 1)::

    {"version": 1, "inputs": ["3x224x224", "int64:256:<32000"], "loss": "cross-entropy"}

where each input uses autobatch's ``--input`` syntax (see docs/inputs.md).

The code is in pieces by concern (docs/architecture.md): _export_step.py (the model as one step,
both formats), _pt2.py (the pt2 package: export_pt2), _pt2_joint.py (the joint graph and its
gradient check), _pt2_memory.py (the package's peaks against the eager step's),
_inductor_patches.py (every patch of torch's internals, fenced by a check of the names and
signatures it needs). This module is the front door: the TorchScript export, the command line,
and the names scripts and tests take from ``autobatch_export`` (scripts/autobatch_export.py).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, Mapping, Optional, Sequence, Union

import torch

from . import _inductor_patches as inductor_patches
from ._export_step import (
    EXPORT_FILE,
    EXTRA_FILE,
    LOSSES,
    PT2_ACCUMULATE_MODEL,
    PT2_BATCH_RANGE,
    PT2_GRAD_PREFIX,
    PT2_MEMORY_CHECK,
    PT2_METADATA_KEY,
    PT2_WEIGHTS,
    _WithLoss,
    check_example_inputs,
    input_spec,
    metadata,
    model_kept,
    untie_parameters,
    unwrap,
)
from ._inductor_patches import EAGER_KERNELS
from ._pt2 import _INDUCTOR_OVERRIDES, batch_range, export_pt2
from ._pt2_joint import GRADIENT_CHECK_TOLERANCE, export_joint
from ._pt2_memory import (
    MEMORY_FLOOR_BYTES,
    MEMORY_OVER_PCT,
    MEMORY_UNDER_PCT,
    eager_step_peak,
    find_cli,
    memory_check,
    profiled_peak,
)

# What scripts and tests take from here (scripts/autobatch_export.py). A patch of the export's
# behaviour is made where the name is used: inductor_patches.<name> for the patches.
__all__ = [
    "EAGER_KERNELS",
    "EXPORT_FILE",
    "EXTRA_FILE",
    "GRADIENT_CHECK_TOLERANCE",
    "LOSSES",
    "MEMORY_FLOOR_BYTES",
    "MEMORY_OVER_PCT",
    "MEMORY_UNDER_PCT",
    "PT2_ACCUMULATE_MODEL",
    "PT2_BATCH_RANGE",
    "PT2_GRAD_PREFIX",
    "PT2_MEMORY_CHECK",
    "PT2_METADATA_KEY",
    "PT2_WEIGHTS",
    "_INDUCTOR_OVERRIDES",
    "_WithLoss",
    "batch_range",
    "eager_step_peak",
    "export",
    "export_joint",
    "export_pt2",
    "find_cli",
    "inductor_patches",
    "input_spec",
    "main",
    "memory_check",
    "metadata",
    "profiled_peak",
    "untie_parameters",
    "unwrap",
    "SOURCES",
]

# The files of the export's code, which caches of exported models and packages are keyed by
# (scripts/export_models.py, scripts/pt2_packages.py).
SOURCES = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    for name in (
        "_export.py",
        "_export_step.py",
        "_pt2.py",
        "_pt2_joint.py",
        "_pt2_memory.py",
        "_inductor_patches.py",
    )
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


if __name__ == "__main__":
    main()
