"""The evaluation trial (docs/evaluation.md, docs/python.md): the user's model in eval mode, its
forward and loss under torch.no_grad() in the training precision's autocast, 2 batches with the
previous batch's output alive while the next runs, beside the training state as it is in the
middle of training. The C++ search (autobatch._core.search / check_eval) calls hold(), then the
probe once per trial, then release(), as autobatch::findMaxEvalBatch calls the runner.

torch.no_grad(), not torch.inference_mode(): the memory of a forward without a graph is the same
under both, but a tensor made under inference mode (a lazily built cache, a buffer a module
creates on its first call) stays an inference tensor and raises when the user's training later
saves it for backward; no_grad leaves the user's model as the search found it.
"""

import time

import torch

from ._errors import ModelError, UsageError
from ._vocabulary import FITS


class EvalProbe:
    """The evaluation side of an EagerProbe (its meter, model, options, failure rules)."""

    def __init__(self, probe):
        self.probe = probe
        self.resident = None  # the training state: [optimizer], DDP's buckets

    def hold(self, training, training_batch, micro_batches):
        """The training state, made by one real training step at `training_batch` (the search's
        smallest batch) whose optimizer is kept, the gradients as zero_grad leaves them (kept
        with zero_grad="zeros"), DDP's buckets kept; `training` False: the parameters only.
        Returns the step's trial record with "holds" and "resident_bytes"."""
        p = self.probe
        # The evaluation trials learn apart from the training's (the probe's evidence is per kind
        # of trial: "_evaluate"), as the runner keeps eval_evidence; the state's training step
        # (kind "step") starts with none, as holdEvalState's.
        self.forget_evidence()
        if not training:
            self.resident = ([], None)
            return {
                "memory_limit_bytes": p.meter.limit_bytes(),
                "holds": True,
                "resident_bytes": p.meter.current_bytes(),
            }
        kept = []

        def step(size, micro):
            buckets = p.buckets(size)
            done = p._steps(size, micro, steps=1, keep=kept)
            self.resident = (kept, buckets)
            return done

        p.kept_grads = p.zero_grad == "zeros"
        p.holding = True  # the state made here is held on purpose until release()
        try:
            record = p.trial(training_batch, micro_batches, step)
        except BaseException:  # a model error (ModelError): nothing is held
            self.release()
            raise
        holds = (
            record.get("outcome", FITS) == FITS
            and not record.get("cancelled")
            and self.resident is not None
        )
        if not holds:
            self.release()
        record["holds"] = holds
        record["resident_bytes"] = p.meter.current_bytes() if holds else 0
        return record

    def forget_evidence(self):
        """What the evaluation trials and the state's training step taught, forgotten (the
        runner's releaseEvalState: eval_evidence.forgetTrials())."""
        for kind in ("_evaluate", "step"):
            self.probe.evidence.pop(kind, None)

    def release(self):
        """The training state dropped: optimizer, buckets, gradients; the weights put back and
        the caches emptied unless the device had a fatal error (then nothing touches it, as
        after a trial: the copy would raise the sticky error again and replace the ModelError
        that says so)."""
        self.resident = None
        self.forget_evidence()
        self.probe.kept_grads = False
        self.probe.holding = False
        for param in self.probe.state.params:
            param.grad = None
        if self.probe.meter.poisoned():
            return
        self.probe.state.restore_weights()
        self.probe.meter.release()

    def __call__(self, size, batches):
        """One evaluation trial. A ModelError ends the evaluation search as a cancellation
        would, kept in the probe's `stopped_by` (naming the evaluation), for find() to raise with
        the result known so far: the training search's answer and what the evaluation verified
        (raised from here it would leave _core.search, and the ModelError would have no
        result)."""
        try:
            return self.probe.trial(size, batches, self._evaluate)
        except ModelError as e:
            stopped = ModelError(
                f"in an evaluation trial (model.eval(), torch.no_grad(), "
                f"{batches} batch(es) of {size}): {e}",
                None,
                e.micro_batch,
            )
            stopped.__cause__ = e.__cause__
            self.probe.stopped_by = stopped
            return {
                "cancelled": True,
                "memory_limit_bytes": self.probe.meter.limit_bytes(),
                "steps_completed": 0,
                "reason": "the model raised an error in evaluation",
            }

    def _evaluate(self, size, batches):
        """`batches` evaluation batches of `size`; (1, ms): one evaluation "step"."""
        p, model = self.probe, self.probe.model
        flags = [(m, m.training) for m in model.modules()]
        t0 = time.perf_counter()
        output = loss = batch = None
        # A framework's evaluation runs its own step (Lightning's validation_step), which its
        # training step carries as `eval_step`: put in the probe's place for these batches.
        training_step = p.step
        p.step = getattr(training_step, "eval_step", None) or training_step
        try:
            model.eval()
            with torch.no_grad():
                for index in range(batches):
                    p._enter("inputs", size, index)
                    batch = p._batch(size)
                    # The previous batch's output is replaced only once this forward returned
                    # (`output = model(x)` in the user's loop).
                    output, loss = p.forward_loss(batch, size, index)
            p._enter("idle", size)
            del output, loss, batch
        finally:
            p.step = training_step
            for m, training in flags:
                m.training = training
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        return 1, (time.perf_counter() - t0) * 1000.0


def eval_state_of(eval, target_batch):
    """find's eval= as the C++ evaluation state: "" (no evaluation search), "training-resident"
    (True, the CLI's --eval) or "parameters-only" ("only", --eval-only)."""
    if eval is False or eval is None:
        return ""
    if eval is True:
        return "training-resident"
    if eval == "only":
        if target_batch is not None:
            raise UsageError(
                "eval='only' sizes an evaluation job alone, which has no "
                "accumulation plan: drop target_batch, or use eval=True to plan "
                "training and size evaluation beside it"
            )
        return "parameters-only"
    raise UsageError(
        f"eval: expected False (training only), True (also the largest evaluation "
        f"batch with the training state resident, as `autobatch --eval`) or 'only' "
        f"(an evaluation job alone, parameters only, as --eval-only), but got "
        f"{eval!r}"
    )


def eval_nothing_fits_message(result):
    e = result.raw.get("eval") or {}
    if not e.get("state_fits", True):
        step = e.get("training_step") or {}
        return (
            f"the training state does not fit: the training step at micro-batch "
            f"{e.get('training_batch')} that creates the optimizer state ended "
            f"{step.get('outcome', 'out-of-memory')}; no evaluation batch was tried"
        )
    if e.get("search_status") in ("trial-budget", "time-budget"):
        return (
            f"no evaluation batch was verified before the budget ran out "
            f"({e.get('search_status')}); raise time_limit / max_trials"
        )
    if result.eval_max_batch > 0:
        return (
            f"no evaluation batch fits under the margin: batch {result.eval_max_batch} fits, "
            f"but its peak is above the limit less the margin"
        )
    beside = "the parameters" if e.get("state") == "parameters-only" else "the training state"
    return (
        f"no evaluation batch fits: batch 1 does not fit beside {beside}; it needs at least "
        f"{e.get('min_batch_needs_at_least_bytes', 0)} bytes"
    )
