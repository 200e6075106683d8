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
import re
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
    if isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "__getitem__")
                                 and not isinstance(out, torch.Tensor)):
        return list(out.keys())
    return None


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
            raise ValueError(f"the model returned {type(out).__name__} with no tensor entry "
                             f"(entries: {entries}); export a module that returns a tensor")
    if keys is None and pick is None:
        return model, args, loss
    return _Unwrapped(model, keys, pick), args, loss


def export(model: torch.nn.Module, path: str, example_inputs, loss: str = "mean",
           method: Optional[str] = None, int_high: Optional[Dict[int, int]] = None) -> str:
    """Scripts (or traces) ``model`` in training mode and saves it with its input description.

    ``example_inputs``: a tuple of tensors (positional inputs), or a dict of tensors (keyword
    inputs, as Hugging Face models take them; the archive's inputs follow the dict's order). A
    model that returns a dict or a ModelOutput is unwrapped (see unwrap: to its loss when it
    computes one from the example's labels, else to its logits). ``method``: "script", "trace",
    or None: script, but trace a model that needed unwrapping (transformers models do not script).
    Returns the metadata JSON written into the archive. Raises ValueError on bad arguments.
    """
    model = model.train()
    wrapped, example_inputs, loss = unwrap(model, example_inputs, loss)
    if method is None:
        method = "trace" if wrapped is not model else "script"
    model = wrapped
    meta = metadata(example_inputs, loss, int_high)
    if method == "script":
        scripted = torch.jit.script(model)
    elif method == "trace":
        scripted = torch.jit.trace(model, example_inputs)
    else:
        raise ValueError(f"unknown method '{method}': expected script or trace")
    how = json.dumps({"version": 1, "method": method})
    torch.jit.save(scripted, path, _extra_files={EXTRA_FILE: meta, EXPORT_FILE: how})
    return meta


# ---- The pt2 format: torch.export + AOTInductor (issue 19, docs/formats.md) ----

PT2_WEIGHTS = "data/autobatch/weights.pt"   # inside the package's archive folder
PT2_METADATA_KEY = "autobatch"               # aot_inductor.metadata key holding our JSON
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
        targets = args[self.n_inputs:]
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
            return (torch.nn.functional.cross_entropy(out.reshape(-1, classes),
                                                      targets[0].reshape(-1)),)
        if self.loss == "mse":
            return (torch.nn.functional.mse_loss(out, targets[0]),)
        return (out.mean(),)


def _example_targets(model: torch.nn.Module, example_inputs, loss: str):
    """The loss's targets for the example batch (package inputs after the model's) and their specs."""
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
        setattr(owner, leaf, torch.nn.Parameter(param.detach().clone(),
                                                requires_grad=param.requires_grad))
    return list(groups.values())


# ATen kernels a package calls as the eager step does (each with its backward where it has one),
# where core ATen's decomposition table (applied by the private joint export) and Inductor's (at
# compile) would replace them with finer ops that Inductor then fuses:
# - the CPU flash-attention kernel. core ATen's decomposition computes its forward as bmm /
#   softmax / bmm and hands the kernel's backward the attention matrix where the log-sum-exp
#   belongs: wrong q/k/v gradients, and the B x heads x T x T matrix saved (decoder_lm_small at
#   1024 tokens: +21-22% over the eager loop). Inductor's own torch.compile keeps it too
#   (torch/_inductor/decomposition.py, torch 2.11: decomps_to_exclude); called through the C shim.
# - cross-entropy's nll_loss and log_softmax backward. Fused, they skip the B x classes gradient
#   that eager's nll_loss_backward materialises before log_softmax's backward: one float
#   B x T x vocab tensor less at the loss (decoder_lm_small at 1024 tokens: -14% / -17% of the
#   eager loop at commit 8d1f277; -0.000% now, docs/fidelity-pt2.md). A user's compiled model
#   computes its loss outside the compiled code too. No C shim: AOTInductor calls them through its proxy executor.
# - concatenation. Eager's cat makes each input, then copies them into a new tensor; Inductor can
#   lower cat to a buffer its producers write into (ConcatKernel), where the inputs are never made
#   on their own. Kept as eager's kernel since issue 26; no effect measured yet (DenseNet-121 was
#   0.69% under with and without it: that was its poolings' inputs, _eager_lifetimes).
# docs/formats.md, "Exporting a package"; metadata "eager_kernels" lists those a package calls.
EAGER_KERNELS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "nll_loss_forward", "nll_loss_backward", "_log_softmax", "_log_softmax_backward_data",
    "mse_loss", "mse_loss_backward", "_softmax", "_softmax_backward_data",
    "_native_batch_norm_legit_functional", "native_batch_norm_backward",
    "native_layer_norm", "native_layer_norm_backward",
    "native_group_norm", "native_group_norm_backward",
    "relu", "threshold_backward", "gelu", "gelu_backward", "silu", "silu_backward",
    "hardswish", "hardswish_backward", "hardsigmoid", "hardsigmoid_backward",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "embedding_dense_backward",
    "cat",
)


