"""Every patch of torch's internals the pt2 export makes, in one place (issue 42).

Each is a context manager that changes one thing in torch.export's tracing or in Inductor's
compile so that the compiled training step allocates and frees as the eager step does, and puts
it back on exit (also on error): the decompositions left out (_eager_kernels), dropout as the CPU
runs it (_eager_dropout), one buffer per op (_eager_buffers), arguments alive through their op
(_eager_lifetimes), autograd's order (_eager_order), and two that keep the batch dimension
symbolic (_unguarded_acc_helper, _hinted_conv_backend). The measurements behind each are in its
docstring and in docs/formats.md.

They reach into private names, which change between torch releases. INTERNALS lists every name
they use with the parameters it must take; check_internals() looks each one up on the torch that
runs (by name and signature, never by version string) and require_internals() refuses a pt2
export when one is missing or different, naming the TorchScript format as the way out, rather
than compile with a patch that no longer applies (a package that under-counts). CHECKED_ON names
the torch releases the patches were checked on: the pt2 export tests pass on each
(tests/python/pt2_export_test.py; scripts/test_newest.sh runs a subset on the newest).
"""

from __future__ import annotations

import torch

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
#   computes its loss outside the compiled code too. No C shim: AOTInductor calls them through its
#   proxy executor.
# - concatenation. Eager's cat makes each input, then copies them into a new tensor; Inductor can
#   lower cat to a buffer its producers write into (ConcatKernel), where the inputs are never made
#   on their own. Kept as eager's kernel since issue 26; no effect measured yet (DenseNet-121 was
#   0.69% under with and without it: that was its poolings' inputs, _eager_lifetimes).
# docs/formats.md, "Exporting a package"; metadata "eager_kernels" lists those a package calls.
# The layout the compiled code gives each EAGER_KERNELS call's tensor inputs: "contiguous"
# (Inductor's require_contiguous layout constraint), or None (Inductor's choice; tests only). The
# compiled code reads an eager kernel's outputs in the strides torch's fake (meta) kernel gives
# for those inputs, not in the strides the kernel returns; the two differ for some inputs:
# torch 2.11's native_layer_norm_backward returns a contiguous gradient on the CPU
# (aten/src/ATen/native/layer_norm.cpp) where its fake, the decomposition in
# torch/_decomp/decompositions.py, follows a permuted input's strides. ConvNeXt's LayerNorm2d
# (permute, layer_norm, permute) fed it permuted tensors, and the package's stem gradient was off
# by 1.35 of its size. With contiguous inputs the two agree, and the CPU norm and softmax kernels
# make their inputs contiguous themselves (expect_contiguous), so the copy is eager's own.
# _pt2_joint.layout_mismatches checks every call at the example batch before anything compiles.
EAGER_KERNEL_INPUTS = "contiguous"
EAGER_KERNELS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "nll_loss_forward",
    "nll_loss_backward",
    "_log_softmax",
    "_log_softmax_backward_data",
    "mse_loss",
    "mse_loss_backward",
    "_softmax",
    "_softmax_backward_data",
    "_native_batch_norm_legit_functional",
    "native_batch_norm_backward",
    "native_layer_norm",
    "native_layer_norm_backward",
    "native_group_norm",
    "native_group_norm_backward",
    "relu",
    "threshold_backward",
    "gelu",
    "gelu_backward",
    "silu",
    "silu_backward",
    "hardswish",
    "hardswish_backward",
    "hardsigmoid",
    "hardsigmoid_backward",
    "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward",
    "embedding_dense_backward",
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
        constraints = lowering._maybe_layout_constraints
        self._saved = {
            op: (
                op in lowering.lowerings,
                lowering.lowerings.get(op),
                op in lowering.fallbacks,
                op in lowering.needs_realized_inputs,
                op in constraints,
                constraints.get(op),
            )
            for op in self._ops
        }
        ops, core, inductor = self._ops, self._core, self._inductor
        constraint = lowering.require_contiguous if EAGER_KERNEL_INPUTS == "contiguous" else None

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
                lowering.make_fallback(
                    op, layout_constraint=constraint, warn=False, override_decomp=True
                )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self._decomp.core_aten_decompositions = self._core
        self._compile_fx.select_decomp_table = self._inductor
        lowering = self._lowering
        constraints = lowering._maybe_layout_constraints
        for op, (
            lowered,
            handler,
            fallback,
            realized,
            constrained,
            constraint,
        ) in self._saved.items():
            if lowered:
                lowering.lowerings[op] = handler
            else:
                lowering.lowerings.pop(op, None)
            if not fallback:
                lowering.fallbacks.discard(op)
            if not realized:
                lowering.needs_realized_inputs.discard(op)
            if constrained:
                constraints[op] = constraint
            else:
                constraints.pop(op, None)
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
            if (
                node.op == "call_function"
                and isinstance(target, torch._ops.OpOverload)
                and not target.is_view
                and not target._schema.is_mutable
            ):
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


