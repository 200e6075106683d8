"""autobatch.find and check_batch: the C++ search, planner and report, with the user's own eager
step as the trial (the session that runs it: _session.py), the result cache's key, and the job's
fields the ranks compare."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable

import torch

from . import _core
from ._errors import Cancelled, DoesNotFit, ModelError, UsageError
from ._eval import EvalProbe, eval_nothing_fits_message, eval_state_of
from ._fingerprint import _code_digest, fingerprint
from ._option_checks import _refuse_search_options
from ._options import (
    _INT32_MAX,
    _count,
)
from ._result import Result, Trial
from ._session import _inputs, _loss_name, _name, _Session, _session_of
from ._soak import soak
from ._vocabulary import FITS

log = logging.getLogger("autobatch")


def find(
    model: torch.nn.Module,
    example_batch: Any,
    *,
    optimizer: torch.optim.Optimizer | Callable[..., Any] | str | None = None,
    loss_fn: Callable[..., Any] | None = None,
    precision: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    memory_limit: int | str | None = None,
    margin: float | int | str | None = None,
    target_batch: int | None = None,
    world_size: int = 1,
    time_limit: float | None = None,
    steps_per_trial: int = 2,
    min_batch: int = 1,
    max_batch: int | None = None,
    dataset_size: int | None = None,
    max_trials: int | None = None,
    strategy: str = "guided",
    plan: str = "fastest",
    reserve: int | str | None = None,
    progress: bool | None = None,
    step: Callable[..., Any] | None = None,
    ddp: bool = False,
    zero_grad: str = "none",
    keep_output: bool = True,
    eval: bool | str = False,
    cache: bool | str | os.PathLike[str] | None = None,
    cache_trust: bool = False,
    autocast_cache: bool = True,
    loader_batches: int | None = None,
    soak_steps: int | None = None,
    job_steps: int | None = None,
) -> Result:
    """Finds the largest micro-batch with which `model` trains, by running real training steps.

    Each trial is the user's own eager step at a micro-batch the search picks (inputs, forward,
    loss, backward, optimizer step, zero_grad; `steps_per_trial` optimizer steps) under the
    memory limit; the search, the accumulation planner and the report are the C++ library's,
    the same as the `autobatch` command's. docs/python.md says what a trial runs and how memory
    is measured. Batch sizes are counts of samples; memory is in bytes.

    Side effects: runs real steps on `model` (its parameters, buffers, gradients, training
    flags, plain attributes and the RNG states are put back bitwise afterwards, also after an
    error); on the CPU the budget allocator is installed in this process for the search and
    removed after; on CUDA the memory fraction is set and put back as the process had it (a
    fraction the process had set also caps the limit), and the cuBLAS workspaces and the
    allocator's cache are freed after each trial; gc.collect() runs before the search. One
    search at a time per process. Trial progress goes to the "autobatch" logger (INFO).

    Args:
        model (torch.nn.Module): the model to size, on the device it is sized on (never
            moved). At least one parameter must require grad; a TorchScript module, inference
            tensors, lazy (uninitialized) or meta parameters are UsageErrors. A model in eval()
            is trained in train mode and put back in eval mode.
        example_batch (Any): one batch of any size (one sample is enough): a tensor, a
            tuple/list, or a mapping (a dict, a tokenizer's BatchEncoding) of dense tensors
            sharing the leading (batch) dimension, e.g. torch.randn(1, 3, 224, 224) or
            {"input_ids": ids, "labels": ids} with ids of shape [1, T]. A batch of B samples
            repeats its samples in order along dimension 0; the model is called as
            model(**batch) for a mapping, model(*batch) for a tuple/list, model(batch) for a
            tensor.
            Or the job's torch.utils.data.DataLoader (it must batch: batch_size or
            batch_sampler): the trials then run on its costliest samples, collated by its own
            collate_fn (docs/data.md): B rows as large as the costliest sample for a collator
            that stacks (pads), the B costliest samples for one that concatenates; a map-style
            dataset's every sample is read in this process (dataset[i]; its `lengths`, one int
            per sample, spares loading all but the costliest; `loader_batches` bounds the scan),
            an IterableDataset's first `loader_batches` batches. dataset_size defaults to the
            epoch's samples, and Result.data says what bound the answer.
        optimizer (torch.optim.Optimizer | Callable[..., Any] | str | None): a factory
            `lambda params: torch.optim.AdamW(params, lr=1e-3)`, called with the trainable
            parameters and returning a new optimizer each call; an optimizer instance (a fresh
            one of its class, param groups and options is built per trial; the instance is
            never stepped); a torch.optim.Optimizer subclass (built with its defaults); "none"
            (no optimizer step); or None (default: AdamW with PyTorch's defaults, as the
            command). LBFGS, a factory that returns an existing optimizer, and a factory that
            fails when called are UsageErrors.
        loss_fn (Callable[..., Any] | None): `loss_fn(output, batch) -> scalar tensor`. Default
            None: the output's `.loss`, its ["loss"], a scalar output itself, a tuple's first
            element, else the output's mean. Not with `step`.
        precision (str | torch.dtype | None): None or "fp32" (default: no autocast),
            "amp-bf16" or "amp-fp16" (torch.autocast around forward and loss); "bf16", "fp16",
            torch.float32, torch.bfloat16 and torch.float16 are read as those. An enclosing
            torch.autocast is not the trials' (the result's warnings say so).
        device (str | torch.device | None): "cpu", "cuda" or "cuda:N". Default None: the
            model's device (a model on several devices, or on another one than `device`, is a
            UsageError).
        memory_limit (int | str | None): bytes (an int > 0) or a size ("8GiB", "512MB",
            "1.5 GB": a space may stand between number and unit). Default None: the device's
            memory (CPU: the room this process has: cgroup, MemAvailable, RLIMIT_DATA /
            RLIMIT_AS). 0 is a UsageError, not "no limit"; above a GPU's memory it is clipped
            to it, with a warning.
        margin (float | int | str | None): headroom under the limit for the safe answer: a
            fraction in [0, 1) (0.05) or a percentage in [0, 100) ("5%"), or bytes (an int or
            "256MiB", less than the limit). Default None: 0.05.
        target_batch (int | None): the effective batch to plan gradient accumulation for:
            samples per optimizer step over all ranks, an int >= 1 and a multiple of
            `world_size`. Default None: no plan.
        world_size (int): the data-parallel ranks that share `target_batch`, 1 to 2^31 - 1
            (default 1). The trials run on this process alone; the plan is per rank.
        time_limit (float | None): seconds > 0 for the whole search, checked before each trial,
            each step and, on the CPU, each allocation inside a step. Default None: no limit.
        steps_per_trial (int): optimizer steps per trial, 1 to 2^31 - 1 (default 2: the
            optimizer's state exists from the first step on). 1 only with optimizer="none" or
            torch.optim.SGD without momentum, and zero_grad="none" (else UsageError).
        min_batch (int): the smallest micro-batch tried, samples, >= 1 (default 1).
        max_batch (int | None): the largest micro-batch it may answer, samples, >= min_batch.
            Default None: no bound.
        dataset_size (int | None): samples in the dataset: no micro-batch above it is tried.
            Default None: no bound.
        max_trials (int | None): the most trials for the whole search, 1 to 2^31 - 1. Default
            None: no limit.
        strategy (str): "guided" (default), "binsearch" or "power" (docs/search.md).
        plan (str): the primary plan: "fastest" (default, as the command's --plan: of the exact
            plans, the one whose measured step times train the most samples per second),
            "auto", "uniform" or "balanced" (docs/search.md, "Headroom, plan").
        reserve (int | str | None): bytes (an int or "1GiB") the rest of the job needs beside
            the step, taken off the limit; less than the limit. Default None: 0.
        progress (bool | None): True: a tqdm bar of trials (UsageError without tqdm); False:
            none; None (default): a bar when tqdm is installed and stderr is a terminal.
        step (Callable[..., Any] | None): `step(model, batch) -> loss`, the forward and loss of
            one micro-batch in place of model(batch) and loss_fn (a framework's own step:
            autobatch.lightning passes training_step); it must return a scalar tensor that
            requires grad (else ModelError). Backward, the optimizer step and zero_grad stay
            autobatch's. Not with `loss_fn`.
        ddp (bool): True when the job wraps the model in DistributedDataParallel: every trial
            holds one buffer of the trained parameters' gradient bytes (DDP's gradient
            buckets, which a job with gradient_as_bucket_view=True does not hold beside the
            gradients) from its start to its end, as `autobatch --ddp` does. Default False.
        zero_grad (str): "none" (default: zero_grad(set_to_none=True), PyTorch's default, the
            gradients freed after each step) or "zeros" (set_to_none=False: kept allocated).
        keep_output (bool): True (default, the command's --keep-output yes): the model's output
            stays alive through backward, as `out = model(**batch); out.loss.backward()`;
            False: dropped before backward, as a Lightning training_step or the Hugging Face
            Trainer (the drop-ins pass False).
        eval (bool | str): False (default: training only); True: also the largest evaluation
            batch with the training state resident (the command's --eval; Result.eval_safe_batch);
            "only": an evaluation job alone, the parameters resident (--eval-only; not with
            target_batch). docs/evaluation.md, "From Python".
        cache (bool | str | os.PathLike[str] | None): the command's result cache (--cache,
            docs/cache.md): None or False (default: off), True (the default folder:
            $AUTOBATCH_CACHE_DIR, else $XDG_CACHE_HOME/autobatch/results, else
            ~/.cache/autobatch/results) or a folder path. A search keyed as an earlier one (the
            model's fingerprint, the step, the limit as resolved, margin, bounds, device and
            versions; not the target, world size or plan) is answered from the entry after one
            confirming trial; a miss searches and stores. Result.cache says which. Not with eval=.
        cache_trust (bool): answer a cache hit without the confirming trial (--cache-trust).
            Needs `cache`. Default False.
        autocast_cache (bool): with an amp precision, torch.autocast's cache_enabled: True
            (default, PyTorch's: a weight's cast made once per forward) or False (a cast per
            use, as Lightning's mixed precision runs; its drop-in passes False). Either way the
            casts are freed when the forward and loss end.
        loader_batches (int | None): with a DataLoader, the batches to read for its costliest
            samples, >= 1: the first N of an IterableDataset (default None: 64), the first N
            its sampler draws from a map-style dataset (default None: every sample of the
            epoch; N bounds the scan of a large dataset without `lengths`). The answer is then
            for "the first N batches", not the epoch (Result.data's scope). Not with an example
            batch (UsageError).
        soak_steps (int | None): after the search, run this many optimizer steps in a row at
            the answer (the plan's micro-batch x its accumulation steps, else the safe
            micro-batch) under the same limit: autobatch.soak (docs/soak.md), >= 1. Its
            SoakResult is Result.soak, its report is appended to Result.text, and memory that
            grows step after step (or a soaked step out of memory) is in Result.warnings; its
            time is its own (SoakResult.seconds), not the search's. Default None: no soak.
            Not with eval="only".
        job_steps (int | None): with soak_steps, the job's optimizer steps: the soak says
            whether the job lasts at the measured growth and, when not, the largest
            micro-batch that does (SoakResult.lasting_micro_batch). Default None.

    Returns:
        Result: the largest micro-batch seen to fit (`max_micro_batch`), the largest under the
        limit less the margin (`safe_micro_batch`, > 0), the plan for `target_batch` (None
        without one), every trial, the model's memory and the report (`raw`, `text`, `env`);
        with eval=, the evaluation batches too (with eval="only", `max_micro_batch` and
        `safe_micro_batch` are the evaluation batch's).

    Raises:
        UsageError: a bad argument (the message says what was expected and what was given),
            before any trial; also a call inside torch.inference_mode(), a second search while
            one runs in the process, a margin or reserve that leaves nothing of the limit.
        DoesNotFit: nothing fits at min_batch, or only above the limit less the margin, or a
            trial or time budget ran out before any size was verified; with eval=, the training
            state does not fit beside evaluation, or no evaluation batch fits under the margin.
            `.result` holds the trials.
        ModelError: the step (model, loss or optimizer) raised an error that is not out of
            memory; `__cause__` is the original, `.micro_batch` the size, `.result` the sizes
            verified before it.
        Cancelled: Ctrl-C; the trial in progress is abandoned, the model restored, and
            `.result` holds the best verified size.

    Examples:
        >>> result = autobatch.find(torchvision.models.resnet18(), torch.randn(1, 3, 64, 64),
        ...                         optimizer=lambda params: torch.optim.AdamW(params),
        ...                         device="cpu", memory_limit="512MiB", target_batch=256)
        >>> result.safe_micro_batch, str(result.plan)  # on one 2-core CPU machine
        (184, 'uniform plan: micro-batch 128 x 2 accumulation steps x 1 rank(s) = 256')
    """
    step_options = {k: v for k, v in locals().items() if k in _STEP_OPTIONS}  # (the first local)
    eval_state = eval_state_of(eval, target_batch)
    _check_soak_options(soak_steps, job_steps, eval_state)
    cache_dir = _cache_dir(cache, cache_trust, eval_state)
    session = _Session(
        model,
        example_batch,
        optimizer,
        loss_fn,
        precision,
        device,
        memory_limit,
        margin,
        target_batch,
        world_size,
        time_limit,
        steps_per_trial,
        min_batch,
        max_batch,
        dataset_size,
        max_trials,
        strategy,
        plan,
        reserve,
        step,
        ddp,
        zero_grad,
        keep_output,
        autocast_cache,
        loader_batches,
    )
    if eval_state:
        session.key = fingerprint(model, session.example, base=session.key, eval=eval_state)
    probes = []

    def search(probe, facts):
        probes.append(probe)
        probe.bar = _progress_bar(progress)
        evaluator = EvalProbe(probe) if eval_state else None
        where = None
        if cache_dir is not None:
            where = {
                "dir": cache_dir,
                "trust": cache_trust,
                "fields": _cache_key_fields(session, facts),
            }
        try:
            return _core.search(
                probe.stopping_at_model_error,
                session.options,
                facts,
                probe.cancel,
                evaluator,
                eval_state,
                where,
                measure=probe.measuring_at_model_error,
            )
        finally:
            if probe.bar is not None:
                probe.bar.close()

    out = session.run(search)
    result = Result.from_report(
        session.describe(json.loads(out["json"]), probes[0]), out["text"], out["env"], session.key
    )
    if session.loader is not None:
        result.data = session.loader.report()
    if probes[0].stopped_by is not None:  # raised with what the search verified before it
        error = probes[0].stopped_by
        raise ModelError(str(error), result, error.micro_batch) from error.__cause__
    if probes[0].interrupted:
        raise Cancelled("interrupted: the search stopped at Ctrl-C; the model is restored", result)
    if eval_state == "parameters-only" and result.eval_safe_batch == 0:  # the evaluation's words
        raise DoesNotFit(eval_nothing_fits_message(result), result)
    if result.safe_micro_batch == 0:  # the command's exit status 3, whatever ended the search
        raise DoesNotFit(_nothing_fits_message(result), result)
    if eval_state and result.eval_safe_batch == 0:  # --eval's exit 3
        raise DoesNotFit(eval_nothing_fits_message(result), result)
    _soak_answer(result, model, example_batch, soak_steps, job_steps, step_options)
    return result


def _check_soak_options(soak_steps, job_steps, eval_state):
    if soak_steps is not None:
        _count(soak_steps, "soak_steps", maximum=_INT32_MAX)
        if eval_state == "parameters-only":
            raise UsageError(
                "soak_steps: soaks a training step, but eval='only' sizes an evaluation job; "
                "drop one"
            )
    if job_steps is not None:
        if soak_steps is None:
            raise UsageError(
                "job_steps: the job's optimizer steps are for the soak's growth; pass "
                "soak_steps= too (e.g. soak_steps=20)"
            )
        _count(job_steps, "job_steps", maximum=2**62)


# find()'s options that soak() takes as they were given: the step and the memory.
_STEP_OPTIONS = (
    "optimizer",
    "loss_fn",
    "precision",
    "device",
    "memory_limit",
    "margin",
    "reserve",
    "step",
    "ddp",
    "zero_grad",
    "keep_output",
    "autocast_cache",
)


def _soak_answer(result, model, example_batch, soak_steps, job_steps, options):
    """find(soak_steps=N): the soak of the answer (with find's options for the step and the
    memory), kept on the result: Result.soak, its report after the search's, and its findings
    among the warnings. Nothing without soak_steps."""
    if not soak_steps:
        return
    options = {k: v for k, v in options.items() if v is not None}
    soaked = soak(
        model,
        example_batch,
        result.micro_batch,
        steps=soak_steps,
        accumulation_steps=result.accumulation_steps,
        job_steps=job_steps,
        **options,
    )
    result.soak = soaked
    result.text = f"{result.text.rstrip()}\n{soaked}\n"
    if soaked.failed_step is not None or soaked.growing:
        result.warnings.append(
            f"the soak of micro-batch {result.micro_batch}: "
            + "; ".join(str(soaked).splitlines()[1:])
        )


def job_fields(model_digest: str, example_batch: Any, options: Mapping[str, Any]) -> dict[str, str]:
    """What one rank's plan depends on, for the ranks of a running job to compare before any
    trial (_ranks.compare_job), as the command's ranks compare theirs: the model's digest as the
    caller computes it, the example's inputs without the batch dimension, the step, loss and
    optimizer by their code, and the options that change the trials or the plan. Never the
    device, the memory limit, reserve or margin, or the search's bounds (ranks on other devices
    are what the minimum over the ranks is for)."""

    def code(fn):
        if fn is None or isinstance(fn, str):
            return repr(fn)
        if isinstance(fn, torch.optim.Optimizer):
            return f"{type(fn).__qualname__} {sorted((k, repr(v)) for k, v in fn.defaults.items())}"
        return f"{_name(fn)} {_code_digest(fn)}"

    plain = (
        ("target_batch", None),
        ("plan", "fastest"),
        ("steps_per_trial", 2),
        ("precision", None),
        ("zero_grad", "none"),
        ("keep_output", True),
        ("autocast_cache", True),
        ("eval", False),
        ("ddp_kwargs", None),
    )
    return {
        "model": model_digest,
        "inputs": " ".join(_inputs(example_batch)),
        "step": code(options.get("step")),
        "loss_fn": code(options.get("loss_fn")),
        "optimizer": code(options.get("optimizer")),
        **{k: repr(options.get(k, default)) for k, default in plain},
    }


def _cache_dir(cache, trust, eval_state):
    """The results folder for find(cache=...): None (off), True (the default folder, as the
    command's --cache), or a folder path; UsageError for anything else, for cache_trust without a
    cache, and for a cache with eval= (as the command refuses --cache with --eval)."""
    if not isinstance(trust, bool):
        raise UsageError(f"cache_trust: expected True or False, but got {trust!r}")
    if cache is None or cache is False:
        if trust:
            raise UsageError(
                "cache_trust=True needs cache= (True for the default folder, or a folder path)"
            )
        return None
    if eval_state:
        raise UsageError(
            "cache: the result cache keeps training searches only; drop cache= when you pass eval="
        )
    if cache is True:
        return _core.default_cache_dir()
    if isinstance(cache, (str, os.PathLike)) and os.fspath(cache):
        return os.fspath(cache)
    raise UsageError(
        f"cache: expected True (the default folder, $AUTOBATCH_CACHE_DIR or "
        f"~/.cache/autobatch/results), a folder path, or None, but got {cache!r}"
    )


def _cache_key_fields(session, facts):
    """What the answer of find() depends on, as (name, value) text pairs in a fixed order (the
    command's key fields where they mean the same, docs/cache.md): the model's fingerprint (its
    structure, settings and forward code, the example's shapes), the step (loss, user step,
    optimizer and the code of its factory, zero_grad, precision, steps, DDP's bucket), the limit
    as resolved (not as asked: the room left differs between machines), reserve, margin, the
    search's bounds and strategy, the device (name and total memory), torch, CUDA and autobatch
    versions and the allocator's configuration. Not the target batch, world size or plan: a hit
    plans again from the cached safe micro-batch."""
    o, model, device = session.options, facts["model"], session.device
    device_name, total = "cpu", 0
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name, total = props.name, props.total_memory
    fields = [
        ("format", "python-eager"),
        ("model", fingerprint(session.model, session.example)),
        ("inputs", " ".join(_inputs(session.example))),
        ("loss", f"{_loss_name(session, 'default')} {_code_digest(session.loss_fn)}"),
        ("step", f"{_name(session.step)} {_code_digest(session.step)}"),
        (
            "optimizer",
            f"{facts['optimizer']} {session.optimizer_name} "
            f"{session.optimizer_code} {facts['optimizer_options']}",
        ),
        ("optimizer_impl", model["optimizer_impl"] or "none"),
        ("zero_grad", session.zero_grad),
        ("keep_output", session.keep_output),
        ("precision", session.precision),
        ("autocast_cache", session.autocast_cache),
        ("steps_per_trial", session.steps),
        ("ddp_bucket_bytes", session.ddp_bucket_bytes),
        ("memory_limit_bytes", facts["context"]["memory_limit_bytes"]),
        ("reserve_bytes", o["reserve_bytes"]),
        ("margin", f"{o['margin_fraction']} {o['margin_bytes']}"),
        ("strategy", o["strategy"]),
        ("min_batch", o["min_batch"]),
        ("max_batch", o["max_batch"]),
        ("dataset_size", o["dataset_size"]),
        ("device", f"{device_name} {total}"),
        ("torch", torch.__version__),
        ("cuda", torch.version.cuda or "none"),
        ("autobatch", _core.version()),
        (
            "allocator_conf",
            f"{os.environ.get('PYTORCH_ALLOC_CONF', '')} "
            f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}",
        ),
    ]
    return [(k, str(v)) for k, v in fields]


def _progress_bar(progress):
    """A tqdm bar of trials when `progress` is True, or None (auto) and tqdm is installed and
    stderr is a terminal; else None."""
    import sys

    if (
        progress not in (None, True, False)
        or isinstance(progress, (int, float))
        and not isinstance(progress, bool)
    ):
        raise UsageError(
            f"progress: expected True (a tqdm bar of trials), False or None (a bar "
            f"when tqdm is installed and stderr is a terminal), but got {progress!r}"
        )
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            raise UsageError("progress=True needs tqdm (pip install tqdm)") from None
        return None
    return tqdm(desc="autobatch", unit="trial")


def check_batch(
    model: torch.nn.Module,
    example_batch: Any,
    micro_batch: int,
    *,
    micro_batches_per_step: int = 1,
    **options: Any,
) -> Trial:
    """Runs one trial of the user's step at `micro_batch` (`autobatch --check-batch`).

    The same trial as find()'s (`steps_per_trial` optimizer steps, each of
    `micro_batches_per_step` micro-batches), measured the same way, with the model restored
    afterwards; no search and no plan.

    Args:
        model (torch.nn.Module): the model, as for find().
        example_batch (Any): one batch whose samples are repeated, or the job's DataLoader
            (its costliest samples), as for find().
        micro_batch (int): the micro-batch to run, samples, >= 1.
        micro_batches_per_step (int): micro-batches accumulated before each optimizer step, 1
            to 2^31 - 1 (default 1; 2 holds the first micro-batch's gradients through the
            second, as a plan with accumulation does).
        **options (Any): find()'s options for the step and the memory: optimizer, loss_fn,
            step, precision, device, memory_limit, margin, reserve, steps_per_trial, ddp,
            zero_grad, keep_output, autocast_cache, with find()'s types and defaults. The
            options that bound or plan a search (target_batch, world_size, time_limit,
            min_batch, max_batch, dataset_size, max_trials, strategy, plan) are UsageErrors
            unless left at their defaults, as are progress, cache, cache_trust and eval.

    Returns:
        Trial: `outcome` "fits", "out-of-memory" or "size-limit" (out of memory is an outcome
        here, never DoesNotFit), the peaks in bytes (per phase too), the failed phase, the step
        time.

    Raises:
        UsageError: a bad argument (micro_batch or micro_batches_per_step not an int >= 1, a
            search option, an unknown option), or as find() raises it.
        ModelError: the step raised an error that is not out of memory (`.result` is None).
        Cancelled: Ctrl-C during the trial (the model is restored; `.result` is None).

    Examples:
        >>> trial = autobatch.check_batch(model, torch.randn(1, 256), 1024,
        ...                               memory_limit="64MiB")
        >>> trial.outcome in ("fits", "out-of-memory", "size-limit")
        True
        >>> trial.peak_bytes, trial.phase_peaks, trial.failed_phase  # bytes; "" when it fits
    """
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise UsageError(f"micro_batch: expected an int >= 1, but got {micro_batch!r}")
    if micro_batches_per_step is None:
        raise UsageError(
            "micro_batches_per_step: expected an int >= 1 (the micro-batches "
            "accumulated into one optimizer step), but got None"
        )
    _count(micro_batches_per_step, "micro_batches_per_step", maximum=_INT32_MAX)
    _refuse_search_options(options, "check_batch")
    session = _session_of(model, example_batch, options, "check_batch")
    record = session.run(lambda probe, facts: probe(micro_batch, micro_batches_per_step))
    record.setdefault("outcome", FITS)
    record.update(micro_batch_size=micro_batch, micro_batches_per_step=micro_batches_per_step)
    if record.get("cancelled"):
        raise Cancelled("interrupted: the trial stopped at Ctrl-C; the model is restored")
    return Trial.from_json(record)


def _nothing_fits_message(result):
    r = result.raw.get("result") or {}
    if result.status in ("trial-budget", "time-budget"):
        budget = "trial" if result.status == "trial-budget" else "time"
        return (
            f"no micro-batch was verified before the {budget} budget ran out "
            f"({len(result.trials)} trial(s)); raise time_limit / max_trials"
        )
    if result.max_micro_batch > 0:
        return (
            f"nothing fits under the margin: micro-batch {result.max_micro_batch} fits, but "
            f"its peak is above the limit of {result.memory_limit_bytes} bytes less the margin "
            f"of {result.margin_bytes} bytes"
        )
    # The smallest micro-batch tried is min_batch, not 1 (with min_batch 6000, 1 may well fit).
    smallest = min((t.micro_batch_size for t in result.trials), default=1)
    return (
        f"nothing fits: micro-batch {smallest} does not fit under {result.memory_limit_bytes} "
        f"bytes; it needs at least {r.get('min_batch_needs_at_least_bytes', 0)} bytes (a "
        "smaller min_batch, a higher memory_limit or a smaller model)"
    )
