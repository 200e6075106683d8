"""The exports: a PyTorch nn.Module as a TorchScript archive autobatch can train and size
(`export`), or as an AOTInductor package of one training step (`export_pt2`, docs/formats.md).

An archive carries its own input description (extra file ``autobatch/inputs.json``), so that
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

The modules, by concern (docs/architecture.md): _step.py (the model as one step, both formats),
_torchscript.py (the TorchScript export and the command line), _pt2.py (the pt2 package:
export_pt2), _pt2_joint.py (the joint graph and its gradient check), _pt2_memory.py (the package's
peaks against the eager step's), _inductor_patches.py (every patch of torch's internals, fenced by
a check of the names and signatures it needs). The subpackage imports nothing else of autobatch,
so that scripts/autobatch_export.py loads it from a checkout before the extension is built. This
file is its front door: the names the package, scripts and tests take from it.
"""

from __future__ import annotations

import glob
import os

from . import _inductor_patches as inductor_patches
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
from ._step import (
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
    input_spec,
    metadata,
    untie_parameters,
    unwrap,
)
from ._torchscript import export, main

# What the package, scripts and tests take from here (scripts/autobatch_export.py). A patch of the
# export's behaviour is made where the name is used: inductor_patches.<name> for the patches.
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
# (scripts/export_models.py, scripts/pt2_packages.py): every module of this subpackage.
SOURCES = tuple(sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))))