class _eager_kernels:
    """Context manager: while it is open, neither core ATen's decomposition table
    (torch._decomp.core_aten_decompositions, which torch.export.experimental.
    _export_forward_backward imports inside the call) nor Inductor's (the name
    select_decomp_table in torch._inductor.compile_fx, read by every compile; Inductor caches the
    table it builds, so its dict cannot be edited instead) decomposes the EAGER_KERNELS, and
    Inductor lowers each to a call of the ATen kernel (make_fallback; override_decomp because the
    op still has a decomposition registered, which this context only hides). The joint graph
    calls them and so does the compiled code (tests/python/pt2_export_test.py reads the compiled
    models' extern-kernel lists). On exit, also on error, everything is as it was: both tables,
    and Inductor's lowering, fallback and realized-input registries for each op (a fallback left
    registered would make a later torch.compile in the process call eager's relu, which has no
    decomposition, instead of fusing it)."""

    def __enter__(self):
        import torch._decomp as decomp
        import torch._inductor.compile_fx as compile_fx
        import torch._inductor.lowering as lowering

        self._decomp, self._compile_fx, self._lowering = decomp, compile_fx, lowering
        self._core, self._inductor = decomp.core_aten_decompositions, compile_fx.select_decomp_table
        self._ops = [getattr(torch.ops.aten, name).default for name in EAGER_KERNELS]
        self._saved = {op: (op in lowering.lowerings, lowering.lowerings.get(op),
                            op in lowering.fallbacks, op in lowering.needs_realized_inputs)
                       for op in self._ops}
        ops, core, inductor = self._ops, self._core, self._inductor

        def core_table():
            decompositions = core()
            for op in ops:
                decompositions.pop(op, None)
            return decompositions

        def inductor_table():
            return {k: v for k, v in inductor().items() if k not in ops}

        decomp.core_aten_decompositions = core_table
        compile_fx.select_decomp_table = inductor_table
        try:
            for op in ops:
                lowering.make_fallback(op, warn=False, override_decomp=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self._decomp.core_aten_decompositions = self._core
        self._compile_fx.select_decomp_table = self._inductor
        lowering = self._lowering
        for op, (lowered, handler, fallback, realized) in self._saved.items():
            if lowered:
                lowering.lowerings[op] = handler
            else:
                lowering.lowerings.pop(op, None)
            if not fallback:
                lowering.fallbacks.discard(op)
            if not realized:
                lowering.needs_realized_inputs.discard(op)
        return False


def _cpu_eager_dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """aten::dropout as eager PyTorch runs it on the CPU (aten/src/ATen/native/Dropout.cpp, torch
    2.11: ``is_fused_kernel_acceptable`` holds for CUDA, XPU, lazy and PrivateUse1 tensors only, so
    a CPU tensor takes ``_dropout<false>``): a noise tensor of the input's shape and dtype filled by
    ``bernoulli_(1 - p)``, divided by ``1 - p`` in place and multiplied into the input; autograd
    saves the noise for the backward. ``p == 0``, eval mode and empty inputs return the input
    itself, ``p == 1`` multiplies by a zero scalar, as there. The decomposition torch.export applies
    instead (torch/_decomp/decompositions.py: ``native_dropout``) saves a bool mask: one byte per
    element where the eager CPU step holds four, and a copy of the input where eager returns it."""
    if p < 0 or p > 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 0 or not train or input.numel() == 0:
        return input
    if p == 1:
        return input * torch.zeros((), dtype=input.dtype, device=input.device)
    noise = torch.empty_like(input).bernoulli_(1 - p)
    noise.div_(1 - p)
    return input * noise


class _eager_dropout:
    """Context manager for the joint export: ``aten.dropout`` (nn.Dropout, F.dropout, and the
    dropout inside scaled_dot_product_attention's math path) is traced as _cpu_eager_dropout.
    torch registers its decomposition as the op's Python kernel for CompositeImplicitAutograd and
    Autograd (``py_kernels``), which the export's tracing calls before any decomposition table is
    read, so those entries are replaced, and restored on exit (also on error).

    Why (issue 26): a GPT-2 from a config (dropout 0.1 in five places and in its attention) was
    under the eager step by 1,769,636 bytes at batch 2 with every other buffer as eager's (2.01%):
    exactly the noise bytes eager holds beyond the bool masks. Packages are CPU-only, so the CPU's
    form is the eager step's; a CUDA eager step saves the bool mask, as ``native_dropout`` does."""

    def __enter__(self):
        self._op = torch.ops.aten.dropout.default
        self._saved = dict(self._op.py_kernels)
        for key in self._saved:
            self._op.py_kernels[key] = _cpu_eager_dropout
        self._op._dispatch_cache.clear()
        return self

    def __exit__(self, *exc):
        self._op.py_kernels.clear()
        self._op.py_kernels.update(self._saved)
        self._op._dispatch_cache.clear()
        return False


class _eager_buffers:
    """Context manager for a compile: the compiled step allocates and frees as the eager step does,
    one tensor per op, each freed after its last use (issue 26). Four of Inductor's ways differ:
    - it computes a pointwise value inside each op that reads it instead of storing it (an
      unrealized TensorBox is inlined into its consumers' code): here every ATen op's result
      that is neither a view nor a mutation is realized as it is lowered
      (GraphLowering.run_node, torch/_inductor/graph.py, torch 2.11);
    - it fuses ops into one kernel, whose intermediate buffers become locals of the kernel:
      ``max_fusion_size`` 1 (set by _export_pt2) fuses nothing;
    - its C++ backend emits consecutive kernels as one function, allocating every output of
      the group before the call and freeing after it: here each kernel is flushed on its own
      (CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM below zero, torch/_inductor/codegen/cpp.py);
    - its memory planner keeps a dead buffer allocated until a later buffer of the same size
      reuses it, possibly in the backward: ``allow_buffer_reuse`` off (set by _export_pt2).
    Measured (docs/formats.md): a GPT-2 from a config, whose tanh GELU is eight ATen ops
    written in Python, was 7.13% under the eager step at batch 2 (2.01% with the first two, the
    rest its dropouts: _eager_dropout); a small ViT was 6.2% over at batch 8 with the first two
    and -0.000% with all four. Restores what it changed on exit, also on error."""

    def __enter__(self):
        from torch._inductor.graph import GraphLowering
        from torch._inductor.ir import TensorBox

        self._class, self._original = GraphLowering, GraphLowering.run_node
        original = self._original

        def run_node(lowering, node):
            result = original(lowering, node)
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
                    not target.is_view and not target._schema.is_mutable:
                for value in result if isinstance(result, (list, tuple)) else (result,):
                    if isinstance(value, TensorBox):
                        value.realize()
            return result

        GraphLowering.run_node = run_node
        from torch._inductor.codegen.cpp import CppScheduling

        self._cpp, self._args = CppScheduling, CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM
        CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = -1  # flush after every kernel
        return self

    def __exit__(self, *exc):
        self._class.run_node = self._original
        self._cpp.MAX_FUSED_KERNEL_ARGS_NUM = self._args
        return False


class _eager_lifetimes:
    """Context manager for a compile: every tensor an op of the graph takes as an argument stays
    allocated until that op has run, as in the eager step, where an op is called with its
    arguments alive (issue 26). Inductor keeps a buffer until the last kernel that reads it, and
    some of its lowerings take a tensor without reading it: ``avg_pool2d_backward`` reads only
    its input's sizes (torch/_inductor/lowering.py, torch 2.11), so the pooling's input was
    freed after the forward's pooling, where eager's autograd saves it for the backward
    (AvgPool2DBackward0 keeps ``self``). Here each operation made while a graph node is lowered
    gets a dependency on the buffers of the node's tensor arguments that none of its kernels
    reads (``additional_star_deps``, the scheduler's own way to add one: a StarDep, a read of
    the whole buffer that keeps it alive); graph inputs and constants are always alive and are
    left out.
    Measured (docs/formats.md): DenseNet-121 at 3x64x64 was refused without this (0.70% under the
    eager step at batch 8): each transition's 1x1 convolution output, which only the average
    pooling after it saves, was freed in the forward where eager held it into the backward
    (1 MiB and 512 KiB of the eager step's peak at batch 8); with it, +0.043% / +0.109% at batch
    2 / 8. Enter after _eager_buffers, so that the results it realizes are among the operations
    made; restores what it changed on exit, also on error."""

    def __enter__(self):
        from torch._inductor.graph import GraphLowering
        from torch._inductor.ir import BaseView, Buffer, MutableBox

        self._class, self._original = GraphLowering, GraphLowering.run_node
        original = self._original

        def argument_buffers(value):
            # the buffer a value is stored in (through its views), not what computing it read:
            # a ComputedBuffer's get_read_names() names its own inputs
            if isinstance(value, (list, tuple)):
                return set().union(*(argument_buffers(v) for v in value))
            while isinstance(value, (MutableBox, BaseView)):  # TensorBox, StorageBox, views
                value = value.data
            return {value.get_name()} if isinstance(value, Buffer) else set()

        def run_node(lowering, node):
            start = len(lowering.operations)
            result = original(lowering, node)
            if node.op != "call_function" or len(lowering.operations) == start:
                return result
            made = lowering.operations[start:]
            names = set()
            for argument in node.all_input_nodes:
                names |= argument_buffers(lowering.env.get(argument))
            # only the arguments none of the node's kernels reads: a dependency on a buffer a
            # kernel reads would also stop Inductor from writing that kernel's result into it
            # where it dies (inplace_buffers), which this does not mean to change
            names = {n for n in names if n in lowering.name_to_buffer}
            for operation in made:
                names -= set(operation.get_read_names())
                names -= {buffer.get_name() for buffer in operation.get_outputs()}
            for operation in made:
                lowering.additional_star_deps[operation.get_operation_name()].update(names)
            return result

        GraphLowering.run_node = run_node
        return self

    def __exit__(self, *exc):
        self._class.run_node = self._original
        return False


def eager_kernels(joint) -> list:
    """The EAGER_KERNELS (and their backward kernels) the joint graph calls, as sorted
    "aten.<name>" strings: metadata "eager_kernels"."""
    names = {f"aten.{n.target._opname}" for n in joint.graph.nodes
             if n.op == "call_function" and hasattr(n.target, "_opname")
             and any(n.target._opname in (k, k + "_backward") for k in EAGER_KERNELS)}
    return sorted(names)


def export_joint(wrapped: torch.nn.Module, args, dynamic_shapes):
    """torch.export of the model with its loss, then the joint forward-backward graph.

    The one place that calls the private API (torch 2.11:
    torch.export.experimental._export_forward_backward); tests/pt2_export_test.py checks the
    call, the output kinds and the gradients, so an API change fails loudly there.
    Returns (joint ExportedProgram, gradient order: parameter names in output order).
    """
    import torch.export.experimental  # noqa: F401  (not imported by torch.export itself)
    from torch.export.graph_signature import OutputKind

    with _eager_dropout():
        ep = torch.export.export(wrapped, tuple(args), dynamic_shapes=dynamic_shapes)
    with _eager_kernels(), _eager_dropout():
        joint = torch.export.experimental._export_forward_backward(ep, joint_loss_index=0)
    kinds = [spec.kind for spec in joint.graph_signature.output_specs]
    if kinds.count(OutputKind.LOSS_OUTPUT) != 1:
        raise RuntimeError(f"joint graph: expected one LOSS_OUTPUT, got output kinds {kinds}")
    gradients = [spec.target for spec in joint.graph_signature.output_specs
                 if spec.kind == OutputKind.GRADIENT_TO_PARAMETER]
    return joint, gradients


def accumulating_program(joint, tied=()):
    """The joint program made to accumulate: each parameter's gradient is added into a buffer
    ``autobatch_grad.<name>`` (a BUFFER input and a BUFFER_MUTATION output, as BatchNorm's running
    stats are) instead of being returned; the program returns the loss only.

    Why: with 2 micro-batches per step the plain program returns the whole second set of
    gradients at the end of its call while the first set is held to be added to; an eager
    backward adds each gradient into ``.grad`` as it is made. ResNet-18 at 3x64x64, batch 8 x 2
    micro-batches: +10.5% over the TorchScript peak with the plain call, -0.4% with this one
    (scripts/bench/formats.py, docs/formats.md). The runner points the buffers at its ``.grad``
    tensors and the compiled code writes into them. Each add is placed right after its gradient is made, so
    Inductor frees the gradient there.

    ``tied``: groups of parameter names (``model.`` prefixed) sharing one tensor in the runner:
    their gradients are summed in the graph into one buffer, the group's first name (two buffers
    on one tensor would each add to the old value, and one add would be lost).
    Returns an ExportedProgram; raises RuntimeError when the joint graph is not the expected
    shape (a torch whose joint export changed)."""
    import copy

    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec,
                                              OutputKind, OutputSpec, TensorArgument)

    module = copy.deepcopy(joint.graph_module)
    graph = module.graph
    signature = joint.graph_signature
    nodes = {n.name: n for n in graph.nodes}
    user_inputs = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    if not user_inputs:
        raise RuntimeError("joint graph: expected user inputs")
    first_user = nodes[user_inputs[0].arg.name]
    parameter_node = {s.target: nodes[s.arg.name] for s in signature.input_specs
                      if s.kind == InputKind.PARAMETER}
    gradient_node = {s.target: nodes[s.arg.name] for s in signature.output_specs
                     if s.kind == OutputKind.GRADIENT_TO_PARAMETER}
    owner = {}
    for group in tied:
        for name in group:
            owner[name] = group[0]
    groups: Dict[str, list] = {}
    for name in gradient_node:
        groups.setdefault(owner.get(name, name), []).append(name)
    order = list(graph.nodes)
    position = {n: i for i, n in enumerate(order)}
    new_inputs, new_outputs = [], []
    state = dict(joint.state_dict)
    for stored, names in groups.items():
        if stored not in parameter_node:
            raise RuntimeError(f"joint graph: expected parameter {stored} among its inputs")
        target = PT2_GRAD_PREFIX + stored
        with graph.inserting_before(first_user):
            # a Python identifier: FX writes the name into generated code, and module names
            # need not be one (torchvision's RegNet: "block1-0" failed with a SyntaxError)
            buffer = graph.placeholder("b_" + re.sub(r"\W", "_", target))
        buffer.meta = dict(parameter_node[stored].meta)
        made = sorted((gradient_node[n] for n in names), key=position.__getitem__)
        total = made[0]
        for gradient in made[1:]:
            with graph.inserting_after(gradient):
                summed = graph.call_function(torch.ops.aten.add.Tensor, (total, gradient))
            summed.meta = dict(gradient.meta)
            total = summed
        with graph.inserting_after(total):
            added = graph.call_function(torch.ops.aten.add.Tensor, (buffer, total))
        added.meta = dict(total.meta)
        new_inputs.append(InputSpec(InputKind.BUFFER, TensorArgument(buffer.name), target, True))
        new_outputs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(added.name),
                                      target))
        state[target] = torch.zeros_like(joint.state_dict[stored])
    # Outputs as torch.export orders them: mutations first, then the loss.
    kept = [s for s in signature.output_specs if s.kind != OutputKind.GRADIENT_TO_PARAMETER]
    specs = ([s for s in kept if s.kind == OutputKind.BUFFER_MUTATION] + new_outputs +
             [s for s in kept if s.kind != OutputKind.BUFFER_MUTATION])
    by_name = {n.name: n for n in graph.nodes}
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = (tuple(by_name[s.arg.name] for s in specs),)
    graph.lint()
    module.recompile()
    inputs = list(signature.input_specs)
    at = inputs.index(user_inputs[0])
    inputs = inputs[:at] + new_inputs + inputs[at:]
    return ExportedProgram(root=module, graph=graph,
                           graph_signature=ExportGraphSignature(inputs, specs),
                           state_dict=state, range_constraints=joint.range_constraints,
                           module_call_graph=joint.module_call_graph,
                           example_inputs=joint.example_inputs, constants=joint.constants,
                           verifiers=[joint.verifier])


