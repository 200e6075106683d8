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
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, Optional, Sequence

import torch

EXTRA_FILE = "autobatch/inputs.json"
LOSSES = ("mean", "cross-entropy", "mse", "model")
_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
}


def input_spec(tensor: torch.Tensor, high: Optional[int] = None) -> str:
    """autobatch's text spec for one batched example input: its shape without the batch dim."""
    if tensor.dim() < 1:
        raise ValueError("each example input needs a batch dimension first, got a scalar tensor")
    if tensor.dtype not in _DTYPES:
        raise ValueError(f"unsupported input dtype {tensor.dtype}: expected one of "
                         f"{', '.join(_DTYPES.values())}")
    dtype = _DTYPES[tensor.dtype]
    shape = "x".join(str(d) for d in tensor.shape[1:]) or "scalar"
    if tensor.dtype in (torch.int64, torch.int32):
        if high is None:
            high = int(tensor.max().item()) + 1 if tensor.numel() else 1
        return f"{dtype}:{shape}:<{high}"
    if dtype == "float32":
        return shape
    return f"{dtype}:{shape}"


def metadata(example_inputs: Sequence[torch.Tensor], loss: str,
             int_high: Optional[Dict[int, int]] = None) -> str:
    """The JSON text stored as autobatch/inputs.json."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss '{loss}': expected one of {', '.join(LOSSES)}")
    int_high = int_high or {}
    specs = [input_spec(t, int_high.get(i)) for i, t in enumerate(example_inputs)]
    return json.dumps({"version": 1, "inputs": specs, "loss": loss})


def export(model: torch.nn.Module, path: str, example_inputs: Sequence[torch.Tensor],
           loss: str = "mean", method: str = "script",
           int_high: Optional[Dict[int, int]] = None) -> str:
    """Scripts (or traces) ``model`` in training mode and saves it with its input description.

    Returns the metadata JSON written into the archive. Raises ValueError on bad arguments.
    """
    example_inputs = tuple(example_inputs)
    meta = metadata(example_inputs, loss, int_high)
    model = model.train()
    if method == "script":
        scripted = torch.jit.script(model)
    elif method == "trace":
        scripted = torch.jit.trace(model, example_inputs)
    else:
        raise ValueError(f"unknown method '{method}': expected script or trace")
    torch.jit.save(scripted, path, _extra_files={EXTRA_FILE: meta})
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description="Export a torchvision model for autobatch.")
    parser.add_argument("model", help="torchvision.models name, e.g. resnet18")
    parser.add_argument("out", help="output .pt path")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--loss", default="cross-entropy", choices=LOSSES)
    args = parser.parse_args()
    import torchvision

    net = getattr(torchvision.models, args.model)(weights=None)
    example = torch.randn(2, 3, args.image_size, args.image_size)
    print(export(net, args.out, (example,), loss=args.loss))


if __name__ == "__main__":
    main()
