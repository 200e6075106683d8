"""autobatch.check_eval_batch: one evaluation batch checked with the training state resident
(the `autobatch --check-eval-batch` of the Python package; docs/python.md)."""
import json

from . import _core
from ._errors import Cancelled, UsageError
from ._eval import EvalProbe
from ._find import _session_of
from ._result import EvalCheck


def check_eval_batch(model, example_batch, eval_batch, **options):
    """One evaluation trial at `eval_batch` with the training state resident (the
    `autobatch --check-eval-batch` of the Python package): one real training step at min_batch
    makes the optimizer state (and keeps the gradients with zero_grad="zeros"), then 2 batches of
    `eval_batch` in eval mode under no_grad with the previous output alive. Options as find()'s
    (not eval, target_batch). Returns an EvalCheck: .fits (raw), .fits_with_margin, .state_fits
    (False: the training state itself does not fit, and no evaluation batch ran). Raises as
    find() does, but never DoesNotFit."""
    if isinstance(eval_batch, bool) or not isinstance(eval_batch, int) or eval_batch < 1:
        raise UsageError(f"eval_batch: expected an int >= 1 (the evaluation batch to check), but "
                         f"got {eval_batch!r}")
    for name in ("eval", "target_batch"):
        if options.get(name) is not None:
            raise UsageError(f"check_eval_batch: {name}= has no meaning for one evaluation batch; "
                             f"drop it (find(..., eval=True) searches the evaluation batch)")
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
