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

try:
    import lightning.pytorch  # noqa: F401 (its absence is said here, once, for every module)
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"autobatch.lightning needs Lightning (pip install lightning): {e}") from None

from ._finder import AutobatchFinder

__all__ = ["AutobatchFinder"]
