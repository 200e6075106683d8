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
    if first_size == second_size or len(first[0]) != len(second[0]):
        return []
    if first[1] != second[1] or any((x > 0) != (y > 0) for x, y in zip(first[0], second[0])):
        aligned = aligned_logs(first, second)
        if aligned is None:
            return []
        first, second = aligned
    bytes_1, freed_1 = first
    bytes_2, freed_2 = second
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


def aligned_logs(first, second, window=512):
    """The two logs with each stretch where their events differ in order merged, in both, into
    one allocation (the stretch's allocations' bytes summed) and one release (its releases'):
    ((bytes, freed), (bytes, freed)) of equal lengths, or None where a stretch of at most `window`
    events cannot be found that holds the same work in both (as many allocations, releases of the
    same allocations before it, of ones made inside it and of ones made before the log).

    The stretches are the allocations of intra-op worker threads: on 2 threads a ViT's layer norm
    backward allocates 20 bytes on each, and from run to run (most often on a loaded machine) one
    log reads +20 -20 +20 -20 where the other reads +20 +20 -20 -20. The bytes held at the merged
    allocation are the stretch's largest in any order of its events (all its allocations before
    its releases), so the replay reads such a stretch at its worst, within the stretch's
    releases' bytes of what a run held."""
    bytes_1, freed_1 = first
    bytes_2, freed_2 = second
    n = len(bytes_1)
    out_1, out_2 = ([], []), ([], [])
    at_1, at_2 = [-1] * n, [-1] * n  # an event's index in the merged logs

    def target(freed, at, k):
        return at[freed[k]] if freed[k] >= 0 else -1

    def append(k, t_1, t_2):
        for out, at, b, t in ((out_1, at_1, bytes_1[k], t_1), (out_2, at_2, bytes_2[k], t_2)):
            at[k] = len(out[0])
            out[0].append(b)
            out[1].append(t)

    k = 0
    while k < n:
        x, y = bytes_1[k], bytes_2[k]
        if x > 0 and y > 0:
            append(k, -1, -1)
            k += 1
            continue
        if x < 0 and y < 0:
            t_1, t_2 = target(freed_1, at_1, k), target(freed_2, at_2, k)
            if t_1 == t_2 or (t_1 >= 0 and t_2 >= 0 and out_1[0][t_1] == out_1[0][t_2]
                              and out_2[0][t_1] == out_2[0][t_2]):
                append(k, t_1, t_2)  # the same release, or one of two equal tensors
                k += 1
                continue
        end = _stretch_end(bytes_1, freed_1, at_1, bytes_2, freed_2, at_2, k, window)
        if end is None:
            return None
        for out, at, b in ((out_1, at_1, bytes_1), (out_2, at_2, bytes_2)):
            made = len(out[0])
            out[0].extend([sum(v for v in b[k:end] if v > 0), sum(v for v in b[k:end] if v < 0)])
            out[1].extend([-1, -1])
            for j in range(k, end):
                at[j] = made  # later releases of the stretch's allocations free the merged one
        k = end
    return out_1, out_2


def _stretch_end(bytes_1, freed_1, at_1, bytes_2, freed_2, at_2, start, window):
    """The least end after `start` where both logs' events in [start, end) are the same work
    (aligned_logs), or None within `window` events."""
    balance = {}  # release key -> count in the first log less count in the second
    made = 0  # allocations in the first log less in the second
    for end in range(start + 1, min(len(bytes_1), start + window) + 1):
        j = end - 1
        for b, freed, at, sign in ((bytes_1, freed_1, at_1, 1), (bytes_2, freed_2, at_2, -1)):
            if b[j] > 0:
                made += sign
                continue
            f = freed[j]
            key = "inside" if f >= start else (at[f] if f >= 0 else -1)
            balance[key] = balance.get(key, 0) + sign
            if balance[key] == 0:
                del balance[key]
        if made == 0 and not balance:
            return end
    return None


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
