"""What the user's step returned or raised, checked and put in words for its ModelError (the
trials' own checks, _trial.py): the loss a step returns, the gradients its backward gives, the
text of its error and the fix for the errors the search's own choice of size causes."""

import torch


def check_loss(loss, step):
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        what = (
            type(loss).__name__
            if not isinstance(loss, torch.Tensor)
            else f"a tensor of shape {tuple(loss.shape)}, requires_grad={loss.requires_grad}"
        )
        raise TypeError(
            f"step {getattr(step, '__qualname__', step)!r} returned {what}; expected "
            "the micro-batch's loss: a scalar tensor that requires grad"
        )


def text_of(error):
    """str(error), or what stands for it when its __str__ raises: the step's own error must leave
    as a ModelError with its cause, never as the formatting's."""
    try:
        return str(error)
    except Exception as e:  # noqa: BLE001  any error of the user's __str__
        return f"<str() of this {type(error).__name__} raised {type(e).__name__}>"


def hint(error, size):
    """The fix for a model error the search's own choice of size caused: BatchNorm in training
    needs two values per channel (torch.nn.functional._verify_batch_size), so min_batch=1 fails
    for BatchNorm1d over (N, C) inputs at the first trial (issue 40)."""
    if size == 1 and "Expected more than 1 value per channel when training" in text_of(error):
        return (
            "; BatchNorm in training needs at least 2 samples per batch: pass min_batch=2 "
            "(a run that trains at micro-batch 1 fails the same way)"
        )
    if isinstance(error, MemoryError):
        # The command's rule for std::bad_alloc (docs/errors.md); without these words
        # "(not out of memory): MemoryError:" reads as a contradiction.
        return (
            "; a MemoryError is taken for out of memory only near the process's memory "
            "limit or after a larger batch ran out of memory; here the process was far from "
            "its limit, so a request this large is the step's own (a size computed wrongly?)"
        )
    return ""


def check_gradients(params):
    """After the search's first backward: some trainable parameter must have a gradient, else
    the loss does not depend on the model and every trial would measure a step that trains
    nothing (a step returning (b.sum() * w).sum() for an outside w was answered max 47741 where
    the model's own step fits 5495)."""
    trained = [p for p in params if p.requires_grad]
    if trained and all(p.grad is None for p in trained):
        raise ValueError(
            f"no trainable parameter of the model received a gradient from the "
            f"step's loss ({len(trained)} trainable); expected a loss computed "
            "from the model's output, e.g. step=lambda model, batch: "
            "F.cross_entropy(model(batch[0]), batch[1])"
        )