def _early_writes(nodes):
    """A schedule for Inductor: its nodes in their given order (autograd's, as the joint graph
    was traced), except that each write into a graph input or a constant (a BUFFER_MUTATION:
    the accumulating model's gradient buffers, BatchNorm's running stats) runs as soon as what
    it writes has been computed and every other reader of the buffer has run.

    Why: AOTAutograd's functionalization moves every such write to the end of the graph, and
    Inductor fuses them there. The accumulating model then held every new sum (gradient plus
    buffer) until the end of the call: +6.8% over the TorchScript archive at 64 x 2 micro-batches
    on mlp_wide_tiny (Pt2RunnerTest.PeaksAreThoseOfTheTorchScriptArchiveAtOneAndTwoMicroBatches). An eager backward adds each gradient into ``.grad`` as it
    is made. Inductor's memory-driven reordering also moved the writes up, but it moves
    everything else too (MobileNetV3 below its TorchScript archive: the
    mobilenet_v3_large_64_reordered variant of scripts/pt2_packages.py). Used by _eager_order."""
    from torch._inductor.virtualized import V

    targets = set(V.graph.graph_inputs) | set(V.graph.constants)
    producer = {name: node for node in nodes for name in node.get_buffer_names()}
    readers = {}
    for node in nodes:
        for dep in node.read_writes.reads:
            readers.setdefault(dep.name, set()).add(node)
    deps = {node: {producer[d.name] for d in node.unmet_dependencies if d.name in producer}
            for node in nodes}
    early = []
    for node in nodes:
        written = {name for buf in node.get_outputs() for name in buf.get_mutations()} & targets
        if written:
            early.append(node)
            for name in written:
                deps[node] |= readers.get(name, set()) - {node}
    early_set = set(early)
    done, order = set(), []

    def flush():
        moved = True
        while moved:
            moved = False
            for node in list(early):
                if deps[node] <= done:
                    early.remove(node)
                    order.append(node)
                    done.add(node)
                    moved = True

    for node in nodes:
        flush()
        if node in early_set:
            continue
        order.append(node)
        done.add(node)
    flush()
    if len(order) != len(nodes):
        raise RuntimeError(f"_early_writes: scheduled {len(order)} of {len(nodes)} nodes")
    return order


