"""Trial batches from the job's own DataLoader (find(model, loader), check_batch, soak): the
costliest samples of the data the job trains on, collated by the loader's own collate_fn, in
place of one example batch whose rows are repeated.

The rule. A sample's cost is the number of elements of collate_fn([sample]) (or the dataset's
`lengths`, read without loading a sample). What a batch of B samples costs depends on how the
collator builds it:

- it stacks them (torch's default_collate on equal shapes, or a collator that pads to the
  batch's longest, `pad_to_multiple_of` included): every row of a batch is as large as its
  largest sample, so the costliest batch of any B is B rows padded to the largest sample of the
  data (to the largest of each dimension where several vary: images of varying height and width,
  the samples on the Pareto front of the shapes are collated together). The trial batch at B is
  made from collate_fn of those samples by repeating its rows (_batches.make_batch), and the
  search's affine model of memory against B holds as for an example batch;
- it concatenates them (packing into one row, graphs whose nodes are summed): a batch is the sum
  of its samples, so the costliest batch of B samples is collate_fn of the B costliest. Each
  trial collates them anew; memory is then not affine in B, which the result's warnings say:
  the answer is still the largest size a trial verified.

Where the samples come from: a map-style dataset's every index the loader's sampler yields (all
of them for torch's SequentialSampler and RandomSampler, without drawing from the RNG), read
in this process (no worker processes); an IterableDataset's first `loader_batches` batches only,
reported as "the first N batches", never as the epoch. A loader with its own batch_sampler
(buckets, a max-tokens sampler) is enumerated, its index batches without loading data, under a
forked RNG; the samples are those it yields, and its costliest batch is reported beside the
answer."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from ._batches import leading_size, same_mapping
from ._errors import UsageError
from ._state import example_tensors

# An IterableDataset's loader is read this many batches deep by default (loader_batches=).
DEFAULT_LOADER_BATCHES = 64
_INT64_MAX = 2**63 - 1
# At most this many samples are collated into the example whose rows the stacked trials repeat.
_EXAMPLE_ROWS = 8


def is_loader(obj: Any) -> bool:
    """Whether `obj` is a torch DataLoader (a subclass included: Lightning's, accelerate's)."""
    return isinstance(obj, DataLoader)


@dataclass
class LoaderBatches:
    """How the trials' batches are made from a loader (what `Result.data` reports).

    Attributes:
        example: the batch the session checks, fingerprints and (for a stacking collator) repeats:
            collate_fn of the costliest samples, padded to the largest.
        collation (str): "stacks" (rows of equal size: padded or fixed) or "concatenates".
        samples (int): the samples scanned.
        scope (str): "the epoch" (a map-style dataset) or "the first N batches".
        binding (dict[str, list[int]]): each tensor's shape for one row of the trial batch, by
            its path in the batch ("input_ids", "[0]"): for a stacking collator the costliest
            samples padded together (the largest of each dimension), for a concatenating one
            the costliest sample collated alone (batch dimension 1).
        dataset_size (int | None): the samples one epoch has (None for an IterableDataset).
        sampler_batches (dict | None): with the loader's own batch_sampler: its batches'
            count, the largest batch's samples, the costliest batch's samples and shapes.
        seconds (float): the scan's time.
    """

    example: Any
    collation: str
    samples: int
    scope: str
    binding: dict
    dataset_size: int | None
    sampler_batches: dict | None
    seconds: float
    _collate: Callable[[list], Any] = field(repr=False, default=None)
    _read: Callable[[list], list] = field(repr=False, default=None)
    _costliest: list = field(repr=False, default_factory=list)

    def make(self, size: int, device: torch.device) -> Any:
        """The trial batch of `size` samples for a concatenating collator: collate_fn of the
        `size` costliest samples (cycled when the data has fewer), on `device`. A map-style
        dataset's samples are read anew (dataset[i]) for each batch, as the job's loader reads
        them, an IterableDataset's from the start of the stream: held between trials, every
        sample would count as memory held outside the model."""
        n = len(self._costliest)
        samples = self._read([self._costliest[i % n] for i in range(size)])
        return _to(self._collate(samples), device)

    def report(self) -> dict:
        """The JSON-able summary (Result.data)."""
        return {
            "collation": self.collation,
            "samples_scanned": self.samples,
            "scope": self.scope,
            "binding_shape": self.binding,
            "dataset_size": self.dataset_size,
            "sampler_batches": self.sampler_batches,
            "scan_seconds": round(self.seconds, 3),
        }

    def note(self) -> str:
        """The result's warning line: where the trial batches came from and what bound them."""
        shapes = ", ".join(f"{k} {v}" for k, v in self.binding.items())
        if self.collation == "stacks":
            how = (
                "the trial batch at micro-batch B is B rows as large as the costliest samples "
                f"padded together ({shapes})"
            )
        else:
            how = (
                "the collate_fn concatenates samples, so the trial batch at B is collate_fn of "
                f"the B costliest samples (the costliest alone: {shapes}); memory is then a sum "
                "over the samples, not affine in B, and the answer is the largest size a trial "
                "verified"
            )
        line = f"sized on the DataLoader's data ({self.samples} samples of {self.scope}): {how}"
        if self.sampler_batches:
            s = self.sampler_batches
            line += (
                f"; its batch_sampler builds {s['batches']} batches, the largest of "
                f"{s['largest_samples']} samples, the costliest "
                + ", ".join(f"{k} {v}" for k, v in s["costliest_shape"].items())
            )
        return line


