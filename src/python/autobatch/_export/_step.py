"""What both export formats start from: the user's model as one training step.

The model is unwrapped to positional tensors in and one tensor out (a dict of inputs, a dict or
transformers ModelOutput returned: unwrap), its loss attached (_WithLoss, with the targets the
loss kind needs: _example_targets), tied parameters given their own storage for the pt2 export
(untie_parameters), and the input description written as the archive's metadata (input_spec,
metadata; docs/inputs.md). Also the names both formats store things under: the TorchScript
archive's extra files and the pt2 package's members (docs/formats.md). Imports torch only.
"""

from __future__ import annotations

import contextlib
import json
from typing import Dict, Optional, Sequence

import torch

EXTRA_FILE = "autobatch/inputs.json"
# {"version": 1, "method": "script" | "trace"}: how the archive was made. A traced graph ignores
# eval() (dropout and BatchNorm stay as traced, in training mode); autobatch --eval says so.
EXPORT_FILE = "autobatch/export.json"
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
        raise ValueError(
            f"unsupported input dtype {tensor.dtype}: expected one of {', '.join(_DTYPES.values())}"
        )
    dtype = _DTYPES[tensor.dtype]
    shape = "x".join(str(d) for d in tensor.shape[1:]) or "scalar"
    if tensor.dtype in (torch.int64, torch.int32):
        if high is None:
            high = int(tensor.max().item()) + 1 if tensor.numel() else 1
        return f"{dtype}:{shape}:<{high}"
    if dtype == "float32":
        return shape
    return f"{dtype}:{shape}"


def metadata(
    example_inputs: Sequence[torch.Tensor], loss: str, int_high: Optional[Dict[int, int]] = None
) -> str:
    """The JSON text stored as autobatch/inputs.json."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss '{loss}': expected one of {', '.join(LOSSES)}")
    int_high = int_high or {}
    specs = [input_spec(t, int_high.get(i)) for i, t in enumerate(example_inputs)]
    return json.dumps({"version": 1, "inputs": specs, "loss": loss})


class _Unwrapped(torch.nn.Module):
    """A model that takes keyword inputs or returns a dict / ModelOutput (a Hugging Face model),
    as a module of positional tensors returning one tensor: forward(*inputs) calls
    model(**dict(zip(keys, inputs))) when ``keys`` is given (else model(*inputs)) and returns the
    output's ``pick`` entry ("loss" or "logits")."""

    def __init__(self, model: torch.nn.Module, keys, pick: Optional[str]):
        super().__init__()
        self.model = model
        self.keys = list(keys) if keys else []
        self.pick = pick

    def forward(self, *inputs):
        if self.keys:
            out = self.model(**dict(zip(self.keys, inputs)))
        else:
            out = self.model(*inputs)
        if self.pick is None:
            return out
        return out[self.pick]


def _output_entries(out) -> Optional[list]:
    """The keys of a dict-like output (dict, transformers' ModelOutput), or None."""
    if isinstance(out, dict) or (
        hasattr(out, "keys") and hasattr(out, "__getitem__") and not isinstance(out, torch.Tensor)
    ):
        return list(out.keys())
    return None