class _eager_order:
    """Context manager for a compile: Inductor's peak-memory reordering pass
    (torch._inductor.memory.reorder_for_peak_memory, torch 2.11, on by default) chooses between
    the order it was given and _early_writes only, instead of its own topological sorts, which
    reorder the whole step to lower its peak below the eager step's. The pass keeps whichever of
    the two its estimate says peaks lower. Restores the pass on exit, also on error."""

    def __enter__(self):
        import torch._inductor.memory as memory

        self._memory, self._original = memory, memory.reorder_for_peak_memory
        original = self._original

        def reorder(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs,
                    methods=None):
            return original(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs,
                            methods=[_early_writes])

        memory.reorder_for_peak_memory = reorder
        return self

    def __exit__(self, *exc):
        self._memory.reorder_for_peak_memory = self._original
        return False


def _compile_package(path: str, programs, inductor_configs):
    """AOTInductor-compiles each program and writes one package holding them all, each under
    its name (torch._inductor.aoti_compile_and_package does one; this is its multi-model form,
    documented there: aot_compile with aot_inductor.package, then package_aoti)."""
    from torch._inductor.package import package_aoti

    files = {}
    for name, program in programs.items():
        module = _constants_as_buffers(program.module(check_guards=False))
        args, kwargs = program.example_inputs
        with _eager_kernels(), _eager_order(), _eager_buffers(), _eager_lifetimes():
            files[name] = torch._inductor.aot_compile(
                module, args, kwargs, options={**inductor_configs, "aot_inductor.package": True})
    return package_aoti(path, files)


def _constants_as_buffers(module: torch.nn.Module) -> torch.nn.Module:
    """Registers every plain tensor attribute the unlifted graph reads (torch.export's lifted
    tensor constants, ``model.lifted_tensor_0``: a ``torch.tensor([...])`` made in forward) as a
    non-persistent buffer of the same name, in place; returns ``module``.

    Why: Inductor names a get_attr constant that is neither parameter nor buffer after itself
    (``_tensor_constant0``), not after its place in the model, so the runner, which supplies
    every constant by the name the package asks for (``get_constant_fqns``) from the stored
    tensors, found none for it (issue 26: a package that its own runner refused to load). As a
    buffer it keeps its name, which is its key in the program's ``constants`` and in the
    package's stored tensors."""
    buffers = {name for name, _ in module.named_buffers()}
    parameters = {name for name, _ in module.named_parameters()}
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target in buffers or node.target in parameters:
            continue
        *path, leaf = node.target.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, leaf)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            delattr(owner, leaf)
            owner.register_buffer(leaf, value, persistent=False)
            buffers.add(node.target)
    return module


def stored_tensors(wrapped: torch.nn.Module, joint) -> Dict[str, torch.Tensor]:
    """Every tensor the compiled step reads, by the name the package asks for it: the parameters
    and persistent buffers (``state_dict``), and what ``state_dict`` leaves out, the
    non-persistent buffers (Llama's ``rotary_emb.inv_freq``) and the lifted tensor constants,
    which torch.export keeps in the program's ``constants``. Contiguous: the compiled code reads
    each one in the layout it had at export."""
    state = {k: v.detach().contiguous().clone()
             for k, v in wrapped.state_dict(keep_vars=False).items()}
    for name, value in joint.constants.items():
        if isinstance(value, torch.Tensor) and name not in state:
            state[name] = value.detach().contiguous().clone()
    return state


def check_constants_stored(package_path: str, state: Dict[str, torch.Tensor]) -> None:
    """Opens each compiled model of the finished package with Python's AOTInductor loader and
    checks that every constant it asks for is among the stored tensors (the accumulating model's
    gradient buffers excepted: the runner makes those), as the C++ runner will require.
    Raises ValueError naming the missing constants: a package its runner cannot load is never
    reported as exported."""
    from torch._inductor.package import load_package

    for model_name in ("model", PT2_ACCUMULATE_MODEL):
        wanted = load_package(package_path, model_name).get_constant_fqns()
        missing = sorted(n for n in wanted
                         if n not in state and not n.startswith(PT2_GRAD_PREFIX))
        if missing:
            raise ValueError(
                f"{package_path}: the compiled {model_name!r} reads constants that the export "
                f"did not store: {missing}; this is a fault of the exporter (please report it), "
                f"export the model in the TorchScript format meanwhile")