# The attribute of a GraphLowering where _eager_lifetimes records, per operation name, the buffers
# the operation must keep alive.
_STAR_DEPS = "_autobatch_star_deps"


class _eager_lifetimes:
    """Context manager for a compile: every tensor an op of the graph takes as an argument stays
    allocated until that op has run, as in the eager step, where an op is called with its
    arguments alive (issue 26). Inductor keeps a buffer until the last kernel that reads it, and
    some of its lowerings take a tensor without reading it: ``avg_pool2d_backward`` reads only
    its input's sizes (torch/_inductor/lowering.py, torch 2.11), so the pooling's input was
    freed after the forward's pooling, where eager's autograd saves it for the backward
    (AvgPool2DBackward0 keeps ``self``). Here each operation made while a graph node is lowered
    gets a dependency on the buffers of the node's tensor arguments that none of its kernels
    reads: a StarDep (a read of the whole buffer, which keeps it alive), added to the operation's
    scheduler node before the scheduler computes its dependencies (Scheduler.compute_dependencies;
    torch 2.11 had a table for it, GraphLowering.additional_star_deps, which torch 2.15 removed:
    this way works on both); graph inputs and constants are always alive and are left out.
    Measured (docs/formats.md): DenseNet-121 at 3x64x64 was refused without this (0.70% under the
    eager step at batch 8): each transition's 1x1 convolution output, which only the average
    pooling after it saves, was freed in the forward where eager held it into the backward
    (1 MiB and 512 KiB of the eager step's peak at batch 8); with it, +0.043% / +0.109% at batch
    2 / 8. Enter after _eager_buffers, so that the results it realizes are among the operations
    made; restores what it changed on exit, also on error."""

    def __enter__(self):
        from torch._inductor.dependencies import StarDep
        from torch._inductor.graph import GraphLowering
        from torch._inductor.ir import BaseView, Buffer, MutableBox
        from torch._inductor.scheduler import Scheduler
        from torch._inductor.virtualized import V

        self._class, self._original = GraphLowering, GraphLowering.run_node
        self._scheduler, self._dependencies = Scheduler, Scheduler.compute_dependencies
        original, original_dependencies = self._original, self._dependencies

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
            extra = lowering.__dict__.setdefault(_STAR_DEPS, {})
            for operation in made:
                extra.setdefault(operation.get_operation_name(), set()).update(names)
            return result

        def compute_dependencies(scheduler):
            extra = getattr(V.graph, _STAR_DEPS, {})
            for node in scheduler.nodes:
                for name in sorted(extra.get(node.get_name(), ())):
                    node.add_fake_dep(StarDep(name))
            return original_dependencies(scheduler)

        GraphLowering.run_node = run_node
        Scheduler.compute_dependencies = compute_dependencies
        return self

    def __exit__(self, *exc):
        self._class.run_node = self._original
        self._scheduler.compute_dependencies = self._dependencies
        return False