@contextlib.contextmanager
def model_kept(model):
    """The user's module as it was, after an export whatever happens: each module's training
    flag, its parameter and buffer slots (tied weights the pt2 export untied are tied again) and
    its buffers' values (BatchNorm's running statistics, which the export's forwards in training
    mode move). Without it export() would leave a model in train mode with its statistics moved,
    and export_pt2() a tied model untied for good. Raises ValueError for a model that is no
    torch.nn.Module."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, but got {type(model).__name__}")
    flags = [(m, m.training) for m in model.modules()]
    slots = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    with torch.no_grad():
        values = {
            id(b): b.detach().clone()
            for _, _, buffers in slots
            for b in buffers.values()
            if b is not None
        }
    try:
        yield
    finally:
        with torch.no_grad():
            for m, parameters, buffers in slots:
                for name, p in parameters.items():
                    m._parameters[name] = p
                for name, b in buffers.items():
                    m._buffers[name] = b
                    if b is not None and id(b) in values:
                        b.copy_(values[id(b)])
        for m, training in flags:
            m.training = training


def check_example_inputs(example_inputs, int_high=None):
    """ValueError, before anything is traced or written, unless ``example_inputs`` is a non-empty
    tuple or list of tensors or a non-empty dict of tensors, and ``int_high`` maps input indices
    to exclusive upper bounds >= 1 (unchecked, a bare tensor was read as one input per row, a
    float in the dict failed as AttributeError, int_high={0: 0} wrote a range the command
    refuses)."""
    if isinstance(example_inputs, dict):
        values = list(example_inputs.values())
    elif isinstance(example_inputs, (tuple, list)):
        values = list(example_inputs)
    else:
        raise ValueError(
            f"example_inputs: expected a tuple of tensors (positional inputs, e.g. "
            f"(x,)) or a dict of tensors (keyword inputs), but got "
            f"{type(example_inputs).__name__}; for one tensor x, pass (x,)"
        )
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        raise ValueError(
            f"example_inputs: expected at least one input, each a tensor with the "
            f"batch dimension first, but got "
            f"{[type(v).__name__ for v in values] or 'none'}"
        )
    for index, high in (int_high or {}).items():
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(values):
            raise ValueError(
                f"int_high: expected input indices 0..{len(values) - 1} as keys, but got {index!r}"
            )
        if isinstance(high, bool) or not isinstance(high, int) or high < 1:
            raise ValueError(
                f"int_high[{index}]: expected an exclusive upper bound >= 1 (token "
                f"ids in [0, high)), but got {high!r}"
            )


def unwrap(model: torch.nn.Module, example_inputs, loss: str):
    """(module, positional example inputs, loss) the exporters can take, from a model that takes
    a dict of inputs or returns a dict / ModelOutput (issue 29: a transformers model exports with
    one call). The output becomes its "loss" when the model computes one from the example (labels
    given) and ``loss`` is "mean" or "model" (the loss is then "model"), else its "logits", else
    its first tensor entry. A model of positional tensors returning tensors is returned as it is.
    Raises ValueError when the output has no tensor entry to take."""
    keys = None
    if isinstance(example_inputs, dict):
        keys = list(example_inputs.keys())
        args = tuple(example_inputs.values())
    else:
        args = tuple(example_inputs)
    with torch.no_grad():
        out = model(**dict(zip(keys, args))) if keys else model(*args)
    entries = _output_entries(out)
    pick = None
    if entries is not None:
        present = [k for k in entries if isinstance(out[k], torch.Tensor)]
        if "loss" in present and loss in ("mean", "model"):
            pick, loss = "loss", "model"
        elif "logits" in present:
            pick = "logits"
        elif present:
            pick = present[0]
        else:
            raise ValueError(
                f"the model returned {type(out).__name__} with no tensor entry "
                f"(entries: {entries}); export a module that returns a tensor"
            )
    if keys is None and pick is None:
        return model, args, loss
    return _Unwrapped(model, keys, pick), args, loss


# ---- The pt2 format: torch.export + AOTInductor (issue 19, docs/formats.md) ----

PT2_WEIGHTS = "data/autobatch/weights.pt"  # inside the package's archive folder
PT2_METADATA_KEY = "autobatch"  # aot_inductor.metadata key holding our JSON
# {"low": N, "high": M or null, "eager_batch1_error": "..." when eager fails at batch 1}
PT2_BATCH_RANGE = "data/autobatch/batch_range.json"
# {"status": "passed" | "over" | "not-run", "reason": text or null, "rows": [{"batch": N,
#  "eager_peak_bytes": N, "package_peak_bytes": N}, ...]}: the export's own check of the package's
# peaks against the eager step's (issue 26; memory_check below)
PT2_MEMORY_CHECK = "data/autobatch/memory_check.json"
PT2_ACCUMULATE_MODEL = "accumulate"  # the package's second model: gradients added in place
PT2_GRAD_PREFIX = "autobatch_grad."  # its buffers: the gradient accumulated into, per parameter


class _WithLoss(torch.nn.Module):
    """The model and its loss as one module: forward(*inputs, *targets) returns (loss,)."""

    def __init__(self, model: torch.nn.Module, loss: str, n_inputs: int):
        super().__init__()
        self.model = model
        self.loss = loss
        self.n_inputs = n_inputs

    def forward(self, *args):
        out = self.model(*args[: self.n_inputs])
        targets = args[self.n_inputs :]
        if self.loss == "model":
            if isinstance(out, dict):
                return (out["loss"],)
            if isinstance(out, (tuple, list)):
                return (out[0],)
            return (out,)
        if isinstance(out, (tuple, list)):
            out = out[0]
        if self.loss == "cross-entropy":
            classes = out.shape[-1]
            return (
                torch.nn.functional.cross_entropy(out.reshape(-1, classes), targets[0].reshape(-1)),
            )
        if self.loss == "mse":
            return (torch.nn.functional.mse_loss(out, targets[0]),)
        return (out.mean(),)


def _example_targets(model: torch.nn.Module, example_inputs, loss: str):
    """The loss's targets for the example batch (package inputs after the model's) and their
    specs."""
    if loss in ("mean", "model"):
        return (), []
    with torch.no_grad():
        out = model(*example_inputs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    batch = example_inputs[0].shape[0]
    if loss == "cross-entropy":
        classes = int(out.shape[-1])
        y = torch.randint(0, classes, tuple(out.shape[:-1]))
        return (y,), [input_spec(y, classes)]
    y = torch.randn(tuple(out.shape))
    del batch
    return (y,), [input_spec(y)]


def untie_parameters(model: torch.nn.Module):
    """Gives every parameter its own storage: a parameter registered under several names (a tied
    embedding and output head, GPT-2 style) gets an independent copy under each later name.

    Returns the tied groups, e.g. [["emb.weight", "head.weight"]] (first name: the original).
    torch.export's joint graph refuses a parameter that receives no gradient, which is what a
    second name of a shared parameter is. The runner gives every name of a group the same tensor
    and sums their gradients, so training is unchanged and the bytes are counted once.
    """
    seen: Dict[int, str] = {}
    groups: Dict[str, list] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        first = seen.get(id(param))
        if first is None:
            seen[id(param)] = name
            continue
        groups.setdefault(first, [first]).append(name)
        owner = model
        *path, leaf = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(
            owner,
            leaf,
            torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad),
        )
    return list(groups.values())
