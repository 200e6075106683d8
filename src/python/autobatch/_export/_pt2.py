"""The pt2 format: a model and its loss exported as an AOTInductor package of one training step
(issue 19; docs/formats.md). export_pt2 is the entry point: the joint graph (_pt2_joint), the
compile under the patches that make it allocate as eager does (_inductor_patches), the stored
weights and batch range, and the memory check (_pt2_memory) before the package is written."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Sequence, Union

import torch

from . import _inductor_patches as patches
from ._pt2_joint import (
    accumulating_program,
    eager_batch1_error,
    eager_kernels,
    export_joint,
    joint_gradient_check,
    package_gradient_check,
    stored_tensors,
)
from ._pt2_memory import MEMORY_OVER_PCT, memory_check
from ._step import (
    PT2_ACCUMULATE_MODEL,
    PT2_BATCH_RANGE,
    PT2_GRAD_PREFIX,
    PT2_MEMORY_CHECK,
    PT2_METADATA_KEY,
    PT2_WEIGHTS,
    _example_targets,
    _WithLoss,
    check_example_inputs,
    metadata,
    model_kept,
    untie_parameters,
    unwrap,
)

if TYPE_CHECKING:
    import os


# Inductor settings applied last to the package's compile: empty here. tests/python/
# pt2_export_test.py puts Inductor's locality pass back ({"reorder_for_locality": True}) to make a
# package that under-counts, which the memory check must refuse.
_INDUCTOR_OVERRIDES: Dict[str, object] = {}


def _compile_package(path: str, programs, inductor_configs):
    """AOTInductor-compiles each program and writes one package holding them all, each under
    its name (torch._inductor.aoti_compile_and_package does one; this is its multi-model form,
    documented there: aot_compile with aot_inductor.package, then package_aoti)."""
    from torch._inductor.package import package_aoti

    files = {}
    for name, program in programs.items():
        module = _constants_as_buffers(program.module(check_guards=False))
        args, kwargs = program.example_inputs
        with (
            patches._eager_kernels(),
            patches._eager_order(),
            patches._eager_buffers(),
            patches._eager_lifetimes(),
        ):
            files[name] = torch._inductor.aot_compile(
                module, args, kwargs, options={**inductor_configs, "aot_inductor.package": True}
            )
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


def check_constants_stored(package_path: str, state: Dict[str, torch.Tensor]) -> None:
    """Opens each compiled model of the finished package with Python's AOTInductor loader and
    checks that every constant it asks for is among the stored tensors (the accumulating model's
    gradient buffers excepted: the runner makes those), as the C++ runner will require.
    Raises ValueError naming the missing constants: a package its runner cannot load is never
    reported as exported."""
    from torch._inductor.package import load_package

    for model_name in ("model", PT2_ACCUMULATE_MODEL):
        wanted = load_package(package_path, model_name).get_constant_fqns()
        missing = sorted(n for n in wanted if n not in state and not n.startswith(PT2_GRAD_PREFIX))
        if missing:
            raise ValueError(
                f"{package_path}: the compiled {model_name!r} reads constants that the export "
                f"did not store: {missing}; this is a fault of the exporter (please report it), "
                f"export the model in the TorchScript format meanwhile"
            )


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


# c10::toString(ScalarType) of the dtypes a stored tensor may have ("" for others: unchecked).
_C10_DTYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


def export_pt2(
    model: torch.nn.Module,
    path: Union[str, os.PathLike],
    example_inputs: Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]],
    loss: str = "mean",
    int_high: Optional[Dict[int, int]] = None,
    check_memory: bool = True,
    cli: Optional[str] = None,
) -> str:
    """Exports ``model`` with its loss as an AOTInductor package of one training step (pt2).

    The package's call takes the inputs then the loss's targets, with one batch dimension
    ``Dim("B", min=1)`` shared by all, and returns the loss then the gradients (metadata
    "gradients" names them in order). The weights are not compiled in
    (``package_constants_in_so=False``): they are stored in the archive at ``PT2_WEIGHTS``
    and the runner supplies them. CPU and fp32 only here. docs/formats.md describes the format;
    the ``autobatch`` command sizes it as ``autobatch --model net.pt2``.

    Before the package is written at ``path`` (it is compiled under a temporary name beside it),
    its peaks are checked against the eager step's (memory_check: at the example batch and at
    four times it, at least 8, through the autobatch executable ``cli`` or the one find_cli
    finds; a copy of the model, with its weights, is held for that). The user's module is left
    as it was (training flags, BatchNorm's statistics, tied weights). Writes ``path`` only on
    success; a compiled range narrower than batches [2, any) is a warning.

    Args:
        model (torch.nn.Module): the model to export.
        path (str | os.PathLike): the package to write; must end in ``.pt2``.
        example_inputs (Sequence[torch.Tensor] | Mapping[str, torch.Tensor]): a tuple or list of
            tensors or a dict of tensors, batch first, as for export().
        loss (str): "mean" (default), "cross-entropy", "mse" or "model", as for export().
        int_high (dict[int, int] | None): exclusive upper bounds of integer inputs by input
            index, as for export().
        check_memory (bool): True (default) checks the package's peaks against the eager
            step's; False skips it: the package then says it was not run, and every run on it
            warns. Without an autobatch executable the check is not run either (a warning).
        cli (str | None): the autobatch executable for the check. Default None: $AUTOBATCH_CLI,
            else this checkout's build/bin/autobatch or the executable installed beside this
            Python, else ``autobatch`` on PATH.

    Returns:
        str: the metadata JSON stored in the package (inputs, loss, targets, gradients,
        parameters, buffers, tied weights, torch version, gradient check, ...).

    Raises:
        ValueError: bad arguments (as for export(); a path not ending in .pt2; a ``cli`` or
            $AUTOBATCH_CLI that is no executable file), a model that does not export with
            torch.export (with the reason), a package that runs one batch size only, a package
            under the eager step's peak (memory_check), a package whose constants or gradients
            do not check out, or a torch whose internals differ from those the export's patches
            were checked on (_inductor_patches.require_internals: nothing compiled).

    Examples:
        >>> from autobatch import export_pt2
        >>> meta = export_pt2(MyNet(), "mynet.pt2", (torch.randn(4, 3, 64, 64),),
        ...                   loss="cross-entropy", cli="build/bin/autobatch")
    """
    import copy
    import os

    check_example_inputs(example_inputs, int_high)
    path = os.fspath(path)  # a pathlib.Path too (its str methods below)
    if not path.endswith(".pt2"):
        raise ValueError(f"a package's path must end in .pt2 (AOTInductor's rule), got {path}")
    # The user's module as it was afterwards, whatever happens: untie_parameters gives tied
    # weights their own storage in place, and the export runs in training mode.
    with model_kept(model):
        model, example_inputs, loss = unwrap(model.train(), example_inputs, loss)
        base = json.loads(metadata(example_inputs, loss, int_high))
        patches.require_internals()  # a torch whose internals the patches do not fit: refused
        model = model.train()
        eager_model = copy.deepcopy(model) if check_memory else None  # tied, as the job has it
        partial = os.path.join(
            os.path.dirname(os.path.abspath(path)),
            f".{os.path.basename(path)[:-4]}.partial-{os.getpid()}.pt2",
        )
        try:
            return _export_pt2(
                model,
                path,
                partial,
                example_inputs,
                loss,
                int_high,
                base,
                eager_model,
                cli,
                check_memory,
            )
        finally:
            if os.path.exists(partial):
                os.remove(partial)


def _export_pt2(
    model, path, partial, example_inputs, loss, int_high, base, eager_model, cli, check_memory
) -> str:
    """export_pt2's work, compiling into ``partial`` and renaming it to ``path`` at the end."""
    import os

    tied = untie_parameters(model)
    targets, target_specs = _example_targets(model, example_inputs, loss)
    args = example_inputs + tuple(targets)
    wrapped = _WithLoss(model, loss, len(example_inputs)).train()
    joint, gradients = _joint(wrapped, args)
    state = stored_tensors(wrapped, joint)
    batch1 = eager_batch1_error(wrapped, args)
    meta = dict(base)
    meta.update(
        {
            "format": "pt2",
            "targets": target_specs,
            "gradients": gradients,
            "parameters": [n for n, _ in wrapped.named_parameters()],
            "buffers": [n for n, _ in wrapped.named_buffers()],
            "tied": [["model." + n for n in group] for group in tied],
            "torch": torch.__version__.split("+")[0],
            "precision": "fp32",
            "eager_kernels": eager_kernels(joint),
            "gradient_check": joint_gradient_check(wrapped, joint, args),
            # the second model: the same step, adding each gradient into a buffer the runner gives
            "accumulate_model": PT2_ACCUMULATE_MODEL,
            # what the compiled code reads for each stored tensor: the runner checks weights.pt
            # against it (a tensor of another shape would be read out of bounds)
            "tensors": {
                k: {"shape": list(v.shape), "dtype": _C10_DTYPE_NAMES.get(v.dtype, "")}
                for k, v in state.items()
            },
        }
    )
    text = json.dumps(meta)
    tied_names = [["model." + n for n in group] for group in tied]
    programs = {"model": joint, PT2_ACCUMULATE_MODEL: accumulating_program(joint, tied_names)}
    package = _compile(partial, programs, text)
    example_batch = int(example_inputs[0].shape[0])
    low, high = _checked_batch_range(package, path, example_batch)
    check_constants_stored(package, state)
    package_gradient_check(package, state, tied_names, gradients, wrapped, joint, args)
    folder = _store(package, state, {"low": low, "high": high, "eager_batch1_error": batch1})
    if check_memory:
        second = max(4 * example_batch, 8)
        if high is not None:
            second = min(second, high)
        batches = [example_batch] + ([second] if second > example_batch else [])
        memory = memory_check(eager_model, package, loss, example_inputs, int_high, batches, cli)
    else:
        memory = {
            "status": "not-run",
            "rows": [],
            "reason": "the export was asked not to check (check_memory=False, --no-memory-check)",
        }
    _store_memory_check(package, folder, memory, path)
    os.replace(package, path)
    return text


def _joint(wrapped: torch.nn.Module, args):
    """export_joint with the batch dimension dynamic (one Dim("B", min=1) shared by every input);
    raises ValueError naming the TorchScript format when torch.export fails."""
    from torch.export import Dim

    batch = Dim("B", min=1)
    dynamic = (tuple({0: batch} for _ in args),)  # forward(*args): one entry holding all
    try:
        with patches._hinted_conv_backend():
            return export_joint(wrapped, args, dynamic)
    except Exception as error:  # torch.export raises many kinds; all mean "does not export"
        raise ValueError(
            f"the model does not export with torch.export ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); export it in the TorchScript "
            f"format instead (--format torchscript)"
        ) from error


def _compile(partial: str, programs, text: str) -> str:
    """_compile_package with the export's Inductor settings; returns the package's path."""
    with patches._unguarded_acc_helper(), patches._hinted_conv_backend():
        return _compile_package(
            partial,
            programs,
            {
                "aot_inductor.metadata": {PT2_METADATA_KEY: text},
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
                # eager's layouts: the CPU step keeps NCHW tensors contiguous, where Inductor's
                # layout optimization makes a conv net's activations channels-last. Its gradients
                # were then wrong on torch 2.15, which also counts convolution_backward nodes in
                # that choice: BatchNorm's backward, an eager kernel, got a channels-last input and
                # a contiguous gradient and returned its result in the input's layout, which the
                # compiled code read in the gradient's (its meta function's rule): conv weight
                # gradients off by 4e3 of their size (package_gradient_check now refuses such a
                # package). On torch 2.11 the gradients were right, and off moved ResNet-18 at
                # 3x64x64 from +0.133% to +0.005% of the eager step's peak at batch 16
                # (docs/formats.md)
                "layout_optimization": False,
                **_INDUCTOR_OVERRIDES,
            },
        )


def _checked_batch_range(package: str, path: str, example_batch: int):
    """batch_range of the compiled package; raises ValueError when it runs one batch only, warns
    when its range is narrower than [2, any)."""
    # A low bound of 2 is torch.export's own: its batch symbol starts at [2, inf) (sizes 0 and 1
    # are special to it) even under Dim("B", min=1); the code stays symbolic and runs batch 1
    # (tests/python/pt2_export_test.py compares its gradients with eager at batch 1).
    low, high = batch_range(package)
    if high is not None and high <= max(low, 2):
        raise ValueError(
            f"the compiled package accepts batch {high} only (Inductor specialised the batch "
            f"dimension, exported at {example_batch}); export with another example batch, or in "
            f"the TorchScript format (--format torchscript)"
        )
    if low > 2 or high is not None:
        # Inductor's guards (a conv backend chosen by batch, ...) left a narrower range; the
        # package computes wrong gradients outside it (ResNet-18 exported at 2, run at 32: 7%
        # off), so the runner refuses batches outside it (a size limit for the search).
        import warnings

        warnings.warn(
            f"{path}: the compiled package runs batches {low} to "
            f"{high if high is not None else 'any'} only (exported at {example_batch}); "
            f"export at another example batch to move the range",
            stacklevel=4,
        )
    return low, high


def _store(package: str, state: Dict[str, torch.Tensor], batch_range_doc: dict) -> str:
    """Adds the weights (PT2_WEIGHTS) and the batch range (PT2_BATCH_RANGE) to the package;
    returns the package's archive folder."""
    import io
    import zipfile

    with zipfile.ZipFile(package) as archive:
        folder = archive.namelist()[0].split("/")[0]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr(f"{folder}/{PT2_WEIGHTS}", buffer.getvalue())
        archive.writestr(f"{folder}/{PT2_BATCH_RANGE}", json.dumps(batch_range_doc))
    return folder


def _store_memory_check(package: str, folder: str, memory: dict, path: str) -> None:
    """Adds the memory check's document (PT2_MEMORY_CHECK) to the package; warns when it did not
    pass (over: cautious answers; not run: unchecked)."""
    import warnings
    import zipfile

    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr(f"{folder}/{PT2_MEMORY_CHECK}", json.dumps(memory))
    if memory["status"] == "passed":
        return
    if memory["status"] == "over":
        worst = max(memory["rows"], key=lambda r: r["package_peak_bytes"] / r["eager_peak_bytes"])
        pct = 100.0 * (worst["package_peak_bytes"] / worst["eager_peak_bytes"] - 1)
        warnings.warn(
            f"{path}: the package's peak is {pct:.2f}% over the eager step's at "
            f"batch {worst['batch']} (more than {MEMORY_OVER_PCT}%): its answers "
            f"will be cautious",
            stacklevel=4,
        )
    else:
        warnings.warn(
            f"{path}: its peaks were not checked against the eager step: {memory['reason']}",
            stacklevel=4,
        )
