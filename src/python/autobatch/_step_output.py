"""The step's loss and what a trial keeps of its output: the default loss taken from a model's
output, a loss_fn's result checked, a framework's output held as the framework holds it
(KeptOutput), and the optimizer's state bytes for the report. Shared by the training trial
(_trial.py), the evaluation trial (_eval.py), the drop-ins and the sharded job's verification."""

from collections.abc import Mapping

import torch

from ._errors import UsageError
from ._state import local_tensor


def default_loss(output, rule=None):
    """The loss when no loss_fn is given: the output's `.loss` (a transformers ModelOutput), its
    ["loss"] (a dict), a scalar output itself, a tuple's first element; else the mean of the
    output tensor (the `autobatch` command's default loss, "mean")."""
    rule = rule if rule is not None else []
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is not None:
        rule.append("model")  # the model computed it (the command's --loss model)
        return loss
    if isinstance(output, (list, tuple)) and output:
        return default_loss(output[0], rule)
    if isinstance(output, torch.Tensor):
        rule.append("model" if output.dim() == 0 else "mean")
        return output if output.dim() == 0 else output.float().mean()
    if hasattr(output, "loss") or hasattr(output, "logits"):  # a transformers ModelOutput
        raise TypeError(
            f"the model returned {type(output).__name__} with no loss: a Hugging Face model "
            "computes its loss only when the batch holds `labels` (issue 40 row 14); add them to "
            "example_batch, e.g. {'input_ids': ids, 'attention_mask': mask, 'labels': ids} for a "
            "causal LM, or pass loss_fn=lambda output, batch: ... to autobatch.find"
        )
    raise TypeError(
        f"the model returned {type(output).__name__}, from which no loss can be taken: expected "
        "a tensor, a tuple whose first element is one, or an output with .loss / ['loss']; pass "
        "loss_fn=lambda output, batch: ... to autobatch.find"
    )


def state_bytes(optimizer):
    """Bytes of the distinct storages of the optimizer's state tensors (exp_avg, momentum, ...)."""
    seen, total = set(), 0
    for per_param in optimizer.state.values():
        for v in per_param.values():
            if isinstance(v, torch.Tensor) and v.numel() > 0:
                s = local_tensor(v).untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    total += s.nbytes()
    return total


def _check_loss_fn_result(loss):
    """UsageError unless loss_fn returned the micro-batch's loss, a scalar tensor: a tuple of
    (loss, metrics), a dict or a per-sample vector left find() as the model's error, the vector
    only at micro-batch 2 (its shape is (1,) at 1)."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return
    if isinstance(loss, torch.Tensor):
        what, fix = (
            f"a tensor of shape {tuple(loss.shape)}",
            "reduce it, e.g. F.cross_entropy(..., reduction='mean') or .mean()",
        )
    elif isinstance(loss, (tuple, list)):
        what, fix = (
            f"a {type(loss).__name__} of {len(loss)}",
            "return the loss alone, e.g. lambda output, batch: my_loss(output, batch)[0]",
        )
    elif isinstance(loss, Mapping):
        what, fix = (
            f"a {type(loss).__name__} with keys {sorted(map(str, loss))[:5]}",
            "return the loss alone, e.g. lambda output, batch: my_loss(output, batch)['loss']",
        )
    else:
        what, fix = type(loss).__name__, "return a scalar tensor that requires grad (not .item())"
    raise UsageError(
        f"loss_fn: expected it to return the micro-batch's loss, a scalar tensor, "
        f"but it returned {what}; {fix}"
    )


class KeptOutput:
    """What a framework's step (the drop-ins' step=) returns when the framework keeps more of it
    than the loss: `loss`, the micro-batch's loss, and `kept`, the tensors the framework holds
    alive with it. `through_step` True: held through backward and the optimizer step, and freed
    before the next micro-batch's forward (Lightning keeps a training_step dict's other values in
    its ClosureResult until the batch ends: loops/optimization/automatic.py); False: held through
    backward, as keep_output=True holds the output. In an evaluation trial, `kept` is the output
    alive while the next batch runs (a Trainer's prediction_step's logits)."""

    __slots__ = ("loss", "kept", "through_step")

    def __init__(self, loss, kept, through_step=False):
        self.loss, self.kept, self.through_step = loss, kept, through_step
