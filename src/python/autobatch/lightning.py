"""autobatch for Lightning: `AutobatchFinder`, a Callback that stands where Lightning's
`BatchSizeFinder` stands and sets the micro-batch and `accumulate_grad_batches` for an exact
effective batch, with the module's own `training_step` and `configure_optimizers` as the trial.

    trainer = L.Trainer(callbacks=[autobatch.lightning.AutobatchFinder(target_batch=512)])
    trainer.fit(model, datamodule=dm)

When it runs, and why there (measured on Lightning 2.6.6, issue 30): right after the module's own
`setup(stage="fit")` returns (the callback's `setup`, which Lightning calls before the module's,
checks what it can and wraps the module's `setup` once: a module that builds its layers or its
dataset there, Lightning's documented place, is sized whole), so after the datamodule's and the
module's `setup` and before `configure_model`, the strategy moving the model,
`configure_optimizers` and the fit loop building the train loader. So a `configure_optimizers`
that reads `trainer.estimated_stepping_batches` (OneCycleLR and the like) is called by Lightning
after the new batch size and accumulation are set, and its schedule follows them; the loader that
the trials' own calls may have built at the old size is dropped (the fit loop builds it again).
`BatchSizeFinder` runs in `on_fit_start`, after both, and runs its trials through the fit loop; here
the trial calls `training_step` directly with `self.log` / `self.log_dict` made no-ops for the
search (calling it outside the loop raises in Lightning).

The trial: batches of B samples repeated from the first batch of the train loader (moved by the
strategy's batch transfer, so `transfer_batch_to_device` and its hooks apply; the loader's draw
from torch's generator undone), `training_step(batch, 0)`'s loss (`training_step(batch)` where it
takes no `batch_idx`, as Lightning calls it; a tensor, or a dict's "loss"), backward, a step of
the first optimizer `configure_optimizers` returns (built fresh for every trial, and set with its
schedulers on the strategy for the trial, so `self.optimizers()` and `self.lr_schedulers()` work
in the step), `zero_grad(set_to_none=True)`, in the trainer's precision (`32-true`; `16-mixed` /
`bf16-mixed` as autocast with its cast cache off, as Lightning's MixedPrecision). Under DDP each
trial also
holds DDP's gradient buckets (`autobatch.find(ddp=True)`), every rank searches under its own
memory, and the ranks agree on the smallest safe micro-batch through the job's store (the
TCPStore of its process group, no collective: _ranks.py; the `autobatch` command's file-store
agreement exists for separate processes that share nothing, which Lightning's ranks are not).

Refused with a UsageError (raised from `trainer.fit`): manual optimization, strategies other than
single-device and DDP (FSDP, DeepSpeed and model parallel shard what the trial holds whole), a
dataloader passed to `fit` directly (its batch size cannot be set), a missing batch size attribute,
precisions other than the three above, a module whose layers are built later (`configure_model`),
`training_step(dataloader_iter)`, a `target_batch` beside a `GradientAccumulationScheduler` (both
set `accumulate_grad_batches`), `eval="only"`, an option `autobatch.find` does not take.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import torch

from . import _find
from ._errors import UsageError
from ._plans import plan
from ._ranks import search_and_agree
from ._step_output import KeptOutput

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
    from lightning.pytorch.utilities.parsing import (
        lightning_getattr,
        lightning_hasattr,
        lightning_setattr,
    )
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"autobatch.lightning needs Lightning (pip install lightning): {e}") from None

if TYPE_CHECKING:
    from ._result import Plan, Result

log = logging.getLogger("autobatch")

_PRECISIONS = {"32-true": None, "32": None, "16-mixed": "amp-fp16", "bf16-mixed": "amp-bf16"}
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
    loader, `training_step(batch, 0)`, backward, a step of the optimizer a fresh
    `configure_optimizers()` returns, zero_grad, in the trainer's precision ("32-true",
    "16-mixed", "bf16-mixed"). It runs right after the module's own setup(stage="fit"), before
    configure_model, configure_optimizers and the fit loop's train loader (module docstring;
    docs/drop-ins.md, "Lightning"). Under DDP every rank searches under its own memory with DDP's
    buckets held, and the ranks agree on the smallest safe micro-batch through the job's store.

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
        self, target_batch: Optional[int] = None, batch_arg_name: str = "batch_size", **options: Any
    ) -> None:
        """Checks the options (UsageError for a bad one) and keeps them for fit's setup."""
        super().__init__()
        _refuse_lightning_names(options)
        given = sorted(set(options) & set(_DERIVED))
        if given:
            raise UsageError(
                f"AutobatchFinder: {', '.join(given)} come from the trainer and the "
                "module (its precision, device, strategy, training_step and "
                "configure_optimizers); remove them, or call autobatch.find directly"
            )
        _find.check_option_names(
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
        self.target_batch = _find._target(target_batch)
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


# BatchSizeFinder's arguments that AutobatchFinder names otherwise, with what to pass instead
# (lightning/pytorch/callbacks/batch_size_finder.py; steps_per_trial, max_trials and margin are
# find()'s own names, taken as they are: the margin applies in every strategy, where Lightning's
# applies in binsearch mode only).
_LIGHTNING_NAMES = {
    "mode": "the search is strategy= ('guided', the default: a fit of two measured trials, then "
    "the bracket; 'binsearch' or 'power', Lightning's own)",
    "init_val": "the search starts at min_batch= (default 1: the smallest micro-batch it may "
    "answer, not a first guess to grow from)",
    "max_val": "the largest micro-batch it may answer is max_batch= (default: no bound)",
}


def _refuse_lightning_names(options):
    given = [k for k in _LIGHTNING_NAMES if k in options]
    if given:
        raise UsageError(
            "AutobatchFinder: "
            + "; ".join(f"{k}= is BatchSizeFinder's: {_LIGHTNING_NAMES[k]}" for k in given)
        )


def _warn_mutually_exclusive(pl_module, name):
    """Lightning's own warning when the module and its hparams both hold the batch size
    (BatchSizeFinder.setup): lightning_setattr sets both, the loader reads one."""
    if hasattr(pl_module, name) and hasattr(pl_module, "hparams") and name in pl_module.hparams:
        rank_zero_warn(
            f"Field `model.{name}` and `model.hparams.{name}` are mutually exclusive! "
            f"`model.{name}` will be used as the initial batch size for scaling. If "
            "this is not the intended behavior, please remove either one."
        )


def _check_can_size(trainer, pl_module, batch_arg_name, target_batch):
    """The refusals; returns True under DDP (the trials then hold DDP's gradient buckets)."""
    if not pl_module.automatic_optimization:
        raise UsageError(
            "AutobatchFinder: the module uses manual optimization "
            "(automatic_optimization = False), so the trial cannot know when its "
            "training_step steps the optimizer; size it with autobatch.find and a "
            "step function of your own"
        )
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
        sharded = (
            "; for FSDP (FSDPStrategy, ModelParallelStrategy with fully_shard), size "
            "the job before it starts with autobatch.find_sharded(build, shard, "
            "example_batch, world_size=N) from one process (docs/sharded.md)"
            if type(strategy).__name__ in ("FSDPStrategy", "ModelParallelStrategy")
            else ""
        )
        raise UsageError(
            f"AutobatchFinder: the {type(strategy).__name__} strategy is not supported "
            "yet: autobatch sizes single-device and DDP training here, while FSDP, "
            "DeepSpeed and model-parallel strategies shard parameters and optimizer "
            "state that the trial would hold whole, and sizing inside the running "
            "job would leave ranks waiting in the strategy's collectives; use "
            f"strategy='ddp' or one device{sharded}"
        )
    if not trainer.fit_loop._data_source.is_module():
        raise UsageError(
            "AutobatchFinder: the train dataloader was passed to fit() directly, so "
            "its batch size cannot be set; build it in the LightningModule's or the "
            "LightningDataModule's train_dataloader() from a batch size attribute"
        )
    if not lightning_hasattr(pl_module, batch_arg_name):
        raise UsageError(
            f"AutobatchFinder: no attribute {batch_arg_name!r} on the module, its "
            "hparams or the datamodule; add one that train_dataloader() reads, or "
            "pass batch_arg_name= with the attribute's name"
        )
    if is_param_in_hook_signature(pl_module.training_step, "dataloader_iter", explicit=True):
        raise UsageError(
            "AutobatchFinder: training_step(dataloader_iter) takes the loader's "
            "iterator, so a trial cannot hand it a batch of its size; size the step "
            "with autobatch.find and a step function of your own"
        )
    if target_batch and any(
        type(c).__name__ == "GradientAccumulationScheduler" for c in trainer.callbacks
    ):
        raise UsageError(
            "AutobatchFinder: target_batch sets accumulate_grad_batches, which the "
            "GradientAccumulationScheduler callback also sets (Lightning refuses "
            "both); remove the scheduler, or target_batch to size the micro-batch "
            "only"
        )
    if isinstance(strategy, DDPStrategy):
        kwargs = getattr(strategy, "_ddp_kwargs", {}) or {}
        return not kwargs.get("gradient_as_bucket_view", False)
    return False


def _run_after_module_setup(pl_module, then):
    """`then()` right after the module's own setup(stage="fit") returns: its setup is wrapped,
    once, on the instance (Lightning calls it as getattr(module, "setup"): trainer/call.py,
    _call_lightning_module_hook), and put back before `then` runs, whatever happens."""
    had_own = "setup" in vars(pl_module)
    own = pl_module.setup

    def setup_then_size(*args, **kwargs):
        try:
            out = own(*args, **kwargs)
        finally:
            if had_own:
                pl_module.setup = own
            else:
                del pl_module.setup
        then()
        return out

    pl_module.setup = setup_then_size


def _precision(trainer):
    precision = str(trainer.precision)
    if precision not in _PRECISIONS:
        raise UsageError(
            f"AutobatchFinder: precision {precision!r} is not supported yet; "
            f"supported: {', '.join(p for p in _PRECISIONS if p != '32')}"
        )
    return _PRECISIONS[precision]


def _autocast_cache(trainer):
    """Lightning's mixed precision runs the step under torch.autocast(..., cache_enabled=False)
    (lightning/pytorch/plugins/precision/amp.py, MixedPrecision.autocast_context_manager): a
    weight used twice in one forward is cast twice, which the trials then hold as its step does
    (with the cache on, a model was sized 1774 where Lightning's own step fits 1637)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    return not isinstance(trainer.precision_plugin, MixedPrecision)


def _rank_share(trainer, world):
    """The samples one rank's train loader has, as BatchSizeFinder caps its batch at the
    dataset's length (tuner/batch_size_scaling.py): ceil(len(dataset) / world size); None when
    the dataset has no length (an IterableDataset)."""
    try:
        loader = trainer.fit_loop._data_source.dataloader()
        n = len(loader.dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return None
    return -(-n // world) if n > 0 else None


def _first_batch(trainer):
    """The first batch of the train loader, as the data source builds it (at the old size)."""
    return _first_batch_of(trainer.fit_loop, "train")


# The loops BatchSizeFinder sizes besides fit: (the trainer's loop attribute, the step it runs).
_LOOPS = {
    "fit": ("fit_loop", "training_step"),
    "validate": ("validate_loop", "validation_step"),
    "test": ("test_loop", "test_step"),
    "predict": ("predict_loop", "predict_step"),
}


def _first_batch_of(loop, stage):
    """The first batch of a loop's loader, built as its data source builds it. A DataLoader's
    iterator draws its base seed from torch's generator, shuffled or not: the run's RNG stream
    is kept as it was (the fit's moved by the finder's batch otherwise)."""
    loaders = loop._data_source.dataloader()
    if isinstance(loaders, (list, tuple, dict)):
        raise UsageError(
            f"AutobatchFinder: the module returns several {stage} dataloaders; "
            "autobatch sizes one (as BatchSizeFinder does)"
        )
    rng = torch.get_rng_state()
    try:
        return next(iter(loaders))
    except StopIteration:
        raise UsageError(f"AutobatchFinder: the {stage} dataloader is empty") from None
    finally:
        torch.set_rng_state(rng)


def _loop_step_of(pl_module, method):
    """step(module, batch) for an evaluation trial: the loop's own step, `method(batch, 0)` (or
    `method(batch)` where it takes no batch_idx), whatever it returns held while the next batch
    runs (a prediction loop keeps its predictions)."""
    fn = getattr(pl_module, method)
    with_index = is_param_in_hook_signature(fn, "batch_idx", min_args=2)

    def loop_step(module, batch):
        step = getattr(module, method)
        return step(batch, 0) if with_index else step(batch)

    loop_step.__qualname__ = f"{type(pl_module).__qualname__}.{method}"
    return loop_step


def _training_step_of(pl_module):
    """The trial's step(module, batch): training_step(batch, 0), or training_step(batch) where it
    takes no batch_idx (Lightning passes it only then: loops/training_epoch_loop.py,
    _build_kwargs); its loss, a tensor or a dict's "loss"."""
    with_index = is_param_in_hook_signature(pl_module.training_step, "batch_idx", min_args=2)

    def training_step(module, batch):
        out = module.training_step(batch, 0) if with_index else module.training_step(batch)
        if isinstance(out, dict):
            if "loss" not in out:
                raise UsageError(
                    f"AutobatchFinder: training_step returned a dict without 'loss' "
                    f"(keys {sorted(map(str, out))}); Lightning trains on the dict's "
                    "'loss', so return it under that key"
                )
            extra = {k: v for k, v in out.items() if k != "loss"}
            out = out["loss"]
            if extra and isinstance(out, torch.Tensor):
                # Lightning keeps the dict's other values, not detached, in its ClosureResult
                # through backward and the optimizer's step until the batch ends
                # (loops/optimization/automatic.py, ClosureResult.from_training_step_output;
                # training_epoch_loop.py hands them to on_train_batch_end): {"loss", "logits"}
                # at 40 MiB was sized 1085 by a trial that kept the loss only, where
                # Lightning's fit fits 825.
                return KeptOutput(out, extra, through_step=True)
        if out is None:
            raise UsageError(
                "AutobatchFinder: training_step returned None (a skipped batch) for "
                "the example batch; it must return the loss (a tensor, or a dict "
                "with 'loss') for the trial"
            )
        if not isinstance(out, torch.Tensor):
            raise UsageError(
                f"AutobatchFinder: training_step returned {type(out).__name__}; it "
                "must return the loss as a tensor (not .item()), or a dict with "
                "'loss', for Lightning to train on it"
            )
        return out

    training_step.__qualname__ = f"{type(pl_module).__qualname__}._training_step"
    # find(eval=True)'s evaluation trials run the validation loop's step, not this one in eval
    # mode (_eval.py reads eval_step): the step Lightning's validation runs.
    if type(pl_module).validation_step is not pl.LightningModule.validation_step:
        training_step.eval_step = _loop_step_of(pl_module, "validation_step")
    return training_step