def loader_batches(loader: DataLoader, batches: int | None = None) -> LoaderBatches:
    """Scans `loader`'s data for the costliest samples (the module's rule).

    Args:
        loader (DataLoader): the job's loader; it batches (batch_size or batch_sampler set).
        batches (int | None): the batches to read, >= 1: an IterableDataset's first (default
            DEFAULT_LOADER_BATCHES), a map-style dataset's first in its sampler's order
            (default None: every sample the epoch visits).

    Returns:
        LoaderBatches.

    Raises:
        UsageError: a loader that does not batch, an empty dataset, a sample that collates to no
            tensor with a batch dimension, or a collate_fn that fails on the samples.

    Side effects: reads the dataset's samples in this process (dataset[i], or the iterable's
    first samples); a custom sampler or batch_sampler is iterated with the RNG forked (the job's
    random state is left as it was).
    """
    t0 = time.perf_counter()
    if batches is not None and (
        isinstance(batches, bool) or not isinstance(batches, int) or batches < 1
    ):
        raise UsageError(
            f"loader_batches: expected an int >= 1 (the loader's first batches to read for its "
            f"costliest samples), but got {batches!r}"
        )
    if loader.batch_sampler is None:
        raise UsageError(
            "example_batch: the DataLoader does not batch (batch_size=None: each item is "
            "already a batch); expected a loader built with batch_size= or batch_sampler=, or "
            "pass one of its batches as the example"
        )
    collate, dataset = loader.collate_fn, loader.dataset
    samples, costs, indices, order, scope, sampler_batches = _read_samples(loader, batches)
    dataset_size = _epoch_samples(loader, indices, scope)
    if not samples:
        raise UsageError(
            "example_batch: the DataLoader yields no sample to size on (an empty dataset, or a "
            "sampler that yields no index)"
        )
    singles = [_collated(collate, [s]) for s in samples]
    numel = [_elements(c) for c in singles]
    ranked = sorted(range(len(samples)), key=lambda k: -numel[k])
    collation = _collation(collate, samples, singles, ranked)
    if sampler_batches is not None:
        sampler_batches = _sampler_summary(
            sampler_batches, indices, costs, numel, samples, dataset, collate
        )
    top = ranked[0]
    binding = {path: list(t.shape) for path, t in tensors_of(singles[top])}
    if collation == "stacks":
        rows = _front(singles, ranked)
        example = _collated(collate, [samples[k] for k in rows])
        # One row of the padded example: the largest of each dimension over the front.
        binding = {
            path: [1, *t.shape[1:]] if t.dim() and t.shape[0] == len(rows) else list(t.shape)
            for path, t in tensors_of(example)
        }
        costliest = []
    else:
        example = singles[top]
        costliest = ranked
    return LoaderBatches(
        example=example,
        collation=collation,
        samples=len(samples) if costs is None else dataset_size,
        scope=scope,
        binding=binding,
        dataset_size=dataset_size,
        sampler_batches=sampler_batches,
        seconds=time.perf_counter() - t0,
        _collate=collate,
        _read=_reader(dataset, len(samples), indices, order),
        _costliest=costliest,
    )


