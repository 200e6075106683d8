"""autobatch.check_eval_batch: one evaluation batch checked with the training state resident
(the `autobatch --check-eval-batch` of the Python package; docs/evaluation.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import _core
from ._errors import Cancelled, UsageError
from ._eval import EvalProbe
from ._result import EvalCheck
from ._session import _session_of

if TYPE_CHECKING:
    import torch


def check_eval_batch(
    model: torch.nn.Module, example_batch: Any, eval_batch: int, **options: Any
) -> EvalCheck:
    """Checks one evaluation batch beside the training state (`autobatch --check-eval-batch`).

    One real training step at `min_batch` makes the optimizer state (and keeps the gradients
    with zero_grad="zeros", DDP's buckets with ddp=True), then one evaluation trial runs: 2
    batches of `eval_batch` samples in eval mode under torch.no_grad(), in the training
    precision's autocast, the previous batch's output alive while the next runs. The model is
    restored afterwards as find() restores it.

    Args:
        model (torch.nn.Module): the model, on the device it is checked on (never moved).
        example_batch (Any): a tensor, tuple/list or mapping of tensors sharing the leading
            (batch) dimension, as for find(); its samples are repeated to make the batches.
        eval_batch (int): the evaluation batch to check, samples, >= 1.
        **options (Any): find()'s options, with find()'s types and defaults: optimizer,
            loss_fn, step, precision, device, memory_limit, margin, reserve, min_batch (the
            micro-batch of the training step that makes the state, default 1),
            steps_per_trial, ddp, zero_grad, keep_output, autocast_cache. The options that
            bound a search (time_limit, max_batch, dataset_size, max_trials, strategy, plan,
            world_size) are checked as find() checks them and bound nothing here. eval= and
            target_batch= are UsageErrors, as are progress, cache and cache_trust (find()'s
            alone) and any name find() does not take.

    Returns:
        EvalCheck: `.fits` (the evaluation trial ran to its end, raw), `.fits_with_margin`
        (its peak under the limit less the margin), `.state_fits` (False: the training state
        itself does not fit and no evaluation batch ran), the trials and the report. A batch
        or a state that does not fit is the EvalCheck's answer, never DoesNotFit.

    Raises:
        UsageError: a bad argument (eval_batch not an int >= 1, eval= or target_batch= given,
            an unknown option), or as find() raises it.
        ModelError: the model, loss or optimizer raised an error that is not out of memory.
        Cancelled: Ctrl-C during the trial (the model is restored; `.result` is None).

    Examples:
        >>> check = autobatch.check_eval_batch(model, batch, 512, memory_limit="8GiB",
        ...                                    optimizer=lambda p: torch.optim.AdamW(p))
        >>> check.state_fits, check.fits, check.fits_with_margin
        (True, True, True)
    """
    if isinstance(eval_batch, bool) or not isinstance(eval_batch, int) or eval_batch < 1:
        raise UsageError(
            f"eval_batch: expected an int >= 1 (the evaluation batch to check), but "
            f"got {eval_batch!r}"
        )
    for name in ("eval", "target_batch"):
        if options.get(name) is not None:
            raise UsageError(
                f"check_eval_batch: {name}= has no meaning for one evaluation batch; "
                f"drop it (find(..., eval=True) searches the evaluation batch)"
            )
        options.pop(name, None)
    session = _session_of(model, example_batch, options, "check_eval_batch")
    probes = []

    def check(probe, facts):
        probes.append(probe)
        return _core.check_eval(EvalProbe(probe), session.options, facts, eval_batch)

    out = session.run(check)
    doc = session.describe(json.loads(out["json"]), probes[0])
    if probes[0].interrupted:
        raise Cancelled("interrupted: the trial stopped at Ctrl-C; the model is restored")
    return EvalCheck.from_report(doc, out["text"], out["env"], eval_batch)