def _unguarded_acc_helper():
    """A patch for Inductor's C++ codegen (torch 2.11, torch/_inductor/codegen/cpp.py,
    CppKernel.need_use_acc_helper): for a float sum whose size depends on the batch it takes the
    exact accumulation helper instead of comparing the size with 4096 at the example's batch. The
    comparison adds a guard on the batch (s <= 4096 / k, or s > 4096 / k), and two of them can
    narrow the batch's range to the example's alone: mlp_8x2048 exported at batch 2 compiled a
    package that runs only at batch 2 ("mat1 and mat2 shapes cannot be multiplied (2048x2 and
    16x2048)" at batch 16). The helper is what Inductor itself uses when the size is unknown.
    Returns a context manager (a no-op when the method is not there any more)."""
    import contextlib
    import functools
    import operator
    from unittest import mock

    try:
        from torch._inductor.codegen.cpp import CppKernel
    except ImportError:
        return contextlib.nullcontext()
    original = getattr(CppKernel, "need_use_acc_helper", None)
    if original is None:
        return contextlib.nullcontext()

    def need_use_acc_helper(self, reduction_type, dtype, use_scalar):
        if reduction_type == "sum" and dtype == torch.float and self.call_ranges is not None:
            size = functools.reduce(operator.mul, self.call_ranges[self.reduction_depth:], 1)
            if getattr(size, "free_symbols", None):
                return True
        return original(self, reduction_type, dtype, use_scalar)

    return mock.patch.object(CppKernel, "need_use_acc_helper", need_use_acc_helper)


def _hinted_conv_backend():
    """A patch for the fake convolution of torch 2.11 (torch/_subclasses/fake_impls.py, conv): it
    asks ATen which convolution backend a real call would take (torch._C._select_conv_backend) to
    give the fake output that backend's memory format, and ATen's choice compares the batch with
    16 (ATen/native/Convolution.cpp, ConvParams::use_nnpack and use_mkldnn: "input.size(0) >=
    16"). On a symbolic batch that comparison is a guard ("s0 < 16" in TORCH_LOGS=dynamic), and
    the compiled ResNet-18 ran batches 2 to 15 only. Here the question is asked of a
    tensor with the example's sizes instead: the answer (the memory format) is the same at every
    batch for the contiguous fp32 CPU inputs this format supports, and no guard is added.
    Returns a context manager (a no-op when the function is not there any more)."""
    import contextlib
    from unittest import mock

    original = getattr(torch._C, "_select_conv_backend", None)
    if original is None:
        return contextlib.nullcontext()

    def concrete(value):
        if not isinstance(value, torch.Tensor) or not any(
                isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
            return value
        from torch.fx.experimental.symbolic_shapes import size_hint
        return torch.empty_strided([size_hint(s) for s in value.shape],
                                   [size_hint(s) for s in value.stride()],
                                   dtype=value.dtype, device=value.device)

    def select_conv_backend(*args, **kwargs):
        args = tuple(concrete(a) for a in args)
        kwargs = {k: concrete(v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    return mock.patch.object(torch._C, "_select_conv_backend", select_conv_backend)


def batch_range(package_path: str):
    """The batch sizes the compiled package accepts: (low, high or None), read from the input
    checks AOTInductor writes into its wrapper ("dim value is too small at 0, expected it to be >=
    N"): what Inductor's guards left of Dim("B", min=1)."""
    import zipfile

    low, high = 1, None
    with zipfile.ZipFile(package_path) as archive:
        for name in archive.namelist():
            if not name.endswith(".wrapper.cpp"):
                continue
            text = archive.read(name).decode("utf-8", "replace")
            for m in re.finditer(r"arg\d+_1_size\[0\] < (\d+)\)", text):
                low = max(low, int(m.group(1)))
            for m in re.finditer(r"arg\d+_1_size\[0\] > (\d+)\)", text):
                high = int(m.group(1)) if high is None else min(high, int(m.group(1)))
    return low, high


def eager_batch1_error(wrapped: torch.nn.Module, args: Sequence[torch.Tensor]) -> Optional[str]:
    """What the eager step (forward, loss, backward; on a copy, in training mode) raises at batch
    1, or None when it runs. torch.export traces at a batch of 2 or more (it specialises sizes 0
    and 1), so a check that only batch 1 trips, such as BatchNorm's "Expected more than 1 value
    per channel when training" (torch/nn/functional.py, _verify_batch_size), is not in the
    compiled code: the package would run a batch the user's eager job cannot. The runner fails
    such a batch as the eager step would (src/trial_runner.cpp)."""
    import copy

    probe = copy.deepcopy(wrapped).train()
    try:
        (loss,) = probe(*[a[:1] for a in args])
        loss.backward()
    except Exception as error:  # any failure of the user's step at batch 1 is what we record
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0] if text else ''}"
    return None


# Largest difference allowed between the joint graph's gradients and eager autograd's at the
# example batch, relative to each gradient's largest element (floored at 1e-3 of the largest of
# all, so a gradient that is 0 in exact arithmetic is not judged by its rounding noise). Both run
# the same float32 kernels in the same order except where a decomposition replaced one, so they
# agree to float32 rounding (at most 2.6e-5 on the models of scripts/pt2_packages.py, bn1d_tiny;
# exactly on ResNet-18 and the decoders, which run EAGER_KERNELS); torch 2.11's decomposed CPU
# flash attention was off by 6.3 on a tiny attention model and by 8.7e4 on decoder_lm_small.
GRADIENT_CHECK_TOLERANCE = 1e-3
# Ops that draw random numbers: eager and the joint graph draw them differently (dropout's mask),
# so their gradients cannot be compared and the check is skipped.
_RANDOM_OPS = ("bernoulli", "rand", "randn", "randint", "randperm", "normal", "uniform",
               "native_dropout", "multinomial", "exponential", "geometric", "cauchy", "poisson")


def joint_gradient_check(wrapped: torch.nn.Module, joint, args: Sequence[torch.Tensor]) -> dict:
    """Runs the joint graph (uncompiled) and the eager step (forward, loss, backward; on a copy)
    on the example batch and compares every gradient: the export's own proof that the graph it
    compiles computes the user's gradients. Catches a decomposition whose forward no longer
    matches the native backward that consumes it (torch 2.11: core ATen's decomposition of
    _scaled_dot_product_flash_attention_for_cpu returns the attention matrix where the kernel's
    backward reads the log-sum-exp; see EAGER_KERNELS), and any such fault to come.

    Returns metadata ``gradient_check``: {"max_relative_diff": float, "worst": name} or
    {"skipped": reason}. Raises ValueError naming the parameter when the difference is over
    GRADIENT_CHECK_TOLERANCE. Side effects: none on ``wrapped`` (a copy runs)."""
    import copy

    from torch.export.graph_signature import InputKind, OutputKind

    random = sorted({str(n.target) for n in joint.graph.nodes if n.op == "call_function"
                     and any(getattr(n.target, "_opname", "").startswith(r) for r in _RANDOM_OPS)})
    if random:
        return {"skipped": f"random ops ({', '.join(random)}): eager draws other numbers"}
    users = iter(args)
    flat = []
    for spec in joint.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(users).clone())
        elif spec.target in joint.state_dict:
            flat.append(joint.state_dict[spec.target].detach().clone())
        else:
            flat.append(joint.constants[spec.target])
    with torch.no_grad():
        outputs = joint.graph_module(*flat)
    joint_grads = {spec.target: out for spec, out in zip(joint.graph_signature.output_specs, outputs)
                   if spec.kind == OutputKind.GRADIENT_TO_PARAMETER}
    probe = copy.deepcopy(wrapped).train()
    (loss,) = probe(*[a.clone() for a in args])
    loss.backward()
    eager = {n: p.grad for n, p in probe.named_parameters() if p.grad is not None}
    floor = 1e-3 * max((g.abs().max().item() for g in eager.values()), default=0.0)
    compared = sorted(set(joint_grads) & set(eager))
    if joint_grads and not compared:
        raise ValueError(
            f"the exported training step's gradients ({', '.join(sorted(joint_grads)[:3])}, ...) "
            f"name no parameter the eager step trains; export it in the TorchScript format "
            f"instead (--format torchscript)")
    worst, worst_name = 0.0, ""
    for name in compared:  # a parameter eager does not train (frozen) has no gradient to compare
        grad = joint_grads[name]
        scale = max(eager[name].abs().max().item(), floor)
        diff = (grad - eager[name]).abs().max().item() / scale if scale > 0 else 0.0
        if diff != diff:  # NaN (a NaN gradient on either side): the worst there is
            diff = float("inf")
        if diff > worst or worst_name == "":
            worst, worst_name = diff, name
    if worst > GRADIENT_CHECK_TOLERANCE:
        raise ValueError(
            f"the exported training step computes other gradients than eager PyTorch: {worst_name}"
            f" differs by {worst:.3g} of its largest element at the example batch (allowed "
            f"{GRADIENT_CHECK_TOLERANCE:g}); a torch.export decomposition changed what the step "
            f"computes. Export it in the TorchScript format instead (--format torchscript)")
    return {"max_relative_diff": float(f"{worst:.3g}"), "worst": worst_name}


# ---- The export's memory check (issue 26) ----

# Inductor settings applied last to the package's compile: empty here. tests/python/
# pt2_export_test.py puts Inductor's locality pass back ({"reorder_for_locality": True}) to make a
# package that under-counts, which the memory check must refuse.
_INDUCTOR_OVERRIDES: Dict[str, object] = {}

# A package whose peak is under the eager step's by more than MEMORY_UNDER_PCT is not written (an
# under-count is an out-of-memory error in the user's job at the batch called safe); over by more
# than MEMORY_OVER_PCT it is written with a warning (a cautious answer). Differences of
# MEMORY_FLOOR_BYTES or less are within both: a tiny model's peak is a few KB, where one
# bookkeeping tensor is a percent, and no GPU job fails on 64 KiB.
MEMORY_UNDER_PCT = 0.5
MEMORY_OVER_PCT = 1.0
MEMORY_FLOOR_BYTES = 64 * 1024


def _batch_of(example_inputs: Sequence[torch.Tensor], batch: int,
              int_high: Optional[Dict[int, int]]) -> tuple:
    """Random inputs like the examples at another batch: float as randn, integers below the
    bound the metadata gives them (input_spec), as the runner makes them."""
    int_high = int_high or {}
    made = []
    for i, t in enumerate(example_inputs):
        shape = (batch, *t.shape[1:])
        if t.dtype in (torch.int64, torch.int32):
            high = int_high.get(i)
            if high is None:
                high = int(t.max().item()) + 1 if t.numel() else 1
            made.append(torch.randint(0, high, shape, dtype=t.dtype))
        elif t.dtype == torch.bool:
            made.append(torch.randint(0, 2, shape).bool())
        else:
            made.append(torch.randn(shape, dtype=t.dtype))
    return tuple(made)


def _target_maker(model: torch.nn.Module, example_inputs, loss: str):
    """A function batch -> the loss's random targets at that batch (as _example_targets makes
    them at the example batch), from one no-grad forward on the examples."""
    if loss not in ("cross-entropy", "mse"):
        return lambda batch: ()
    with torch.no_grad():
        out = model(*example_inputs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    tail = tuple(out.shape[1:])
    if loss == "cross-entropy":
        classes = int(out.shape[-1])
        return lambda batch: (torch.randint(0, classes, (batch, *tail[:-1])),)
    return lambda batch: (torch.randn((batch, *tail)),)


def eager_step_peak(model: torch.nn.Module, loss: str, example_inputs: Sequence[torch.Tensor],
                    batch: int, int_high: Optional[Dict[int, int]] = None, steps: int = 2) -> int:
    """The peak bytes of the user's job at ``batch``: an eager loop with PyTorch's defaults, as the
    runner replays it (CPU, fp32, AdamW in its per-parameter loop, PyTorch's CPU default;
    ``zero_grad(set_to_none=True)``; the output dropped before backward; ``steps`` steps, so the
    optimizer state is there in the second). Measured as scripts/bench/fidelity.py measures the
    eager column: torch.profiler's CPU allocation events ("[memory]", signed byte counts) summed
    in time order, the maximum taken, plus the parameters and buffers alive before.

    Trains ``model`` in place (its weights change): pass a copy. Raises what the step raises."""
    from torch.profiler import ProfilerActivity, profile

    n_inputs = len(example_inputs)
    wrapped = _WithLoss(model, loss, n_inputs).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                  foreach=False)
    before = sum(t.numel() * t.element_size()
                 for t in list(model.parameters()) + list(model.buffers()))
    make_targets = _target_maker(model, example_inputs, loss)  # its forward before the profile
    x = None  # the loop's variables: alive until rebound, as in a user's script
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            x = _batch_of(example_inputs, batch, int_high)
            targets = make_targets(batch)
            (value,) = wrapped(*x, *targets)
            value.backward()
            del value, targets
            optimizer.step()
    del x
    return before + profiled_peak(prof)