def _optimizer_factory(pl_module, strategy):
    """A factory for find(): the first optimizer of a fresh configure_optimizers() call, set as
    the strategy's optimizer with its schedulers for the trial, so a training_step that reads
    self.optimizers() or self.lr_schedulers() (the learning rate it logs) reads the trial's
    (else an AttributeError on the strategy's empty lists, taken for the model's).
    The strategy's lists are put back after the search."""

    def build(params):
        del params  # configure_optimizers chooses its own (and its param groups)
        conf = pl_module.configure_optimizers()
        optimizer = _first_optimizer(conf)
        strategy.optimizers, strategy.lr_scheduler_configs = [optimizer], _schedulers(conf)
        return optimizer

    build.__qualname__ = f"{type(pl_module).__qualname__}.configure_optimizers"

    def release_trial():
        """After each trial: the strategy lets the trial's optimizer (and its state) go, which
        it held into the next trial (2 MiB of AdamW state seen alive after a trial)."""
        strategy.optimizers, strategy.lr_scheduler_configs = [], []

    build.release_trial = release_trial
    return build


def _schedulers(conf):
    """The LRSchedulerConfigs of configure_optimizers' return, parsed as Lightning parses it
    (lightning/pytorch/core/optimizer.py); [] where it does not parse (the optimizer alone was
    checked by _first_optimizer)."""
    from lightning.pytorch.core.optimizer import (
        _configure_optimizers,
        _configure_schedulers_automatic_opt,
    )

    try:
        _, schedulers, monitor = _configure_optimizers(conf)
        return _configure_schedulers_automatic_opt(schedulers, monitor)
    except Exception:  # noqa: BLE001  Lightning refuses it itself when fit calls it
        return []


