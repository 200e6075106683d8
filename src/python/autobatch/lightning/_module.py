"""What AutobatchFinder reads of the trainer and the LightningModule, and the trial it makes of
them: its checks (what it cannot size, and why), the precision, the first batch of the loop, the
module's own `training_step` as the step, the first optimizer of `configure_optimizers` built
fresh per trial with its schedulers, and the module's logging and metrics quiet during the
search."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.parsing import (
    lightning_hasattr,
)
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

from .._errors import UsageError
from .._step_output import KeptOutput

if TYPE_CHECKING:
    pass

log = logging.getLogger("autobatch")

_PRECISIONS = {"32-true": None, "32": None, "16-mixed": "amp-fp16", "bf16-mixed": "amp-bf16"}


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


def _loader_of(loop, stage):
    """A loop's loader, built as its data source builds it (at the batch size set now)."""
    loaders = loop._data_source.dataloader()
    if isinstance(loaders, (list, tuple, dict)):
        raise UsageError(
            f"AutobatchFinder: the module returns several {stage} dataloaders; "
            "autobatch sizes one (as BatchSizeFinder does)"
        )
    return loaders


def _train_loader(trainer):
    """The fit loop's train DataLoader, for find() to size on its costliest samples."""
    loader = _loader_of(trainer.fit_loop, "train")
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise UsageError(
            f"AutobatchFinder: from_loader=True needs a torch DataLoader as the train loader, "
            f"but it is a {type(loader).__name__}; leave from_loader=False to size on its "
            "first batch"
        )
    return loader


def _first_batch_of(loop, stage):
    """The first batch of a loop's loader, built as its data source builds it. A DataLoader's
    iterator draws its base seed from torch's generator, shuffled or not: the run's RNG stream
    is kept as it was (the fit's moved by the finder's batch otherwise)."""
    loaders = _loader_of(loop, stage)
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