def profiled_peak(prof) -> int:
    """The largest sum of CPU bytes alive at once over a torch.profiler run with
    profile_memory=True: its "[memory]" events (allocations +, frees -) summed in time order.
    Bytes allocated before the profile started are not in it (the caller adds them)."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and str(e.device_type()).endswith("CPU")]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def find_cli(cli: Optional[str] = None) -> Optional[str]:
    """The autobatch executable the memory check runs: ``cli`` when given, else $AUTOBATCH_CLI,
    else this checkout's build (build/bin/autobatch) when this file is in a checkout, or the
    executable installed beside this Python when it is the installed package, else ``autobatch``
    on PATH;
    None when there is none. Raises ValueError when ``cli`` or $AUTOBATCH_CLI names no
    executable file (a wrong path is a mistake, not a reason to skip the check)."""
    import os
    import shutil

    for given, what in ((cli, "the autobatch executable given"),
                        (os.environ.get("AUTOBATCH_CLI"), "$AUTOBATCH_CLI")):
        if given:
            if not (os.path.isfile(given) and os.access(given, os.X_OK)):
                raise ValueError(f"{what} ({given}) is not an executable file; build it with "
                                 f"scripts/build.sh or give the path of bin/autobatch")
            return given
    import sys

    # In a checkout (this file is src/python/autobatch/_export.py there, loaded by the shim in
    # scripts/): the checkout's own build, never an executable installed elsewhere. In the
    # installed package: the executable installed with it, beside this Python. Then PATH.
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    if os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        build_dir = os.environ.get("AUTOBATCH_BUILD_DIR", os.path.join(root, "build"))
        built = os.path.join(build_dir, "bin", "autobatch")
    else:
        built = os.path.join(os.path.dirname(sys.executable), "autobatch")
    if os.path.isfile(built) and os.access(built, os.X_OK):
        return built
    return shutil.which("autobatch")


def package_step_peak(cli: str, package: str, batch: int, limit_bytes: int) -> int:
    """The package's peak at ``batch`` as autobatch measures it: ``--check-batch`` with the
    defaults eager_step_peak replays (AdamW loop, zero_grad none, output dropped, margin 0),
    trials[0].peak_allocated_bytes of its JSON report. Raises ValueError when the run fails
    (with its exit code and the end of its error output)."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="autobatch-export-check-") as folder:
        report = os.path.join(folder, "check.json")
        command = [cli, "--model", package, "--device", "cpu", "--check-batch", str(batch),
                   "--margin", "0", "--memory-limit", f"{limit_bytes}B", "--optimizer", "adamw",
                   "--optimizer-impl", "loop", "--zero-grad", "none", "--keep-output", "no",
                   "--json", report, "-q"]
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        if run.returncode != 0 or not os.path.exists(report):
            tail = "\n".join(run.stderr.strip().splitlines()[-5:])
            raise ValueError(f"the memory check could not run the package at batch {batch} "
                             f"({' '.join(command)}: exit {run.returncode}): {tail}")
        with open(report) as f:
            return int(json.load(f)["trials"][0]["peak_allocated_bytes"])


def memory_check(model: torch.nn.Module, package: str, loss: str,
                 example_inputs: Sequence[torch.Tensor], int_high: Optional[Dict[int, int]],
                 batches: Sequence[int], cli: Optional[str]) -> dict:
    """Measures the eager step (eager_step_peak, on a copy of ``model``) and the finished package
    (package_step_peak) at each of ``batches``; returns the document stored as PT2_MEMORY_CHECK.
    Status "passed" (every batch within the bounds above), "over" (some batch over by more than
    MEMORY_OVER_PCT: written, with a warning), "not-run" (no autobatch executable: ``reason`` says
    so and a run on the package warns). Raises ValueError naming both peaks when the package is
    under the eager step's by more than MEMORY_UNDER_PCT at any batch."""
    import copy

    found = find_cli(cli)
    if found is None:
        return {"status": "not-run", "rows": [],
                "reason": "no autobatch executable was found to run the package (give "
                          "--autobatch PATH or set AUTOBATCH_CLI)"}
    rows, status = [], "passed"
    for batch in batches:
        torch.manual_seed(0)
        eager = eager_step_peak(copy.deepcopy(model), loss, example_inputs, batch, int_high)
        package_peak = package_step_peak(found, package, batch, max(4 << 30, 4 * eager))
        difference = package_peak - eager
        pct = 100.0 * difference / eager
        rows.append({"batch": batch, "eager_peak_bytes": eager,
                     "package_peak_bytes": package_peak})
        if abs(difference) <= MEMORY_FLOOR_BYTES:
            continue
        if pct < -MEMORY_UNDER_PCT:
            raise ValueError(
                f"the compiled package's peak at batch {batch} is {package_peak:,} bytes, "
                f"{-pct:.2f}% under the eager step's {eager:,} (more than the "
                f"{MEMORY_UNDER_PCT}% allowed): sized with it, your job would run out of memory "
                f"at the batch called safe. No package was written; export the model in the "
                f"TorchScript format (--format torchscript), and please report the model")
        if pct > MEMORY_OVER_PCT:
            status = "over"
    return {"status": status, "rows": rows, "reason": None}


# c10::toString(ScalarType) of the dtypes a stored tensor may have ("" for others: unchecked).
_C10_DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                    torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                    torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
                    torch.bool: "Bool"}


