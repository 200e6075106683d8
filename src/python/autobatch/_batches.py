"""Batches of the trial (autobatch/_trial.py): a batch of B samples made from the user's example,
the first samples of one as views (a measuring trial's state-making step), and the model called
on it as its kind says."""

import copy
from collections.abc import Mapping, MutableMapping

import torch


def leading_size(example):
    """The example's batch size: the leading dimension of its first tensor (dim >= 1)."""
    if isinstance(example, torch.Tensor):
        return example.shape[0] if example.dim() > 0 else None
    values = (
        example.values()
        if isinstance(example, Mapping)
        else (example if isinstance(example, (list, tuple)) else ())
    )
    for v in values:
        n = leading_size(v)
        if n:
            return n
    return None


def make_batch(example, size, n0, device):
    """A batch of `size` samples made from `example` along dimension 0: its samples repeated in
    order (so integer tensors keep their values: token ids, labels, masks), on `device`. A list
    or tuple of plain values (str, numbers, None) as long as the example's batch is per sample (a
    collated batch's texts or ids: left as they are, a Lightning batch's 4 texts would stand
    beside B rows) and is repeated the same way. Tensors whose leading dimension is not the
    example's batch size, and other values, pass unchanged."""
    if isinstance(example, torch.Tensor):
        if example.dim() == 0 or example.shape[0] != n0:
            return example.to(device)
        index = torch.arange(size, device=example.device) % n0
        return example.index_select(0, index).to(device)
    if per_sample_values(example, n0):
        items = [example[i % n0] for i in range(size)]
        return type(example)(items) if isinstance(example, list) else tuple(items)
    if isinstance(example, Mapping):
        return same_mapping(
            example, {k: make_batch(v, size, n0, device) for k, v in example.items()}
        )
    if isinstance(example, (list, tuple)):
        items = [make_batch(v, size, n0, device) for v in example]
        if hasattr(example, "_fields"):  # a namedtuple keeps its kind (batch.x, batch.y)
            return type(example)(*items)
        return type(example)(items) if isinstance(example, list) else tuple(items)
    return example


def per_sample_values(example, n0):
    """Whether `example` is a plain list or tuple (no namedtuple) of n0 plain values (str, bytes,
    numbers, None): one per sample of the example's batch."""
    return (
        isinstance(example, (list, tuple))
        and not hasattr(example, "_fields")
        and len(example) == n0 > 0
        and all(v is None or isinstance(v, (str, bytes, int, float, complex)) for v in example)
    )


def leading(example, batch, k, n0):
    """The first `k` samples of `batch`, made by make_batch(example, ..., n0), as views (no memory
    of their own): the tensors make_batch repeated (the example's leading dimension is n0) sliced,
    everything it passed unchanged left so (a tensor that happens to be as long as the batch
    included)."""
    if isinstance(example, torch.Tensor):
        if example.dim() == 0 or example.shape[0] != n0:
            return batch
        return batch[:k]
    if per_sample_values(example, n0):
        return batch[:k]
    if isinstance(example, Mapping):
        return same_mapping(
            batch, {key: leading(example[key], v, k, n0) for key, v in batch.items()}
        )
    if isinstance(example, (list, tuple)):
        items = [leading(e, v, k, n0) for e, v in zip(example, batch)]
        if hasattr(batch, "_fields"):
            return type(batch)(*items)
        return type(batch)(items) if isinstance(batch, list) else tuple(items)
    return batch


def mirror_removals(small, held):
    """What the user's step took out of the state-making step's batch (`labels =
    batch.pop("labels")`, a Hugging Face compute_loss habit), taken out of the held batch too: in
    a full trial the step pops from the batch that is held (else the held batch keeps the
    labels: 2 MB of a 6 MB peak, and an answer of 559 where the plain loop fits 680). Mappings
    and lists, nested; a value the step replaced stays the held one (smaller or equal: a shortened
    trial must never hold more than the full one)."""
    if isinstance(small, Mapping) and isinstance(held, MutableMapping):
        for key in [k for k in held if k not in small]:
            del held[key]
        for key in small:
            if key in held:
                mirror_removals(small[key], held[key])
    elif isinstance(small, list) and isinstance(held, list) and len(small) < len(held):
        del held[len(small) :]  # popped from the end (a list's usual pop)


def same_mapping(example, items):
    """A mapping of example's kind holding `items`: a shallow copy of it refilled (keeps a
    tokenizer's BatchEncoding, a defaultdict's factory, an OrderedDict), else a plain dict for a
    read-only Mapping (issue 40 row 10)."""
    try:
        out = copy.copy(example)
        out.clear()
        out.update(items)
        return out
    except (AttributeError, TypeError):
        return dict(items)


def call_model(model, batch):
    """model(**batch) for a mapping (a dict, a tokenizer's BatchEncoding: as Hugging Face models
    take it), model(*batch) for a tuple or list, model(batch) for a tensor."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(*batch)
    return model(batch)