def _read_samples(loader, batches):
    """(samples, costs, indices, order, scope, the batch_sampler's index batches) of the loader:
    an IterableDataset's first `batches` batches of samples (costs, indices and order None); a
    map-style dataset's every sample at the indices its sampler yields (costs None), or, where
    the dataset has `lengths`, those lengths as costs and only the costliest samples loaded, in
    `order` (positions into indices)."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        n = batches or DEFAULT_LOADER_BATCHES
        per_batch = loader.batch_size or 1
        samples = list(itertools.islice(iter(dataset), n * per_batch + 1))
        if len(samples) > n * per_batch:
            samples.pop()
            scope = f"the first {n} batches of the IterableDataset (not the epoch)"
        else:
            read = -(-len(samples) // per_batch)
            scope = f"the IterableDataset's {read} batches (it ended: the whole stream)"
        return samples, None, None, None, scope, None
    indices, index_batches = _indices(loader, batches)
    scope = "the epoch"
    if batches is not None and batches < _batches_per_epoch(loader):
        scope = f"the first {batches} batches the sampler draws (not the epoch)"
    costs = _lengths(dataset, indices)
    if costs is None:
        return [_item(dataset, i) for i in indices], None, indices, None, scope, index_batches
    # only the costliest samples are loaded
    order = sorted(range(len(indices)), key=lambda k: -costs[k])[: _EXAMPLE_ROWS * 64]
    samples = [_item(dataset, indices[k]) for k in order]
    return samples, costs, indices, order, scope, index_batches


def _reader(dataset, n, indices, order):
    """read(positions) -> the samples at those positions of the scanned ones (positions may
    repeat): from a map-style dataset by index (indices[k], or indices[order[k]] where only the
    costliest were loaded by their lengths), or the first `n` samples of an IterableDataset read
    again and the others let go."""
    if indices is None:

        def read(positions):
            first = list(itertools.islice(iter(dataset), n))
            return [first[k] for k in positions]

        return read
    at = indices if order is None else [indices[k] for k in order]
    return lambda positions: [_item(dataset, at[k]) for k in positions]


def consecutive(loader: DataLoader, size: int) -> Callable[[torch.device], Any]:
    """The loader's batches of `size` samples in its sampler's order, collated in this process
    (no worker processes: their shared-memory batches would sit outside the memory budget), one
    per call, from the start again after the last: the soak's batches. A map-style dataset's
    indices come from the sampler (its RNG forked: the job's random state is left as it was); an
    IterableDataset is read as a stream."""
    dataset, collate = loader.dataset, loader.collate_fn
    if isinstance(dataset, IterableDataset):

        def stream():
            while True:
                it = iter(dataset)
                chunk = list(itertools.islice(it, size))
                if not chunk:
                    raise UsageError("example_batch: the IterableDataset yielded no sample")
                while chunk:
                    yield chunk
                    chunk = list(itertools.islice(it, size))

    else:

        def stream():
            while True:  # an epoch's order, drawn anew each epoch as the loader draws it
                order = _epoch_order(loader)
                if not order:
                    raise UsageError("example_batch: the DataLoader's sampler yielded no index")
                for start in range(0, len(order), size):
                    yield [_item(dataset, i) for i in order[start : start + size]]

    chunks = stream()
    return lambda device: _to(_collated(collate, next(chunks)), device)


def _epoch_order(loader):
    """The indices of one epoch in the order the loader visits them: its batch_sampler's batches
    (a shuffling sampler's order, a bucketing sampler's buckets) one after the other, drawn with
    the RNG forked (the job's random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        return [i for b in loader.batch_sampler for i in b]


def _item(dataset, index):
    """dataset[index]; an error the dataset raises is the user's, named as such (UsageError)."""
    try:
        return dataset[index]
    except Exception as e:  # the user's __getitem__: any error is theirs
        raise UsageError(
            f"example_batch: the DataLoader's dataset failed on sample {index} "
            f"({type(e).__name__}: {e}); autobatch reads the samples with dataset[i] as the "
            "loader does: fix the dataset, or bound the scan with loader_batches="
        ) from e


def _indices(loader, batches=None):
    """The map-style dataset's indices one epoch visits (with `batches`, those of the first
    `batches` batches the sampler draws), and the batch_sampler's index batches when the loader
    has its own (else None). The sampler is iterated with the RNG forked (the job's random
    state is left as it was); torch's SequentialSampler and RandomSampler visit every index,
    which is known without drawing."""
    bs = loader.batch_sampler
    n = len(loader.dataset)
    plain = type(bs) is BatchSampler
    if plain and batches is None and type(bs.sampler) in (SequentialSampler, RandomSampler):
        return list(range(n)), None  # (with replacement too: any sample may be drawn)
    with torch.random.fork_rng(devices=[]):
        index_batches = [list(b) for b in itertools.islice(iter(bs), batches)]
    indices = sorted({i for b in index_batches for i in b})
    return indices, None if plain else index_batches


def _batches_per_epoch(loader):
    """len(loader), or a count above any asked for when its batch_sampler has no length."""
    try:
        return len(loader)
    except TypeError:
        return _INT64_MAX


def _epoch_samples(loader, indices, scope):
    """The samples one epoch has (the micro-batch's bound): those scanned when the scan was the
    epoch, else the sampler's length (None for an IterableDataset or a batch_sampler of its own
    read in part)."""
    if indices is None:
        return None
    if scope == "the epoch":
        return len(indices)
    if type(loader.batch_sampler) is BatchSampler:
        return len(loader.sampler)
    return None


def _lengths(dataset, indices):
    """The dataset's own per-sample lengths (`dataset.lengths`, one int per sample), read at
    `indices`, or None when it has none (each sample is then collated to be measured)."""
    lengths = getattr(dataset, "lengths", None)
    if lengths is None:
        return None
    try:
        if len(lengths) == len(dataset):
            return [int(lengths[i]) for i in indices]
    except (TypeError, ValueError, IndexError):
        pass
    raise UsageError(
        f"example_batch: the DataLoader's dataset has a `lengths` attribute that is not one int "
        f"per sample ({len(dataset)} samples; got {type(lengths).__name__} "
        f"{str(lengths)[:60]}); expected lengths[i], the cost of sample i, for every i, or no "
        "`lengths` (each sample is then read to be measured)"
    )


def _collated(collate, samples):
    try:
        return collate(samples)
    except Exception as e:  # the user's collate_fn: any error is theirs, named as such
        raise UsageError(
            f"example_batch: the DataLoader's collate_fn failed on a list of {len(samples)} "
            f"of its samples ({type(e).__name__}: {e}); expected collate_fn(list of samples) -> "
            "batch, and where samples differ in shape a collate_fn that pads (or concatenates) "
            "them"
        ) from e


def tensors_of(x):
    """[(path, tensor)] of each tensor in a collated batch, in order (_state.example_tensors), the
    paths as the report writes them: `input_ids`, `[0]`, `pixel_values.low`, `batch` for a bare
    tensor."""
    return [(p or "batch", t) for p, t in example_tensors(x, "", _dotted)]


def _dotted(path, key):
    return f"{path}.{key}" if path else str(key)


def _elements(batch):
    n = sum(t.numel() for _, t in tensors_of(batch))
    if leading_size(batch) is None:
        raise UsageError(
            "example_batch: the DataLoader's collate_fn made a batch with no tensor of a "
            "batch dimension; expected tensors, or tuples, lists or mappings of tensors"
        )
    return n


def _collation(collate, samples, singles, ranked):
    """ "stacks" when collate_fn of two samples puts them on a new leading dimension of 2 (each
    tensor of one sample collated alone leads with 1), else "concatenates"."""
    a, b = ranked[0], ranked[-1]
    pair = _collated(collate, [samples[a], samples[b]]) if a != b else None
    one = dict(tensors_of(singles[a]))
    if pair is None:
        return (
            "stacks"
            if all(t.dim() > 0 and t.shape[0] == 1 for t in one.values())
            else ("concatenates")
        )
    two = dict(tensors_of(pair))
    for path, t in one.items():
        u = two.get(path)
        if u is None or t.dim() == 0:
            continue
        if t.shape[0] == 1 and u.shape[0] == 2:
            continue
        if t.shape[0] == u.shape[0] and t.shape == u.shape:
            continue  # a tensor the collator passes unchanged (a shared table)
        return "concatenates"
    return "stacks"


def _front(singles, ranked):
    """The samples whose collated shapes are on the Pareto front (no other sample is at least as
    large in every dimension of every tensor), the costliest first, at most _EXAMPLE_ROWS:
    collated together they are padded to the largest of each dimension."""

    front, shapes = [], set()  # shapes: every distinct one seen (those of the front included)
    kept = []  # the front's shapes
    for k in ranked:
        s = tuple(d for _, t in tensors_of(singles[k]) for d in t.shape)
        if s in shapes:
            continue
        shapes.add(s)
        if any(len(f) == len(s) and all(x >= y for x, y in zip(f, s)) for f in kept):
            continue
        front.append(k)
        kept.append(s)
        if len(front) == _EXAMPLE_ROWS:
            break
    return front


def _sampler_summary(index_batches, indices, costs, numel, samples, dataset, collate):
    """The batch_sampler's batches: how many, the largest, and the costliest (its samples' count
    times its costliest sample's cost: the dataset's lengths where it has them, else the
    elements collated alone; a padded batch's size), with its shapes collated."""
    cost_of = dict(zip(indices, costs if costs is not None else numel))

    def cost(b):
        return len(b) * max(cost_of[i] for i in b)

    worst = max(index_batches, key=cost)
    shape = {
        p: list(t.shape)
        for p, t in tensors_of(_collated(collate, [_item(dataset, i) for i in worst]))
    }
    return {
        "batches": len(index_batches),
        "largest_samples": max(len(b) for b in index_batches),
        "costliest_samples": len(worst),
        "costliest_shape": shape,
    }


def _to(batch, device):
    """The collated batch on `device`: its tensors moved, mappings of the collator's kind kept
    (_batches.same_mapping), named tuples rebuilt."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return same_mapping(batch, {k: _to(v, device) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_to(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch
