"""AutobatchFinder, the Callback (the package's docstring says when it runs and why there): it
checks what it can in `setup`, sizes the module right after the module's own `setup`, and sets the
micro-batch and `accumulate_grad_batches`; what it reads of the trainer and the module is in
_module.py."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.parsing import (
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
)

from .. import _find
from .._errors import UsageError
from .._options import _target
from .._plans import plan
from .._ranks import search_and_agree
from .._session import check_option_names

if TYPE_CHECKING:
    from .._result import Plan, Result

from ._module import (
    _LOOPS,
    _autocast_cache,
    _check_can_size,
    _first_batch,
    _first_batch_of,
    _loop_step_of,
    _optimizer_factory,
    _precision,
    _quiet_logging,
    _rank_share,
    _refuse_lightning_names,
    _reset_metrics,
    _run_after_module_setup,
    _train_loader,
    _training_step_of,
    _warn_mutually_exclusive,
)

log = logging.getLogger("autobatch")

_DERIVED = (
    "optimizer",
    "loss_fn",
    "precision",
    "device",
    "world_size",
    "step",
    "ddp",
    "target_batch",
    "autocast_cache",
)


class AutobatchFinder(pl.Callback):
    """Sizes the micro-batch (and the accumulation for `target_batch`) before `fit` trains.

    A Lightning Callback that stands where Lightning's BatchSizeFinder stands: it sets the
    batch size attribute to the uniform plan's micro-batch and `trainer.accumulate_grad_batches`
    to its steps, so that micro-batch x accumulation x world size is `target_batch` exactly
    (without a target: the largest safe micro-batch, the accumulation untouched). The trial is
    the module's own step: batches of B samples repeated from the first batch of the train
    loader (or made from its costliest samples: from_loader=True), `training_step(batch, 0)`,
    backward, a step of the optimizer a fresh `configure_optimizers()` returns, zero_grad, in
    the trainer's precision ("32-true", "16-mixed", "bf16-mixed"). It runs right after the
    module's own setup(stage="fit"), before configure_model, configure_optimizers and the fit
    loop's train loader (module docstring; docs/drop-ins.md, "Lightning"). Under DDP every rank
    searches under its own memory with DDP's buckets held, and the ranks agree on the smallest
    safe micro-batch through the job's store.

    Skipped, as BatchSizeFinder skips, under fast_dev_run (with Lightning's warning); like it,
    warns when the module and its hparams both hold the batch size attribute; max_trials=0
    leaves the batch size as it is. Under trainer.validate / test / predict it sizes that loop's
    batch with the loop's own step in eval mode, the parameters alone resident
    (find(eval="only")), and sets the attribute to result.eval_safe_batch; with eval=True in fit
    the evaluation trials run validation_step.

    Side effects: the batch size attribute and `trainer.accumulate_grad_batches` are set, and
    the sizes logged through Lightning's rank_zero_info (the whole report to the "autobatch"
    logger, DEBUG); the module is moved to the strategy's root device; its parameters, buffers,
    gradients, training flags and RNG states are restored after the trials, its torchmetrics
    states reset, and self.log / self.log_dict are no-ops during them.

    Args:
        target_batch (int | None): samples per optimizer step over all ranks (the effective
            batch), >= 1 and a multiple of the world size. Default None: only the largest safe
            micro-batch is set and `accumulate_grad_batches` is left as it is.
        batch_arg_name (str): the attribute that holds the batch size, found as Lightning finds
            it (the module, its hparams, the datamodule). Default "batch_size".
        from_loader (bool): True: the trials run on the train DataLoader's costliest samples,
            collated by its collate_fn (find() given the loader, docs/data.md: every sample of
            the epoch is read in the process, or the first `loader_batches`), for data whose
            samples differ in size; False (default): on its first batch's rows repeated, as
            BatchSizeFinder's trials see the first batches.
        **options (Any): autobatch.find's options (memory_limit, margin, time_limit,
            steps_per_trial, max_trials, min_batch, max_batch, dataset_size (default: the train
            loader's samples per rank), strategy, eval, ...), with find()'s types and defaults;
            `memory_limit` may also be a function of the trainer's global rank (ranks with
            different memory). optimizer, loss_fn, precision, device, world_size, step, ddp and
            autocast_cache come from the trainer and the module (UsageError).
            eval=True also sizes the evaluation batch beside the training state
            (result.eval_safe_batch; nothing is set from it); eval="only" is refused.
            BatchSizeFinder's mode, init_val and max_val are refused with the option that
            stands for each (strategy, min_batch, max_batch); steps_per_trial, max_trials and
            margin are taken as find() takes them (the margin in every strategy).

    Attributes:
        result (Result | None): this rank's autobatch.Result, after fit's setup (None before).
        micro_batch (int | None): the agreed micro-batch set on the attribute (in a
            validate / test / predict loop: the evaluation batch), samples.
        accumulation_steps (int | None): the accumulation set on the trainer.
        plan (Plan | None): the uniform Plan (None without a target).

    Raises:
        UsageError: at construction, for options that come from the trainer, BatchSizeFinder's
            names, eval="only", a bad batch_arg_name or target_batch, an option find() does
            not take. From trainer.fit, before any trial: manual optimization; strategies other
            than single-device and DDP (FSDP, DeepSpeed, model parallel); a dataloader passed to
            fit directly; no batch size attribute; another precision; a target that is not a
            multiple of the world size; a module without parameters after its setup;
            training_step(dataloader_iter); a target_batch beside a
            GradientAccumulationScheduler; an optimizer class the trial cannot step (LBFGS). At
            the first trial: a training_step that returns no loss tensor (None, a float, a
            dict without "loss").
        DoesNotFit: from trainer.fit, when nothing fits (on every rank under DDP).
        ModelError: from trainer.fit, when the step raised an error that is not out of memory.

    Examples:
        >>> from autobatch.lightning import AutobatchFinder
        >>> finder = AutobatchFinder(target_batch=2048, memory_limit="28MiB")
        >>> trainer = L.Trainer(callbacks=[finder])  # was callbacks=[BatchSizeFinder()]
        >>> trainer.fit(model, datamodule=dm)
        >>> finder.micro_batch, trainer.accumulate_grad_batches, finder.result.safe_micro_batch
    """

    def __init__(
        self,
        target_batch: Optional[int] = None,
        batch_arg_name: str = "batch_size",
        from_loader: bool = False,
        **options: Any,
    ) -> None:
        """Checks the options (UsageError for a bad one) and keeps them for fit's setup."""
        super().__init__()
        if not isinstance(from_loader, bool):
            raise UsageError(
                f"AutobatchFinder: from_loader: expected True (size on the train loader's "
                f"costliest samples) or False (on its first batch), but got {from_loader!r}"
            )
        self.from_loader = from_loader
        _refuse_lightning_names(options)
        given = sorted(set(options) & set(_DERIVED))
        if given:
            raise UsageError(
                f"AutobatchFinder: {', '.join(given)} come from the trainer and the "
                "module (its precision, device, strategy, training_step and "
                "configure_optimizers); remove them, or call autobatch.find directly"
            )
        check_option_names(
            options, _find.find, "AutobatchFinder", shown_out=_DERIVED, where="the trainer"
        )
        if options.get("eval") == "only":
            raise UsageError(
                "AutobatchFinder: eval='only' sizes an evaluation job alone, but "
                "the finder sets the training batch; call autobatch.find(model, "
                "batch, eval='only') for that, or eval=True to also size the "
                "evaluation batch beside the training state (result.eval_safe_batch)"
            )
        if not isinstance(batch_arg_name, str) or not batch_arg_name:
            raise UsageError(
                f"AutobatchFinder: batch_arg_name: expected the name of the batch "
                f"size attribute (a str such as 'batch_size'), but got "
                f"{batch_arg_name!r}"
            )
        self.target_batch = _target(target_batch)
        self.batch_arg_name = batch_arg_name
        # max_trials=0 keeps the batch size as the script set it, as BatchSizeFinder does (its
        # loops run no trial); find() itself takes at least 1.
        self.skip = options.get("max_trials") == 0 and not isinstance(options["max_trials"], bool)
        if self.skip:
            options.pop("max_trials")
        self.options = options
        self.result: Optional[Result] = None
        self.micro_batch: Optional[int] = None
        self.accumulation_steps: Optional[int] = None
        self.plan: Optional[Plan] = None

    def setup(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: Optional[str] = None
    ) -> None:
        """Checks what can be checked now, then sizes right after the module's own setup.

        Lightning calls the callbacks' setup before the module's (trainer/call.py,
        _call_setup_hook), and a module that builds its dataset or layers there (Lightning's
        documented place) would be sized without them (a raw AttributeError, or an answer for
        half a model): so the module's setup is wrapped, once, and the sizing runs when it
        returns. Lightning calls this hook; user code does not.

        Args:
            trainer (pl.Trainer): the trainer.
            pl_module (pl.LightningModule): the module being fitted (or validated, tested,
                predicted).
            stage (str | None): "fit", "validate", "test" or "predict"; others are ignored.

        Raises:
            UsageError: what the class docstring lists, before any trial.
        """
        if stage not in _LOOPS:
            return
        if trainer.fast_dev_run:  # as Lightning's tuner skips (tuner/batch_size_scaling.py)
            rank_zero_warn("Skipping batch size scaler since `fast_dev_run` is enabled.")
            return
        if self.skip:
            rank_zero_info(
                f"autobatch: max_trials=0: {self.batch_arg_name} and "
                "accumulate_grad_batches are left as they are"
            )
            return
        _warn_mutually_exclusive(pl_module, self.batch_arg_name)
        if stage != "fit":
            # As BatchSizeFinder sizes the loop that runs (on_validation_start, on_test_start,
            # on_predict_start): that loop's own step in eval mode, no grad, the parameters
            # alone resident (find(eval="only")).
            _precision(trainer)
            _run_after_module_setup(pl_module, lambda: self._size_loop(trainer, pl_module, stage))
            return
        world = trainer.world_size
        if self.target_batch and self.target_batch % world:
            raise UsageError(
                f"AutobatchFinder: target_batch {self.target_batch} is not a multiple "
                f"of the world size {world} (every rank takes an equal share); "
                f"use a multiple of {world}"
            )
        ddp = _check_can_size(trainer, pl_module, self.batch_arg_name, self.target_batch)
        _precision(trainer)
        _run_after_module_setup(pl_module, lambda: self._size(trainer, pl_module, ddp, world))

    def _size(self, trainer, pl_module, ddp, world):
        if not any(True for _ in pl_module.parameters()):
            raise UsageError(
                "AutobatchFinder: the module has no parameters after its setup "
                "(layers built in configure_model are not there yet); build them in "
                "__init__ or setup"
            )
        precision = _precision(trainer)
        device = trainer.strategy.root_device
        if device.type not in ("cpu", "cuda"):
            raise UsageError(
                f"AutobatchFinder: autobatch measures CPU and CUDA devices; this "
                f"trainer runs on {device}"
            )
        pl_module.to(device)  # where the strategy puts it next; the trials run there
        if self.from_loader:  # its costliest samples, moved to the device batch by batch
            example = _train_loader(trainer)
        else:
            example = trainer.strategy.batch_to_device(_first_batch(trainer), device)
        options = dict(self.options)
        if callable(options.get("memory_limit")):
            options["memory_limit"] = options["memory_limit"](trainer.global_rank)

        options.setdefault("keep_output", False)  # training_step returns the loss only
        options.setdefault("dataset_size", _rank_share(trainer, world))
        strategy = trainer.strategy
        before = (strategy.optimizers, strategy.lr_scheduler_configs)

        def search():
            return _find.find(
                pl_module,
                example,
                optimizer=_optimizer_factory(pl_module, strategy),
                precision=precision,
                device=device,
                world_size=world,
                ddp=ddp,
                step=_training_step_of(pl_module),
                autocast_cache=_autocast_cache(trainer),
                **options,
            )

        with _quiet_logging(pl_module):
            try:
                self.result, agreed = search_and_agree(search, world, device, "AutobatchFinder")
            finally:
                strategy.optimizers, strategy.lr_scheduler_configs = before
                _reset_metrics(pl_module)
        mine = self.result.safe_micro_batch
        self._apply(trainer, pl_module, agreed, mine, world)

    def _size_loop(self, trainer, pl_module, stage):
        """The evaluation batch of trainer.validate / test / predict, set on the attribute."""
        if trainer.world_size > 1:
            raise UsageError(
                f"AutobatchFinder: sizing trainer.{_LOOPS[stage][1]} runs on one "
                "device; for several ranks size the evaluation batch with "
                "autobatch.find(..., eval='only') on one rank"
            )
        if self.target_batch:
            raise UsageError(
                f"AutobatchFinder: target_batch plans training; "
                f"trainer.{_LOOPS[stage][1]} has no accumulation to plan: drop it"
            )
        loop_name, method = _LOOPS[stage]
        loop = getattr(trainer, loop_name)
        if type(pl_module).__dict__.get(method) is None and getattr(
            type(pl_module), method
        ) is getattr(pl.LightningModule, method):
            raise UsageError(f"AutobatchFinder: trainer.{stage} needs the module's {method}")
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise UsageError(
                f"AutobatchFinder: no attribute {self.batch_arg_name!r} on the "
                f"module, its hparams or the datamodule for the {stage} loader"
            )
        device = trainer.strategy.root_device
        pl_module.to(device)
        example = trainer.strategy.batch_to_device(_first_batch_of(loop, stage), device)
        options = {k: v for k, v in self.options.items() if k != "eval"}
        if callable(options.get("memory_limit")):
            options["memory_limit"] = options["memory_limit"](trainer.global_rank)
        with _quiet_logging(pl_module):
            self.result = _find.find(
                pl_module,
                example,
                precision=_precision(trainer),
                device=device,
                eval="only",
                step=_loop_step_of(pl_module, method),
                autocast_cache=_autocast_cache(trainer),
                **options,
            )
            _reset_metrics(pl_module)
        old = lightning_getattr(pl_module, self.batch_arg_name)
        self.micro_batch = self.result.eval_safe_batch
        lightning_setattr(pl_module, self.batch_arg_name, self.micro_batch)
        loop._combined_loader = None  # built again at the new size when the loop runs
        rank_zero_info(
            f"autobatch: {self.batch_arg_name} {old} -> {self.micro_batch} for "
            f"trainer.{getattr(stage, 'value', stage)} ({method} in eval mode, the "
            "parameters alone resident)"
        )

    def _apply(self, trainer, pl_module, agreed, mine, world):
        """Sets the batch size and the accumulation from the agreed micro-batch."""
        old = lightning_getattr(pl_module, self.batch_arg_name)
        if self.target_batch:
            self.plan = plan(agreed, self.target_batch, world, kind="uniform")
            self.micro_batch = self.plan.micro_batch_size
            self.accumulation_steps = self.plan.accumulation_steps
            trainer.accumulate_grad_batches = self.accumulation_steps
        else:
            self.micro_batch = agreed
            self.accumulation_steps = trainer.accumulate_grad_batches
        lightning_setattr(pl_module, self.batch_arg_name, self.micro_batch)
        # A loader built at the old size by the trials' configure_optimizers (through
        # estimated_stepping_batches) is dropped: the fit loop builds it again at the new size.
        trainer.fit_loop._combined_loader = None
        trainer.fit_loop.epoch_loop.val_loop._combined_loader = None
        agreed_text = (
            f"; the ranks agreed on {agreed} (this rank's own: {mine})" if world > 1 else ""
        )
        plan_text = f"; {self.plan}" if self.plan else ""
        message = (
            f"autobatch: {self.batch_arg_name} {old} -> {self.micro_batch}, "
            f"accumulate_grad_batches {self.accumulation_steps}{plan_text}{agreed_text}"
        )
        log.debug("%s", self.result.text)
        rank_zero_info(message)  # Lightning's own channel: shown once, on rank 0
