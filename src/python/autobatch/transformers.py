"""autobatch for the Hugging Face Trainer: `fit_training_arguments` returns a copy of the
`TrainingArguments` with `per_device_train_batch_size` and `gradient_accumulation_steps` from
autobatch's uniform plan (the Trainer needs equal micro-batches) and `auto_find_batch_size=False`,
after trials that train the way the Trainer will (transformers 5.23-5.24, issue 30):

    args = autobatch.transformers.fit_training_arguments(args, model, example_batch, 512)
    Trainer(model=model, args=args, train_dataset=...).train()

What the trial takes from the arguments: the device (`args.device`: `use_cpu`, the rank's GPU),
the optimizer (`Trainer.get_optimizer_cls_and_kwargs`: `adamw_torch_fused` by default, with the
learning rate, betas, eps and `optim_args`), autocast for `bf16` / `fp16`, activation
checkpointing (`activation_checkpointing` or its deprecated alias `gradient_checkpointing`, with
`activation_checkpointing_kwargs`, enabled as `Trainer.train` enables it and put back after the
trials) and `torch_compile` (the trials run `torch.compile(model, backend, mode)` as the Trainer
wraps it). The loss is the model's own (`output.loss`; give the batch its "labels"), or with
`label_smoothing_factor` > 0 the Trainer's LabelSmoother on the logits, as its compute_loss.

Under torchrun (world size above 1) every rank sizes under its own memory with DDP's gradient
buckets held, and the ranks agree on the smallest safe micro-batch through the job's process
group. Refused with a UsageError: DeepSpeed and FSDP (they shard what the trial holds whole),
several GPUs in one process (`n_gpu` > 1, DataParallel), a target that is not a multiple of the
world size. With `eval=True`, `per_device_eval_batch_size` is set too: the largest evaluation
batch that fits beside the training state (autobatch.find(eval=True), docs/evaluation.md), the
smallest of the ranks'; without it, `per_device_eval_batch_size` is left as it is.

No TrainerCallback variant: `Trainer.__init__` copies `args.train_batch_size` into the trainer
before the first callback event (`on_init_end`), `train()` builds the loader from that copy, and a
callback receives the arguments, not the trainer, so a callback cannot set the size before the
dataloader exists (transformers 5.24's trainer.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Optional, Tuple

import torch

from . import _find
from ._errors import UsageError
from ._options import _target
from ._plans import plan as plan_accumulation
from ._ranks import _all_min, search_and_agree
from ._session import check_option_names
from ._step_output import KeptOutput

try:
    from transformers import Trainer, TrainingArguments
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"autobatch.transformers needs transformers (pip install transformers): {e}"
    ) from None

if TYPE_CHECKING:
    from ._result import Result

log = logging.getLogger("autobatch")

_DERIVED = ("optimizer", "precision", "device", "world_size", "target_batch", "ddp", "step")


def fit_training_arguments(
    args: TrainingArguments,
    model: torch.nn.Module,
    example_batch: Any,
    target_batch: Optional[int] = None,
    *,
    eval: bool = False,
    **options: Any,
) -> TrainingArguments:
    """Returns a copy of `args` sized by autobatch for `target_batch` samples per optimizer step.

    In place of `auto_find_batch_size=True`: the copy has `per_device_train_batch_size` and
    `gradient_accumulation_steps` from the uniform plan (the Trainer needs equal
    micro-batches), so that per_device_train_batch_size x gradient_accumulation_steps x world
    size = target_batch, and `auto_find_batch_size=False`. The trials train the way the Trainer
    will: the device (args.device), the optimizer (Trainer.get_optimizer_cls_and_kwargs(args)),
    autocast for bf16 / fp16, activation checkpointing and torch_compile as the arguments say,
    `model.config.use_cache` as args.use_cache, the model's own loss (give the example its
    "labels"), or the Trainer's LabelSmoother with label_smoothing_factor > 0. Under torchrun
    every rank sizes under its own memory with DDP's buckets held, and the ranks agree on the
    smallest (see the module's docstring; docs/drop-ins.md, "Hugging Face Trainer").

    Side effects: the model is moved to args.device (as the Trainer moves it); its weights,
    buffers, gradients, training flags, activation checkpointing, use_cache and RNG states are
    put back after the trials. `args` is not changed. The sizes are logged to the "autobatch"
    logger (INFO).

    Args:
        args (TrainingArguments): the Trainer's arguments (not changed).
        model (torch.nn.Module): the model the Trainer will train (not a hub id), on any device.
        example_batch (Any): a dict as the Trainer's collator makes it ({"input_ids": ...,
            "labels": ...}); batches of B samples repeat its rows. Or a DataLoader over the
            training dataset with the Trainer's collator (DataLoader(train_dataset,
            batch_size=8, collate_fn=data_collator)): the trials run on its costliest samples
            (find() given a loader, docs/data.md), for sequences of varying length.
        target_batch (int | None): samples per optimizer step over all ranks, >= 1 and a
            multiple of the world size. Default None: as auto_find_batch_size,
            per_device_train_batch_size is the cap (the largest safe micro-batch at most it is
            set; max_batch= raises the cap) and gradient_accumulation_steps is left as it is.
        eval (bool): True: also set per_device_eval_batch_size to the safe evaluation batch with
            the training state resident (find(eval=True), the smallest of the ranks'), sized
            for the Trainer's evaluation loop (model.eval(), no_grad, the loss and logits of
            each batch, one batch's logits alive while the next runs: eval_accumulation_steps=1;
            with it unset the Trainer keeps every batch's logits, and a warning says so).
            Default False: per_device_eval_batch_size is left as it is.
        **options (Any): autobatch.find's options (memory_limit, margin, time_limit, loss_fn,
            max_batch, ...), with find()'s types and defaults; optimizer, precision, device,
            world_size, target_batch, ddp and step come from `args` (UsageError).

    Returns:
        TrainingArguments: a copy (dataclasses.replace) with per_device_train_batch_size,
        gradient_accumulation_steps, per_device_eval_batch_size and auto_find_batch_size=False.
        For the search's Result too, call fit_training_arguments_with_result.

    Raises:
        UsageError: DeepSpeed or FSDP (args.deepspeed, args.fsdp, ACCELERATE_USE_FSDP), several
            GPUs in one process (n_gpu > 1), a target that is not a multiple of the world size,
            options that come from the arguments, options find() does not take, a model that is
            not a torch.nn.Module, args that are not TrainingArguments, eval other than
            True / False, activation checkpointing on a model without it.
        DoesNotFit: the minimum micro-batch, the training state beside an evaluation batch, or
            evaluation batch 1 does not fit.
        ModelError: the step raised an error that is not out of memory.
        Cancelled: Ctrl-C, as for find().

    Examples:
        >>> from autobatch.transformers import fit_training_arguments
        >>> args = TrainingArguments(output_dir="out", bf16=True, per_device_train_batch_size=8)
        >>> args = fit_training_arguments(args, model, {"input_ids": ids, "labels": ids},
        ...                               target_batch=512, memory_limit="8GiB")
        >>> Trainer(model=model, args=args, train_dataset=ds).train()
    """
    return fit_training_arguments_with_result(
        args, model, example_batch, target_batch, eval=eval, **options
    )[0]


def _check_arguments(args, model, eval, options):
    """fit_training_arguments' checks of its arguments and of the find() options it passes on;
    raises UsageError naming the argument."""
    if eval not in (False, True):
        raise UsageError(
            f"eval: expected True (also set per_device_eval_batch_size) or False, "
            f"but got {eval!r}; the Trainer trains, so eval='only' has no place "
            "here (autobatch.find(model, batch, eval='only') sizes evaluation alone)"
        )
    if not isinstance(args, TrainingArguments):
        raise UsageError(
            f"args: expected transformers.TrainingArguments, but got {type(args).__name__}"
        )
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"model: expected the torch.nn.Module the Trainer will train (e.g. "
            f"AutoModelForCausalLM.from_pretrained(...)), but got "
            f"{type(model).__name__}"
        )
    check_option_names(
        options,
        _find.find,
        "fit_training_arguments",
        shown_out=(*_DERIVED, "eval"),
        where="the TrainingArguments",
    )
    given = sorted(set(options) & set(_DERIVED))
    if given:
        raise UsageError(
            f"fit_training_arguments: {', '.join(given)} come from the "
            "TrainingArguments (optim, bf16/fp16, use_cpu, the launch); set them "
            "there, or call autobatch.find directly"
        )


def _sized(args, result, agreed, target, eval, device, world):
    """The TrainingArguments with the agreed micro-batch, the plan's accumulation steps for
    ``target`` (else the accumulation as it was) and, with ``eval``, the evaluation batch;
    logged, and the evaluation's accumulation warning added to ``result``."""
    eval_batch = (
        (_all_min(result.eval_safe_batch, device) if world > 1 else result.eval_safe_batch)
        if eval
        else args.per_device_eval_batch_size
    )
    if target:
        plan = (
            result.plans.get("uniform") if agreed == result.safe_micro_batch else None
        ) or plan_accumulation(agreed, target, world, kind="uniform")
        micro, steps = plan.micro_batch_size, plan.accumulation_steps
    else:
        plan, micro, steps = None, agreed, args.gradient_accumulation_steps
    sized = dataclasses.replace(
        args,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=steps,
        per_device_eval_batch_size=eval_batch,
        auto_find_batch_size=False,
    )
    log.info(
        "autobatch: per_device_train_batch_size %d -> %d, gradient_accumulation_steps %d -> "
        "%d (%s)",
        args.per_device_train_batch_size,
        micro,
        args.gradient_accumulation_steps,
        steps,
        plan if plan else "no target: the accumulation as it was",
    )
    if eval:
        log.info(
            "autobatch: per_device_eval_batch_size %d -> %d",
            args.per_device_eval_batch_size,
            eval_batch,
        )
        if args.eval_accumulation_steps is None:
            note = _ACCUMULATING_PREDICTIONS
            result.warnings.append(note)
            log.warning("autobatch: %s", note)
    return sized