def _first_optimizer(conf):
    if isinstance(conf, torch.optim.Optimizer):
        return conf
    if isinstance(conf, dict) and "optimizer" in conf:
        return _first_optimizer(conf["optimizer"])
    if isinstance(conf, (list, tuple)) and conf:
        optimizers = [
            c
            for c in (conf[0] if isinstance(conf[0], (list, tuple)) else conf)
            if isinstance(c, (torch.optim.Optimizer, dict))
        ]
        if len(optimizers) > 1:
            raise UsageError(
                "AutobatchFinder: configure_optimizers returns several optimizers, "
                "which Lightning allows only with manual optimization"
            )
        if optimizers:
            return _first_optimizer(optimizers[0])
    raise UsageError(
        f"AutobatchFinder: configure_optimizers returned {type(conf).__name__}; "
        "expected an optimizer, a dict with 'optimizer', or a list/tuple of them"
    )


class _quiet_logging:
    """self.log / self.log_dict as no-ops while the trials call training_step outside the loop."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        noop = lambda *args, **kwargs: None  # noqa: E731
        self.module.log, self.module.log_dict = noop, noop

    def __exit__(self, *exc):
        del self.module.log, self.module.log_dict
        return False


def _reset_metrics(module):
    try:
        import torchmetrics
    except ImportError:
        return
    for m in module.modules():
        if isinstance(m, torchmetrics.Metric):
            m.reset()


__all__ = ["AutobatchFinder"]