def export_pt2(model: torch.nn.Module, path: str, example_inputs: Sequence[torch.Tensor],
               loss: str = "mean", int_high: Optional[Dict[int, int]] = None,
               check_memory: bool = True, cli: Optional[str] = None) -> str:
    """Exports ``model`` with its loss as an AOTInductor package of one training step.

    The package's call takes the inputs then the loss's targets, with one batch dimension
    ``Dim("B", min=1)`` shared by all, and returns the loss then the gradients (metadata
    "gradients" names them in order). The weights are not compiled in
    (``package_constants_in_so=False``): they are stored in the archive at ``PT2_WEIGHTS``
    and the runner supplies them. CPU and fp32 only here. Returns the metadata JSON.

    Before the package is written at ``path`` (it is compiled under a temporary name beside it),
    its peaks are checked against the eager step's (memory_check: at the example batch and at
    four times it, through the autobatch executable ``cli`` or the one find_cli finds; a copy of
    the model, with its weights, is held for that). ``check_memory=False`` skips the check: the
    package then says it was not run, and every run on it warns. Writes ``path`` only on success.
    Raises ValueError when the model does not export (with the reason), when the package is under
    the eager step's peak (memory_check), or on bad arguments.
    """
    import copy
    import os
    import zipfile

    import torch._inductor
    from torch.export import Dim

    model, example_inputs, loss = unwrap(model.train(), example_inputs, loss)
    base = json.loads(metadata(example_inputs, loss, int_high))
    if not path.endswith(".pt2"):
        raise ValueError(f"a package's path must end in .pt2 (AOTInductor's rule), got {path}")
    model = model.train()
    eager_model = copy.deepcopy(model) if check_memory else None  # tied, as the user's job has it
    partial = os.path.join(os.path.dirname(os.path.abspath(path)),
                           f".{os.path.basename(path)[:-4]}.partial-{os.getpid()}.pt2")
    try:
        return _export_pt2(model, path, partial, example_inputs, loss, int_high, base,
                           eager_model, cli, check_memory)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _export_pt2(model, path, partial, example_inputs, loss, int_high, base, eager_model, cli,
                check_memory) -> str:
    """export_pt2's work, compiling into ``partial`` and renaming it to ``path`` at the end."""
    import os
    import zipfile

    from torch.export import Dim

    tied = untie_parameters(model)
    targets, target_specs = _example_targets(model, example_inputs, loss)
    args = example_inputs + tuple(targets)
    batch = Dim("B", min=1)
    dynamic = (tuple({0: batch} for _ in args),)  # forward(*args): one entry holding all
    wrapped = _WithLoss(model, loss, len(example_inputs)).train()
    try:
        with _hinted_conv_backend():
            joint, gradients = export_joint(wrapped, args, dynamic)
    except Exception as error:  # torch.export raises many kinds; all mean "does not export"
        raise ValueError(
            f"the model does not export with torch.export ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); export it in the TorchScript "
            f"format instead (--format torchscript)") from error
    state = stored_tensors(wrapped, joint)
    batch1 = eager_batch1_error(wrapped, args)
    check = joint_gradient_check(wrapped, joint, args)
    meta = dict(base)
    meta.update({
        "format": "pt2",
        "targets": target_specs,
        "gradients": gradients,
        "parameters": [n for n, _ in wrapped.named_parameters()],
        "buffers": [n for n, _ in wrapped.named_buffers()],
        "tied": [["model." + n for n in group] for group in tied],
        "torch": torch.__version__.split("+")[0],
        "precision": "fp32",
        "eager_kernels": eager_kernels(joint),
        "gradient_check": check,
        # the second model: the same step, adding each gradient into a buffer the runner gives
        "accumulate_model": PT2_ACCUMULATE_MODEL,
        # what the compiled code reads for each stored tensor: the runner checks weights.pt
        # against it (a tensor of another shape would be read out of bounds)
        "tensors": {k: {"shape": list(v.shape), "dtype": _C10_DTYPE_NAMES.get(v.dtype, "")}
                    for k, v in state.items()},
    })
    text = json.dumps(meta)
    tied_names = [["model." + n for n in group] for group in tied]
    programs = {"model": joint, PT2_ACCUMULATE_MODEL: accumulating_program(joint, tied_names)}
    with _unguarded_acc_helper(), _hinted_conv_backend():
        package = _compile_package(
            partial, programs,
            {"aot_inductor.metadata": {PT2_METADATA_KEY: text},
             "aot_inductor.package_constants_in_so": False,
             # else a parameter of <= 8 elements (a bias) is baked into a kernel as its
             # export-time value, where the runner cannot supply it
             "always_keep_tensor_constants": True,
             # the patches above change the generated code: no cached artifact compiled
             # without them may be reused
             "fx_graph_cache": False,
             # autograd's order, as the eager backward runs it (issue 26): Inductor compiles
             # the joint step as an inference graph, and its locality pass (torch 2.11,
             # torch/_inductor/fx_passes/post_grad.py, reorder_for_locality) moves every node
             # whose only user is a later node, walking back from the output, to just before
             # that user: each parameter's gradient to the end of the step. ConvNeXt-tiny's
             # weight gradients were then made after the peak instead of before it (-9.15%
             # under the eager loop), a stack of its blocks held the activations they read
             # to the end instead (+9.1%)
             "reorder_for_locality": False,
             # one kernel per op, each result in its own buffer, freed after its last use
             # (_eager_buffers, issue 26)
             "max_fusion_size": 1,
             "allow_buffer_reuse": False,
             **_INDUCTOR_OVERRIDES})
    # A low bound of 2 is torch.export's own: its batch symbol starts at [2, inf) (sizes 0 and 1
    # are special to it) even under Dim("B", min=1); the code stays symbolic and runs batch 1
    # (tests/python/pt2_export_test.py compares its gradients with eager at batch 1).
    low, high = batch_range(package)
    example_batch = int(example_inputs[0].shape[0])
    if high is not None and high <= max(low, 2):
        raise ValueError(
            f"the compiled package accepts batch {high} only (Inductor specialised the batch "
            f"dimension, exported at {example_batch}); export with another example batch, or in "
            f"the TorchScript format (--format torchscript)")
    if low > 2 or high is not None:
        # Inductor's guards (a conv backend chosen by batch, ...) left a narrower range; the
        # package computes wrong gradients outside it (ResNet-18 exported at 2, run at 32: 7%
        # off), so the runner refuses batches outside it (a size limit for the search).
        import warnings
        warnings.warn(f"{path}: the compiled package runs batches {low} to "
                      f"{high if high is not None else 'any'} only (exported at {example_batch}); "
                      f"export at another example batch to move the range", stacklevel=2)
    check_constants_stored(package, state)
    with zipfile.ZipFile(package) as archive:
        folder = archive.namelist()[0].split("/")[0]
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr(f"{folder}/{PT2_WEIGHTS}", buffer.getvalue())
        archive.writestr(f"{folder}/{PT2_BATCH_RANGE}",
                         json.dumps({"low": low, "high": high, "eager_batch1_error": batch1}))
    if check_memory:
        second = max(4 * example_batch, 8)
        if high is not None:
            second = min(second, high)
        batches = [example_batch] + ([second] if second > example_batch else [])
        memory = memory_check(eager_model, package, loss, example_inputs, int_high, batches,
                              cli)
    else:
        memory = {"status": "not-run", "rows": [],
                 "reason": "the export was asked not to check (check_memory=False, "
                           "--no-memory-check)"}
    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr(f"{folder}/{PT2_MEMORY_CHECK}", json.dumps(memory))
    if memory["status"] != "passed":
        import warnings
        if memory["status"] == "over":
            worst = max(memory["rows"],
                        key=lambda r: r["package_peak_bytes"] / r["eager_peak_bytes"])
            pct = 100.0 * (worst["package_peak_bytes"] / worst["eager_peak_bytes"] - 1)
            warnings.warn(f"{path}: the package's peak is {pct:.2f}% over the eager step's at "
                          f"batch {worst['batch']} (more than {MEMORY_OVER_PCT}%): its answers "
                          f"will be cautious", stacklevel=3)
        else:
            warnings.warn(f"{path}: its peaks were not checked against the eager step: "
                          f"{memory['reason']}", stacklevel=3)
    os.replace(package, path)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description="Export a torchvision model for autobatch.")
    parser.add_argument("model", help="torchvision.models name, e.g. resnet18")
    parser.add_argument("out", help="output .pt path")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--loss", default="cross-entropy", choices=LOSSES)
    parser.add_argument("--format", default="torchscript", choices=("torchscript", "pt2"),
                        help="torchscript: a TorchScript archive (.pt); pt2: a torch.export + "
                             "AOTInductor package of one training step (.pt2, CPU, fp32)")
    parser.add_argument("--autobatch", metavar="PATH",
                        help="pt2: the autobatch executable that checks the package's peaks "
                             "against the eager step's (default: $AUTOBATCH_CLI, this checkout's "
                             "build/bin/autobatch, or autobatch on PATH)")
    parser.add_argument("--no-memory-check", action="store_true",
                        help="pt2: write the package without that check (every run on it warns)")
    args = parser.parse_args()
    import torchvision

    net = getattr(torchvision.models, args.model)(weights=None)
    example = torch.randn(2, 3, args.image_size, args.image_size)
    try:
        if args.format == "pt2":
            print(export_pt2(net, args.out, (example,), loss=args.loss,
                             check_memory=not args.no_memory_check, cli=args.autobatch))
        else:
            print(export(net, args.out, (example,), loss=args.loss))
    except ValueError as error:
        raise SystemExit(f"autobatch_export.py: error: {error}") from None


if __name__ == "__main__":
    main()