def fit_training_arguments_with_result(
    args: TrainingArguments,
    model: torch.nn.Module,
    example_batch: Any,
    target_batch: Optional[int] = None,
    *,
    eval: bool = False,
    **options: Any,
) -> Tuple[TrainingArguments, Result]:
    """fit_training_arguments, and the search's Result.

    Args:
        args (TrainingArguments): as for fit_training_arguments.
        model (torch.nn.Module): as for fit_training_arguments.
        example_batch (Any): as for fit_training_arguments.
        target_batch (int | None): as for fit_training_arguments.
        eval (bool): as for fit_training_arguments.
        **options (Any): as for fit_training_arguments.

    Returns:
        tuple[TrainingArguments, Result]: the sized copy of the arguments, and this rank's
        Result (its trials and report; with eval=True and eval_accumulation_steps unset, its
        warnings say that the Trainer keeps every evaluation batch's logits).

    Raises:
        UsageError: as fit_training_arguments.
        DoesNotFit: as fit_training_arguments.
        ModelError: as fit_training_arguments.
        Cancelled: as fit_training_arguments.

    Examples:
        >>> args, result = fit_training_arguments_with_result(args, model, batch, 512)
        >>> print(result)  # the report: every trial, the plan
    """
    _check_arguments(args, model, eval, options)
    target = _target(target_batch)
    if not target:
        # As auto_find_batch_size: per_device_train_batch_size is the cap (the search answers
        # at most it unless max_batch= says otherwise) and the accumulation stays as it is.
        options.setdefault("max_batch", args.per_device_train_batch_size)
    _check_supported(args, target)
    device, world = args.device, args.world_size
    precision = "amp-bf16" if args.bf16 else "amp-fp16" if args.fp16 else None
    options.setdefault("plan", "uniform")
    model_device = {p.device for p in model.parameters()}
    if model_device != {device}:
        model.to(device)  # where Trainer puts it (_move_model_to_device)
    with _checkpointing(model, args), _use_cache(model, args):
        trial_model = _compiled(model, args)

        # The Trainer's training_step keeps compute_loss's loss, not the model's output.
        options.setdefault("keep_output", False)
        if args.label_smoothing_factor and "loss_fn" not in options:
            options["step"] = _label_smoothing_step(args, model)

        def search():
            return _find.find(
                trial_model,
                example_batch,
                optimizer=_optimizer_factory(args, model),
                precision=precision,
                device=device,
                target_batch=target or None,
                world_size=world,
                ddp=world > 1,
                eval=eval,
                **options,
            )

        result, agreed = search_and_agree(search, world, device, "fit_training_arguments")
    sized = _sized(args, result, agreed, target, eval, device, world)
    return sized, result


