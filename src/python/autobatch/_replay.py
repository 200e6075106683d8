"""The replayed peak of a measuring trial (docs/search.md, "The replayed peak"): its first step's
forward and backward on `state_batch` samples and its whole step's on the size's batch, logged by
the budget allocator event by event (_core.stop_allocation_log_events). Where both ran the same
allocations and releases in the same order, each allocation's bytes is read as affine in the
micro-batch (the two sizes give its bytes per sample), and the bytes held at each event, above
the whole step's start, are a line in the micro-batch; the whole step's start holds the batch
(its bytes per sample) and what does not scale with it. The forward and backward's peak at any
micro-batch is then the largest of those lines: the upper envelope this module returns, as
(intercept bytes, bytes per sample) pairs, for the search's guided strategy
(TrialResult::replayed_peak), which checks it against every full trial it measures.

Exact on a byte-counting allocator when every allocation's size is affine in the batch and the
order of the events does not change with it (linear layers, attention, convolutions whose
algorithm does not change with the batch); the strategy stops using it where a trial measures
otherwise.
"""
import torch

from . import _core


class EventLog:
    """One step's forward and backward, event by event, as a `with` block: on leaving it (also by
    an error: the recording is process-wide) appends `(events, *about)` to `into`."""

    def __init__(self, into, *about):
        self.into, self.about = into, about

    def __enter__(self):
        _core.start_allocation_log()
        return self

    def __exit__(self, *exc):
        events = _core.stop_allocation_log_events()
        if exc[0] is None:
            self.into.append((events, *self.about))
        return False


def peak_lines(first, first_size, second, second_size, start_bytes, batch_bytes, cap):
    """The upper envelope over micro-batches 1..cap of the lines `intercept + slope * B` that give
    the bytes held at each event of the step's forward and backward at micro-batch B, absolute:
    `start_bytes` held when the second log started at `second_size`, of which `batch_bytes` the
    batch's own (scaling with B). `first`, `second`: (bytes, freed) of the two logs
    (_core.stop_allocation_log_events). [] when the logs differ in anything but the sizes of
    their events (another count, order, or a release of an allocation of other bytes), or the
    sizes are equal."""
    bytes_1, freed_1 = first
    bytes_2, freed_2 = second
    if first_size == second_size or len(bytes_1) != len(bytes_2):
        return []
    b1 = torch.tensor(bytes_1, dtype=torch.float64)
    b2 = torch.tensor(bytes_2, dtype=torch.float64)
    if not torch.equal(b1 > 0, b2 > 0) or not _same_releases(b1, b2, freed_1, freed_2):
        return []
    per_sample = (b2 - b1) / float(second_size - first_size)
    intercepts = torch.cumsum(b2 - per_sample * second_size, 0)
    slopes = torch.cumsum(per_sample, 0)
    # The start itself (nothing allocated yet) is a point of the step too.
    intercepts = torch.cat([torch.zeros(1, dtype=torch.float64), intercepts])
    slopes = torch.cat([torch.zeros(1, dtype=torch.float64), slopes])
    batch_per_sample = batch_bytes / float(second_size)
    intercepts += start_bytes - batch_bytes
    slopes += batch_per_sample
    return upper_envelope(intercepts.tolist(), slopes.tolist(), 1, max(1, cap))


def _same_releases(b1, b2, freed_1, freed_2):
    """Whether each release frees, in both logs, an allocation of the same bytes at both sizes
    (the same line): two tensors of one size freed in the other order (seen in autograd's
    releases, from run to run) release the same bytes either way."""
    f1 = torch.tensor(freed_1, dtype=torch.int64)
    f2 = torch.tensor(freed_2, dtype=torch.int64)
    other = f1 != f2
    if not bool(other.any()):
        return True
    i, j = f1[other], f2[other]
    if bool((i < 0).any()) or bool((j < 0).any()):
        return False  # one log releases what it made, the other something made before it
    return torch.equal(b1[i], b1[j]) and torch.equal(b2[i], b2[j])


def upper_envelope(intercepts, slopes, low, high):
    """The lines (intercept, slope) that are the largest at some x in [low, high], in order of
    slope (the rest never set the maximum there)."""
    best = {}
    for a, s in zip(intercepts, slopes):
        if s not in best or a > best[s]:
            best[s] = a
    lines = sorted((s, a) for s, a in best.items())
    hull = []  # (slope, intercept); each one's maximum starts where the previous one's ends

    def crossing(first, second):  # x where `second` (the steeper) overtakes `first`
        return (first[1] - second[1]) / (second[0] - first[0])

    for line in lines:
        while hull:
            if crossing(hull[-1], line) <= low:
                hull.pop()  # the new, steeper line is above it over the whole range
            elif len(hull) >= 2 and crossing(hull[-2], line) <= crossing(hull[-2], hull[-1]):
                hull.pop()
            else:
                break
        if not hull or crossing(hull[-1], line) < high:
            hull.append(line)
    return [(a, s) for s, a in hull]
