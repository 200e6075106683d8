"""The pt2 export's graph: torch.export of the model with its loss, the joint forward-backward
graph (a private torch API, export_joint), the accumulating program made from it, and the checks
that the graph computes what the user's eager step computes (joint_gradient_check, and
eager_batch1_error for what the graph cannot see at batch 1)."""

from __future__ import annotations

import re
from typing import Dict, Optional, Sequence

import torch

from . import _inductor_patches as patches
from ._step import PT2_GRAD_PREFIX


def eager_kernels(joint) -> list:
    """The EAGER_KERNELS (and their backward kernels) the joint graph calls, as sorted
    "aten.<name>" strings: metadata "eager_kernels"."""
    names = {
        f"aten.{n.target._opname}"
        for n in joint.graph.nodes
        if n.op == "call_function"
        and hasattr(n.target, "_opname")
        and any(n.target._opname in (k, k + "_backward") for k in patches.EAGER_KERNELS)
    }
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

    with patches._eager_dropout():
        ep = torch.export.export(wrapped, tuple(args), dynamic_shapes=dynamic_shapes)
    with patches._eager_kernels(), patches._eager_dropout():
        joint = torch.export.experimental._export_forward_backward(ep, joint_loss_index=0)
    kinds = [spec.kind for spec in joint.graph_signature.output_specs]
    if kinds.count(OutputKind.LOSS_OUTPUT) != 1:
        raise RuntimeError(f"joint graph: expected one LOSS_OUTPUT, got output kinds {kinds}")
    gradients = [
        spec.target
        for spec in joint.graph_signature.output_specs
        if spec.kind == OutputKind.GRADIENT_TO_PARAMETER
    ]
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
    tensors and the compiled code writes into them. Each add is placed right after its gradient is
    made, so
    Inductor frees the gradient there.

    ``tied``: groups of parameter names (``model.`` prefixed) sharing one tensor in the runner:
    their gradients are summed in the graph into one buffer, the group's first name (two buffers
    on one tensor would each add to the old value, and one add would be lost).
    Returns an ExportedProgram; raises RuntimeError when the joint graph is not the expected
    shape (a torch whose joint export changed)."""
    import copy

    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    module = copy.deepcopy(joint.graph_module)
    graph = module.graph
    signature = joint.graph_signature
    nodes = {n.name: n for n in graph.nodes}
    user_inputs = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    if not user_inputs:
        raise RuntimeError("joint graph: expected user inputs")
    first_user = nodes[user_inputs[0].arg.name]
    parameter_node = {
        s.target: nodes[s.arg.name] for s in signature.input_specs if s.kind == InputKind.PARAMETER
    }
    gradient_node = {
        s.target: nodes[s.arg.name]
        for s in signature.output_specs
        if s.kind == OutputKind.GRADIENT_TO_PARAMETER
    }
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
        made = sorted((gradient_node[n] for n in names), key=position.__getitem__)
        buffer, added = _add_into_buffer(graph, first_user, parameter_node[stored], made, target)
        new_inputs.append(InputSpec(InputKind.BUFFER, TensorArgument(buffer.name), target, True))
        new_outputs.append(
            OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(added.name), target)
        )
        state[target] = torch.zeros_like(joint.state_dict[stored])
    # Outputs as torch.export orders them: mutations first, then the loss.
    kept = [s for s in signature.output_specs if s.kind != OutputKind.GRADIENT_TO_PARAMETER]
    specs = (
        [s for s in kept if s.kind == OutputKind.BUFFER_MUTATION]
        + new_outputs
        + [s for s in kept if s.kind != OutputKind.BUFFER_MUTATION]
    )
    by_name = {n.name: n for n in graph.nodes}
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = (tuple(by_name[s.arg.name] for s in specs),)
    graph.lint()
    module.recompile()
    inputs = list(signature.input_specs)
    at = inputs.index(user_inputs[0])
    inputs = inputs[:at] + new_inputs + inputs[at:]
    return ExportedProgram(
        root=module,
        graph=graph,
        graph_signature=ExportGraphSignature(inputs, specs),
        state_dict=state,
        range_constraints=joint.range_constraints,
        module_call_graph=joint.module_call_graph,
        example_inputs=joint.example_inputs,
        constants=joint.constants,
        verifiers=[joint.verifier],
    )


def _add_into_buffer(graph, first_user, parameter, made, target: str):
    """accumulating_program's edit for one stored parameter: a placeholder for its gradient
    buffer ``target`` (before the first user input, with the parameter's metadata), the group's
    gradients ``made`` (in graph order) summed each right after it is made, and the sum added
    into the buffer right after the last. Returns (the placeholder, the add's node)."""
    with graph.inserting_before(first_user):
        # a Python identifier: FX writes the name into generated code, and module names
        # need not be one (torchvision's RegNet: "block1-0" failed with a SyntaxError)
        buffer = graph.placeholder("b_" + re.sub(r"\W", "_", target))
    buffer.meta = dict(parameter.meta)
    total = made[0]
    for gradient in made[1:]:
        with graph.inserting_after(gradient):
            summed = graph.call_function(torch.ops.aten.add.Tensor, (total, gradient))
        summed.meta = dict(gradient.meta)
        total = summed
    with graph.inserting_after(total):
        added = graph.call_function(torch.ops.aten.add.Tensor, (buffer, total))
    added.meta = dict(total.meta)
    return buffer, added


def stored_tensors(wrapped: torch.nn.Module, joint) -> Dict[str, torch.Tensor]:
    """Every tensor the compiled step reads, by the name the package asks for it: the parameters
    and persistent buffers (``state_dict``), and what ``state_dict`` leaves out, the
    non-persistent buffers (Llama's ``rotary_emb.inv_freq``) and the lifted tensor constants,
    which torch.export keeps in the program's ``constants``. Contiguous: the compiled code reads
    each one in the layout it had at export."""
    state = {
        k: v.detach().contiguous().clone() for k, v in wrapped.state_dict(keep_vars=False).items()
    }
    for name, value in joint.constants.items():
        if isinstance(value, torch.Tensor) and name not in state:
            state[name] = value.detach().contiguous().clone()
    return state


def eager_batch1_error(wrapped: torch.nn.Module, args: Sequence[torch.Tensor]) -> Optional[str]:
    """What the eager step (forward, loss, backward; on a copy, in training mode) raises at batch
    1, or None when it runs. torch.export traces at a batch of 2 or more (it specialises sizes 0
    and 1), so a check that only batch 1 trips, such as BatchNorm's "Expected more than 1 value
    per channel when training" (torch/nn/functional.py, _verify_batch_size), is not in the
    compiled code: the package would run a batch the user's eager job cannot. The runner fails
    such a batch as the eager step would (src/probes/trial_runner.cpp)."""
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
_RANDOM_OPS = (
    "bernoulli",
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "uniform",
    "native_dropout",
    "multinomial",
    "exponential",
    "geometric",
    "cauchy",
    "poisson",
)


def _random_ops(joint) -> list:
    """The ops of the joint graph that draw random numbers (_RANDOM_OPS), as sorted names."""
    return sorted(
        {
            str(n.target)
            for n in joint.graph.nodes
            if n.op == "call_function"
            and any(getattr(n.target, "_opname", "").startswith(r) for r in _RANDOM_OPS)
        }
    )


def _eager_gradients(wrapped: torch.nn.Module, args: Sequence[torch.Tensor]):
    """The eager step's loss and gradients at ``args`` (forward, loss, backward on a copy of
    ``wrapped`` in training mode): (loss, {parameter name: gradient})."""
    import copy

    probe = copy.deepcopy(wrapped).train()
    (loss,) = probe(*[a.clone() for a in args])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in probe.named_parameters() if p.grad is not None}


def _compare_gradients(
    computed: Dict[str, torch.Tensor], eager: Dict[str, torch.Tensor], what: str
) -> dict:
    """The largest difference between ``computed`` and ``eager`` gradients, relative to each
    eager gradient's largest element (floored at 1e-3 of the largest of all); returns
    {"max_relative_diff", "worst"}. Raises ValueError naming the parameter and the TorchScript
    format when it is over GRADIENT_CHECK_TOLERANCE, or when no gradient names a trained
    parameter. ``what``: the thing compared, for the message."""
    floor = 1e-3 * max((g.abs().max().item() for g in eager.values()), default=0.0)
    compared = sorted(set(computed) & set(eager))
    if computed and not compared:
        raise ValueError(
            f"{what}'s gradients ({', '.join(sorted(computed)[:3])}, ...) name no parameter the "
            f"eager step trains; export it in the TorchScript format instead "
            f"(--format torchscript)"
        )
    worst, worst_name = 0.0, ""
    for name in compared:  # a parameter eager does not train (frozen) has no gradient to compare
        grad = computed[name]
        scale = max(eager[name].abs().max().item(), floor)
        diff = (grad - eager[name]).abs().max().item() / scale if scale > 0 else 0.0
        if diff != diff:  # NaN (a NaN gradient on either side): the worst there is
            diff = float("inf")
        if diff > worst or worst_name == "":
            worst, worst_name = diff, name
    if worst > GRADIENT_CHECK_TOLERANCE:
        raise ValueError(
            f"{what} computes other gradients than eager PyTorch: {worst_name} differs by "
            f"{worst:.3g} of its largest element at the example batch (allowed "
            f"{GRADIENT_CHECK_TOLERANCE:g}); export it in the TorchScript format instead "
            f"(--format torchscript), and please report the model and the torch version"
        )
    return {"max_relative_diff": float(f"{worst:.3g}"), "worst": worst_name}


def kernel_layout_mismatch(op, args, kwargs) -> Optional[str]:
    """Runs ``op`` on ``args``/``kwargs`` (real tensors) and on fake copies of them
    (torch._subclasses.FakeTensorMode, the tensors Inductor plans with) and returns the first
    output whose strides differ, as "output i: strides ... from the kernel, ... from its fake
    (meta) kernel", or None. Dimensions of size 1 are not compared (any stride is right there).
    A difference means compiled code that calls the kernel reads its result in the wrong layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils import _pytree as pytree

    real = op(*args, **kwargs)
    mode = FakeTensorMode()
    fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
    with mode:
        fake = op(*fake_args, **fake_kwargs)
    for index, (r, f) in enumerate(zip(pytree.tree_leaves(real), pytree.tree_leaves(fake))):
        if not isinstance(r, torch.Tensor) or r.numel() <= 1:
            continue
        if any(a != b for a, b, size in zip(r.stride(), f.stride(), r.shape) if size > 1):
            return (
                f"output {index}: strides {tuple(r.stride())} from the kernel, "
                f"{tuple(f.stride())} from its fake (meta) kernel"
            )
    return None


class _JointRun(torch.fx.Interpreter):
    """Runs the joint graph on real tensors and checks each EAGER_KERNELS call on the way
    (kernel_layout_mismatch, its tensor inputs laid out as the compiled code will give them:
    patches.EAGER_KERNEL_INPUTS). ``mismatches``: "aten.<op>: <difference>" texts, one per op."""

    def __init__(self, module):
        super().__init__(module)
        self.mismatches: Dict[str, str] = {}

    def call_function(self, target, args, kwargs):
        name = getattr(target, "_opname", None)
        if name in patches.EAGER_KERNELS and f"aten.{name}" not in self.mismatches:
            from torch.utils import _pytree as pytree

            given = (args, kwargs)
            if patches.EAGER_KERNEL_INPUTS == "contiguous":
                given = pytree.tree_map_only(torch.Tensor, lambda t: t.contiguous(), given)
            found = kernel_layout_mismatch(target, *given)
            if found:
                self.mismatches[f"aten.{name}"] = found
        return super().call_function(target, args, kwargs)


def _joint_inputs(joint, args: Sequence[torch.Tensor]) -> list:
    """The joint graph's flat inputs: the example batch's tensors (copies) in the user inputs'
    places, the stored parameters, buffers and constants in theirs."""
    from torch.export.graph_signature import InputKind

    users = iter(args)
    flat = []
    for spec in joint.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(users).clone())
        elif spec.target in joint.state_dict:
            flat.append(joint.state_dict[spec.target].detach().clone())
        else:
            flat.append(joint.constants[spec.target])
    return flat


def joint_gradient_check(wrapped: torch.nn.Module, joint, args: Sequence[torch.Tensor]) -> dict:
    """Runs the joint graph (uncompiled) and the eager step (forward, loss, backward; on a copy)
    on the example batch and compares every gradient: the export's own proof that the graph it
    compiles computes the user's gradients. Catches a decomposition whose forward no longer
    matches the native backward that consumes it (torch 2.11: core ATen's decomposition of
    _scaled_dot_product_flash_attention_for_cpu returns the attention matrix where the kernel's
    backward reads the log-sum-exp; see EAGER_KERNELS), and any such fault to come.

    The same run checks each call of an eager kernel (_JointRun): where the kernel returns
    another layout than its fake kernel says for the inputs the compiled code will give it, the
    compiled code would read the result in the wrong strides, whatever the graph computes; that
    is refused here, before anything compiles (a compile takes minutes).

    Returns metadata ``gradient_check``: {"max_relative_diff": float, "worst": name} or
    {"skipped": reason} (random ops: the layout check still runs). Raises ValueError naming the
    parameter when the difference is over GRADIENT_CHECK_TOLERANCE, or naming the kernel and both
    layouts. Side effects: none on ``wrapped`` (a copy runs)."""
    from torch.export.graph_signature import OutputKind

    run = _JointRun(joint.graph_module)
    with torch.no_grad():
        outputs = run.run(*_joint_inputs(joint, args))
    if run.mismatches:
        shown = "; ".join(f"{op} {text}" for op, text in sorted(run.mismatches.items()))
        raise ValueError(
            f"the exported training step calls eager kernels whose results the compiled code "
            f"would read in other strides than they have ({shown}), which computes wrong "
            f"gradients; export it in the TorchScript format instead (--format torchscript), and "
            f"please report the model and the torch version"
        )
    random = _random_ops(joint)
    if random:
        return {"skipped": f"random ops ({', '.join(random)}): eager draws other numbers"}
    joint_grads = {
        spec.target: out
        for spec, out in zip(joint.graph_signature.output_specs, outputs)
        if spec.kind == OutputKind.GRADIENT_TO_PARAMETER
    }
    _, eager = _eager_gradients(wrapped, args)
    return _compare_gradients(joint_grads, eager, "the exported training step")


def package_gradient_check(
    package_path: str,
    state: Dict[str, torch.Tensor],
    tied,
    gradients,
    wrapped: torch.nn.Module,
    joint,
    args: Sequence[torch.Tensor],
) -> dict:
    """Runs the compiled package's model (Python's AOTInductor loader, the stored tensors
    supplied as the C++ runner supplies them: copies, each tied name given its group's tensor)
    and the eager step on the example batch and compares every gradient (``gradients``: the
    metadata's names, in the package's output order after the loss): the proof that the compiled
    code computes what the joint graph does. Catches a compiled kernel that reads a tensor in
    other strides than the one it is given (torch 2.15's layout optimization made BatchNorm's
    backward input channels-last, and the eager kernel's gradient was read as contiguous: conv
    weight gradients off by 4e3 of their size, tests/python/pt2_export_test.py
    test_conv_stays_dynamic), and any fault of the compile to come.

    Returns metadata-like {"max_relative_diff", "worst"} or {"skipped": reason} (random ops, as
    joint_gradient_check). Raises ValueError as _compare_gradients. Side effects: none on
    ``state`` or ``wrapped``."""
    from torch._inductor.package import load_package

    random = _random_ops(joint)
    if random:
        return {"skipped": f"random ops ({', '.join(random)}): eager draws other numbers"}
    compiled = load_package(package_path, "model")
    constants = {k: v.clone() for k, v in state.items()}
    for group in tied:
        for name in group[1:]:
            constants[name] = constants[group[0]]
    wanted = set(compiled.get_constant_fqns())
    compiled.load_constants(
        {k: v for k, v in constants.items() if k in wanted},
        check_full_update=True,
        user_managed=True,
    )
    outputs = compiled.loader.run([a.clone() for a in args])
    computed = dict(zip(gradients, outputs[-len(gradients) :] if gradients else []))
    _, eager = _eager_gradients(wrapped, args)
    return _compare_gradients(computed, eager, "the compiled package")