# The evaluation trial holds one batch's logits while the next runs, as the Trainer's evaluation
# loop does with eval_accumulation_steps=1 (each batch's predictions leave the device after it);
# without it, EvalLoopContainer (transformers' trainer_pt_utils.py) concatenates every batch's
# logits on the device until the evaluation ends when predictions are kept (compute_metrics).
_ACCUMULATING_PREDICTIONS = (
    "per_device_eval_batch_size holds for evaluation with eval_accumulation_steps=1, or with "
    "no compute_metrics (the loss only); with compute_metrics and eval_accumulation_steps unset "
    "the Trainer keeps every evaluation batch's logits on the device until the evaluation ends, "
    "memory that grows with the number of batches, not with the batch: set "
    "eval_accumulation_steps=1 in the TrainingArguments"
)


def _check_supported(args, target):
    # The Trainer's own tests: DeepSpeed from args.deepspeed or accelerate's
    # ACCELERATE_USE_DEEPSPEED (TrainingArguments then holds a deepspeed_plugin); FSDP from
    # args.fsdp or ACCELERATE_USE_FSDP == "true" (`accelerate launch --use_fsdp` or its config
    # file; accelerate.Accelerator builds its FSDP plugin from it, transformers 5.24).
    env_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    deepspeed = args.deepspeed or getattr(args, "deepspeed_plugin", None) is not None
    if deepspeed or getattr(args, "fsdp", None) or env_fsdp:
        which = "DeepSpeed" if deepspeed else "FSDP"
        source = (
            " (ACCELERATE_USE_FSDP=true in the environment: accelerate launch --use_fsdp "
            "or its config)"
            if which == "FSDP" and not getattr(args, "fsdp", None)
            else ""
        )
        sharded = (
            " For FSDP, size the job before it starts with autobatch.find_sharded(build, "
            "shard, example_batch, world_size=N) from one process (docs/sharded.md)"
            if which == "FSDP"
            else ""
        )
        raise UsageError(
            f"fit_training_arguments: {which}{source} is not supported yet: it "
            f"shards parameters and optimizer state that the trial would hold "
            f"whole.{sharded}"
        )
    if args.n_gpu > 1:
        raise UsageError(
            f"fit_training_arguments: {args.n_gpu} GPUs in one process "
            "(DataParallel) is not supported; launch one process per GPU with "
            "torchrun (DDP)"
        )
    if target and target % args.world_size:
        raise UsageError(
            f"target_batch: {target} is not a multiple of the world size "
            f"{args.world_size} (every rank takes an equal share)"
        )