def _early_writes(nodes):
    """A schedule for Inductor: its nodes in their given order (autograd's, as the joint graph
    was traced), except that each write into a graph input or a constant (a BUFFER_MUTATION:
    the accumulating model's gradient buffers, BatchNorm's running stats) runs as soon as what
    it writes has been computed and every other reader of the buffer has run.

    Why: AOTAutograd's functionalization moves every such write to the end of the graph, and
    Inductor fuses them there. The accumulating model then held every new sum (gradient plus
    buffer) until the end of the call: +6.8% over the TorchScript archive at 64 x 2 micro-batches
    on mlp_wide_tiny (Pt2RunnerTest.PeaksAreThoseOfTheTorchScriptArchiveAtOneAndTwoMicroBatches).
    An eager backward adds each gradient into ``.grad`` as it
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
    deps = {
        node: {producer[d.name] for d in node.unmet_dependencies if d.name in producer}
        for node in nodes
    }
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

        def reorder(
            nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs, methods=None
        ):
            return original(
                nodes,
                name_to_buf,
                name_to_fused_node,
                graph_inputs,
                graph_outputs,
                methods=[_early_writes],
            )

        memory.reorder_for_peak_memory = reorder
        return self

    def __exit__(self, *exc):
        self._memory.reorder_for_peak_memory = self._original
        return False


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
            size = functools.reduce(operator.mul, self.call_ranges[self.reduction_depth :], 1)
            if getattr(size, "free_symbols", None):
                return True
        return original(self, reduction_type, dtype, use_scalar)

    return mock.patch.object(CppKernel, "need_use_acc_helper", need_use_acc_helper)


def _hint(size) -> int:
    """The example's value of a size: a backed SymInt's hint (SymNode.hint, the value it had when
    traced; read without a guard, as torch 2.11's symbolic_shapes.size_hint did, which torch 2.15
    removed), or the int itself. Raises RuntimeError for a size with no hint (data-dependent)."""
    if not isinstance(size, torch.SymInt):
        return size
    hint = size.node.hint
    if hint is None:
        raise RuntimeError(f"the size {size} has no example value (a data-dependent size)")
    return int(hint)


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
            isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())
        ):
            return value
        return torch.empty_strided(
            [_hint(s) for s in value.shape],
            [_hint(s) for s in value.stride()],
            dtype=value.dtype,
            device=value.device,
        )

    def select_conv_backend(*args, **kwargs):
        args = tuple(concrete(a) for a in args)
        kwargs = {k: concrete(v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    return mock.patch.object(torch._C, "_select_conv_backend", select_conv_backend)


# ---- The fence: the private names above, checked on the torch that runs ----

# The torch releases the patches were checked on: tests/python/pt2_export_test.py passes with each
# (all of it on 2.11.0, requirements.txt; the subset scripts/test_newest.sh runs on 2.15.0,
# requirements-newest.txt). Informative only: the check below decides, by names and signatures.
CHECKED_ON = ("2.11.0", "2.15.0")

# Every private name the patches and the export use: (module, attribute path, what it must be).
# A tuple of names is a function's parameters: exactly those, in that order, for what is wrapped
# or replaced (its callers pass them); "calls:" a subset the export passes by name; "class",
# "dict", "set", "int", "bool", "callable", "property", "object" (any) a kind; "self.<name>" an
# attribute set by the class's __init__ (found in its source).
INTERNALS = (
    ("torch._decomp", "core_aten_decompositions", ()),
    ("torch._inductor.compile_fx", "select_decomp_table", ()),
    (
        "torch._inductor.lowering",
        "make_fallback",
        ("calls:", "op", "layout_constraint", "warn", "override_decomp"),
    ),
    ("torch._inductor.lowering", "require_contiguous", ("_", "args", "kwargs")),
    ("torch._inductor.lowering", "_maybe_layout_constraints", "dict"),
    ("torch._inductor.lowering", "lowerings", "dict"),
    ("torch._inductor.lowering", "fallbacks", "set"),
    ("torch._inductor.lowering", "needs_realized_inputs", "set"),
    ("torch._inductor.graph", "GraphLowering.run_node", ("self", "n")),
    ("torch._inductor.graph", "GraphLowering.__init__", "self.operations"),
    ("torch._inductor.graph", "GraphLowering.__init__", "self.name_to_buffer"),
    ("torch.fx", "Interpreter.__init__", "self.env"),
    ("torch._inductor.ir", "TensorBox.realize", ("self",)),
    ("torch._inductor.ir", "BaseView", "class"),
    ("torch._inductor.ir", "Buffer", "class"),
    ("torch._inductor.ir", "MutableBox", "class"),
    ("torch._inductor.ir", "Operation.get_read_names", ("self",)),
    ("torch._inductor.ir", "Operation.get_outputs", ("self",)),
    ("torch._inductor.ir", "Operation.get_operation_name", ("self",)),
    ("torch._inductor.codegen.cpp", "CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM", "int"),
    (
        "torch._inductor.codegen.cpp",
        "CppKernel.need_use_acc_helper",
        ("self", "reduction_type", "dtype", "use_scalar"),
    ),
    (
        "torch._inductor.memory",
        "reorder_for_peak_memory",
        ("nodes", "name_to_buf", "name_to_fused_node", "graph_inputs", "graph_outputs", "methods"),
    ),
    ("torch._inductor.scheduler", "Scheduler.compute_dependencies", ("self",)),
    ("torch._inductor.scheduler", "BaseSchedulerNode.add_fake_dep", ("self", "dep")),
    ("torch._inductor.scheduler", "BaseSchedulerNode.get_name", ("self",)),
    ("torch._inductor.dependencies", "StarDep", ("calls:", "name")),
    ("torch._inductor.virtualized", "V", "object"),
    ("torch._inductor", "aot_compile", ("calls:", "gm", "args", "kwargs", "options")),
    ("torch._inductor.package", "package_aoti", ("calls:", "archive_file", "aoti_files")),
    ("torch._inductor.package", "load_package", ("calls:", "path", "model_name")),
    ("torch.export.experimental", "_export_forward_backward", ("calls:", "ep", "joint_loss_index")),
    ("torch._C", "_select_conv_backend", "callable"),
    ("torch.fx.experimental.sym_node", "SymNode.hint", "property"),
    # the Inductor settings the export's compile sets (_pt2._compile)
    ("torch._inductor.config", "layout_optimization", "bool"),
    ("torch._inductor.config", "max_fusion_size", "int"),
    ("torch._inductor.config", "allow_buffer_reuse", "bool"),
    ("torch._inductor.config", "reorder_for_locality", "bool"),
    ("torch._inductor.config", "always_keep_tensor_constants", "bool"),
    ("torch._inductor.config", "fx_graph_cache", "bool"),
    ("torch._inductor.config", "aot_inductor.package", "bool"),
    ("torch._inductor.config", "aot_inductor.package_constants_in_so", "bool"),
    ("torch._inductor.config", "aot_inductor.metadata", "dict"),
)


def _look_up(module: str, path: str):
    import importlib

    value = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _differs(module: str, path: str, expected) -> str:
    """What is wrong with one entry of INTERNALS on this torch ("" when it is as expected)."""
    import inspect

    try:
        value = _look_up(module, path)
    except (ImportError, AttributeError) as error:
        return f"{module}.{path} is missing ({type(error).__name__}: {error})"
    where = f"{module}.{path}"
    if isinstance(expected, tuple):
        try:
            parameters = list(inspect.signature(value).parameters)
        except (TypeError, ValueError):
            return f"{where} has no signature to check"
        if expected[:1] == ("calls:",):
            missing = [p for p in expected[1:] if p not in parameters]
            return (
                f"{where} takes no {', '.join(missing)} (it takes {parameters})" if missing else ""
            )
        return (
            ""
            if parameters == list(expected)
            else f"{where} takes {parameters}, the patch expects {list(expected)}"
        )
    if isinstance(expected, str) and expected.startswith("self."):
        try:
            source = inspect.getsource(value)
        except (OSError, TypeError):
            return f"{where}: its source cannot be read to find {expected}"
        return "" if expected in source else f"{where} sets no {expected}"
    kinds = {
        "dict": lambda v: isinstance(v, dict),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "set": lambda v: hasattr(v, "discard") and hasattr(v, "add"),
        "class": inspect.isclass,
        "callable": callable,
        "object": lambda v: True,
        "property": lambda v: isinstance(v, property),
    }
    return (
        "" if kinds[expected](value) else f"{where} is a {type(value).__name__}, not a {expected}"
    )


_CHECKED: list = []  # the differences found, once per process: [list of texts]


def check_internals() -> list:
    """The differences between this torch's private names and what the patches expect
    (INTERNALS): a list of texts, empty when every name is there as expected. Looked up once per
    process (imports torch._inductor: about a second). Also checks the OpOverload attributes
    _eager_dropout replaces (``py_kernels``, ``_dispatch_cache``)."""
    if not _CHECKED:
        found = [d for d in (_differs(*entry) for entry in INTERNALS) if d]
        op = torch.ops.aten.dropout.default
        for name in ("py_kernels", "_dispatch_cache"):
            if not isinstance(getattr(op, name, None), dict):
                found.append(f"torch.ops.aten.dropout.default.{name} is not a dict")
        _CHECKED.append(found)
    return list(_CHECKED[0])


def require_internals() -> None:
    """Raises ValueError when check_internals() finds a difference: naming the first ones, the
    torch releases the patches were checked on, and the TorchScript format as the way out. A
    compile with a patch that no longer applies could write a package whose peaks are not the
    eager step's."""
    found = check_internals()
    if found:
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        raise ValueError(
            f"the pt2 export does not support torch {torch.__version__}: the internals it patches "
            f"to make the package allocate as the eager step does differ from those it was "
            f"checked on (torch {', '.join(CHECKED_ON)}): {shown}. Export the model in the "
            f"TorchScript format instead (--format torchscript, or autobatch.export), or use a "
            f"torch the pt2 export was checked on"
        )