def _label_smoothing_step(args, model):
    """The Trainer's compute_loss with label_smoothing_factor > 0 (transformers 5.24, trainer.py):
    the labels popped from the inputs, the model's forward without them (no loss of its own), then
    LabelSmoother on the logits, shifted for a causal language model (its -log_softmax of the
    whole logits and the shifted copies are memory the model's own loss does not take: sized
    with the model's loss, a model's answer was 40 where the smoothed step fits 32)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.trainer_pt_utils import LabelSmoother

    smoother = LabelSmoother(epsilon=args.label_smoothing_factor)
    base = model.base_model.model if _is_peft(model) else model
    causal = base._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()

    def trainer_compute_loss(m, batch):
        if not isinstance(batch, dict) or "labels" not in batch:
            return m(**batch).loss if isinstance(batch, dict) else m(batch).loss
        inputs = dict(batch)
        labels = inputs.pop("labels")
        outputs = m(**inputs)
        loss = smoother(outputs, labels, shift_labels=causal)
        if torch.is_grad_enabled():
            return loss  # training_step: compute_loss returns the loss alone
        # prediction_step (the evaluation trial, under no_grad): compute_loss(...,
        # return_outputs=True) hands the outputs back, and the evaluation loop keeps the batch's
        # logits while the next batch runs (all_preds, or `logits` until the next
        # prediction_step returns). Kept as the trial's output, as the model's own loss keeps
        # its output: with the loss alone the evaluation batch was sized 72 where the Trainer's
        # evaluation of two batches (eval_accumulation_steps=1) runs out of memory at 66.
        return KeptOutput(loss, outputs.logits)

    return trainer_compute_loss


def _is_peft(model):
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _optimizer_factory(args, model):
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)

    def build(params):
        return cls(params, **kwargs)

    build.__qualname__ = f"{cls.__module__}.{cls.__qualname__} (optim={args.optim})"
    return build


@contextlib.contextmanager
def _checkpointing(model, args):
    """Activation checkpointing as Trainer.train() enables it (transformers 5.24), undone after."""
    if not args.activation_checkpointing:
        yield
        return
    was = bool(_checkpointing_on(model))
    hooks_before = list(_input_grad_hooks(model))
    kwargs = dict(args.activation_checkpointing_kwargs or {})
    every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None, every_n_layers=every, offload=offload
        )
        disable = model.activation_checkpointing_disable
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
        disable = model.gradient_checkpointing_disable
    else:
        raise UsageError(
            f"args.activation_checkpointing: {type(model).__name__} has no "
            "activation_checkpointing_enable(); turn it off or use a PreTrainedModel"
        )
    try:
        yield
    finally:
        if not was:
            disable()
            _drop_input_require_grads(model, hooks_before)


@contextlib.contextmanager
def _use_cache(model, args):
    """model.config.use_cache as the Trainer sets it in its __init__ (`args.use_cache`, False by
    default: transformers 5.24's trainer.py, "Finalize"), put back after the trials: with the
    model's own True, every evaluation forward built a key/value cache the Trainer's does not (the
    tiny Llama's evaluation batch was sized 58 where the Trainer's evaluation fits 61), and every
    training forward one its training step does not."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        yield
        return
    was = config.use_cache
    config.use_cache = args.use_cache
    try:
        yield
    finally:
        config.use_cache = was


def _input_grad_hooks(model):
    """The forward hooks enable_input_require_grads() registered on the input embeddings
    (transformers 5.24's modeling_utils.py keeps them in _require_grads_hooks)."""
    hooks = getattr(model, "_require_grads_hooks", None) or []
    single = getattr(model, "_require_grads_hook", None)
    return hooks if hooks else ([single] if single is not None else [])


def _drop_input_require_grads(model, hooks_before):
    """The hooks that enabling checkpointing for the trials added, removed: its disable removes
    them only for a PEFT model (_activation_checkpointing_disable), so each call left one more
    on the input embeddings of a plain model."""
    added = [h for h in _input_grad_hooks(model) if all(h is not b for b in hooks_before)]
    for h in added:
        h.remove()
    if added:
        if hooks_before:
            model._require_grads_hooks = hooks_before
            model._require_grads_hook = hooks_before[0]
        else:
            model._require_grads_hooks = []
            if hasattr(model, "_require_grads_hook"):
                del model._require_grads_hook


def _checkpointing_on(model):
    if hasattr(model, "is_activation_checkpointing"):  # transformers 5.x
        return model.is_activation_checkpointing
    return getattr(model, "is_gradient_checkpointing", False)


def _compiled(model, args):
    if not args.torch_compile:
        return model
    return torch.compile(
        model, backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode
    )


__all__ = ["fit_training_arguments", "fit_training_arguments_with_result"]
