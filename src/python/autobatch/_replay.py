"""The replayed peak of a measuring trial (docs/search.md, "The replayed peak"): its first step's
forward and backward on `state_batch` samples and its whole step's on the size's batch, logged by
the budget allocator event by event (_budget.stop_allocation_log_events). Where both ran the same
allocations and releases in the same order (up to what aligned_logs lines up: a stretch in
another order, a transient one log makes and the other not), each allocation's bytes is read as
affine in the micro-batch (the two sizes give its bytes per sample), and the bytes held at each
event, above the whole step's start, are a line in the micro-batch; the whole step's start holds
the batch (its bytes per sample) and what does not scale with it. The forward and backward's peak
at any micro-batch is then the largest of those lines: the upper envelope this module returns, as
(intercept bytes, bytes per sample) pairs, for the search's guided strategy
(TrialResult::replayed_peak), which checks it against every full trial it measures.

Exact on a byte-counting allocator when every allocation's size is affine in the batch and the
order of the events does not change with it (linear layers, attention, convolutions whose
algorithm does not change with the batch); the strategy stops using it where a trial measures
otherwise.
"""

import torch

from . import _budget


class EventLog:
    """One step's forward and backward, event by event, as a `with` block: on leaving it (also by
    an error: the recording is process-wide) appends `(events, *about)` to `into`."""

    def __init__(self, into, *about):
        self.into, self.about = into, about

    def __enter__(self):
        _budget.start_allocation_log()
        return self

    def __exit__(self, *exc):
        events = _budget.stop_allocation_log_events()
        if exc[0] is None:
            self.into.append((events, *self.about))
        return False


def peak_lines(first, first_size, second, second_size, start_bytes, batch_bytes, cap):
    """The upper envelope over micro-batches 1..cap of the lines `intercept + slope * B` that give
    the bytes held at each event of the step's forward and backward at micro-batch B, absolute:
    `start_bytes` held when the second log started at `second_size`, of which `batch_bytes` the
    batch's own (scaling with B). `first`, `second`: (bytes, freed) of the two logs
    (_budget.stop_allocation_log_events). [] when aligned_logs cannot line the two logs up (other
    work, not only other sizes), or the sizes are equal."""
    if first_size == second_size:
        return []
    aligned = aligned_logs(first, second)
    if aligned is None:
        return []
    bytes_1, bytes_2 = aligned
    b1 = torch.tensor(bytes_1, dtype=torch.float64)
    b2 = torch.tensor(bytes_2, dtype=torch.float64)
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
    """The two logs' bytes lined up event by event: two lists of equal lengths, or None where they
    cannot be. Lined up as the same event: two allocations at the same place
    (their bytes are what the replay reads as affine in the batch, so nothing checks them), two
    releases freeing the same allocation, or allocations of the same bytes at both sizes, or
    both freeing one made before the log. The logs as they are when they already line up so;
    otherwise two kinds of difference are lined up, the only ones seen in the race's models
    (docs/search.md, "The replayed peak"):

    - **A stretch in another order**: intra-op worker threads allocate too (ViT-B/16's layer norm
      backward on 2 threads, 20 bytes on each), and from run to run one log reads
      +20 -20 +20 -20 where the other reads +20 +20 -20 -20. The stretch, from the first event
      that differs to the least end (at most `window` events) where both logs have made as many
      allocations, freed as many of them, and freed the same allocations made before the
      stretch (by count where made before the log), is merged in both into one allocation (its
      allocations' bytes summed) and one release: the bytes held there are at or above what any
      order of the stretch holds (all its allocations before its releases): for per-thread
      scratch a few bytes more than a run held.
    - **A transient in one log only**: an allocation freed by the next event (a kernel's
      scratch), which a kernel makes at one size and not at the other (ResNet-50's convolutions
      and batch norms on the CPU: 9 more at batch 4 than at 2, none of them at the peak). It is
      lined up with an allocation and a release of 0 bytes in the other log: its bytes read as
      scaling from 0 at the size without it, which reads it low at batches below the size with
      it, and wherever the kernel makes it at the other size too.

    Logs of one length are lined up with stretches first (a transient only where no stretch
    closes), logs of other lengths with transients first (where the log goes on as the other
    after it); then the other way round if that finds no line-up. Each is a heuristic that can
    line up other work (two transients of other bytes that trade places read as two that grow
    or shrink with the batch; a stretch whose allocations are other tensors in each log): a
    wrong line-up makes a wrong replay, too high or too low, which the search's check against
    its trials drops (SearchReplayTest.AReplayTheTrialsContradictIsDropped) at the cost of a
    trial or two; exactness never rests on it."""
    bytes_1, freed_1 = first
    bytes_2, freed_2 = second
    if (
        len(bytes_1) == len(bytes_2)
        and freed_1 == freed_2
        and all((x > 0) == (y > 0) for x, y in zip(bytes_1, bytes_2))
    ):
        return bytes_1, bytes_2
    # Logs of one length are most likely the same events in another order: stretches first.
    # Of other lengths, a transient that one log makes and the other not.
    transients_first = len(bytes_1) != len(bytes_2)
    lined_up = _line_up(first, second, window, transients_first)
    return (
        lined_up if lined_up is not None else _line_up(first, second, window, not transients_first)
    )


def _line_up(first, second, window, transients_first):
    """aligned_logs, a transient in one log taken before a stretch where the log goes on as the
    other after it (`transients_first`), or only where no stretch closes."""
    bytes_1, freed_1 = first
    bytes_2, freed_2 = second
    n_1, n_2 = len(bytes_1), len(bytes_2)
    out_1, out_2 = [], []  # the lined-up bytes
    at_1, at_2 = [-1] * n_1, [-1] * n_2  # an event's index in the lined-up logs

    def target(freed, at, k):
        return at[freed[k]] if freed[k] >= 0 else -1

    def same(i, j):  # the same event, as far as the lined-up logs so far tell
        x, y = bytes_1[i], bytes_2[j]
        if (x > 0) != (y > 0):
            return False
        if x > 0:
            return True
        t_1, t_2 = target(freed_1, at_1, i), target(freed_2, at_2, j)
        return t_1 == t_2 or (
            t_1 >= 0 and t_2 >= 0 and out_1[t_1] == out_1[t_2] and out_2[t_1] == out_2[t_2]
        )

    def put(out, at, k, b):
        at[k] = len(out)
        out.append(b[k])

    def transient(b, freed, k):
        return k + 1 < len(b) and b[k] > 0 and b[k + 1] < 0 and freed[k + 1] == k

    def alone(out, at, k, b, other):  # a transient in one log; 0 bytes in the other
        at[k], at[k + 1] = len(out), len(out) + 1
        out.extend([b[k], b[k + 1]])
        other.extend([0, 0])

    i = j = 0
    while i < n_1 and j < n_2:
        if same(i, j):
            put(out_1, at_1, i, bytes_1)
            put(out_2, at_2, j, bytes_2)
            i, j = i + 1, j + 1
            continue
        one = transient(bytes_1, freed_1, i) and not transient(bytes_2, freed_2, j)
        other = transient(bytes_2, freed_2, j) and not transient(bytes_1, freed_1, i)
        if transients_first and one and i + 2 < n_1 and same(i + 2, j):  # then goes on as the other
            alone(out_1, at_1, i, bytes_1, out_2)
            i += 2
            continue
        if transients_first and other and j + 2 < n_2 and same(i, j + 2):
            alone(out_2, at_2, j, bytes_2, out_1)
            j += 2
            continue
        length = _stretch(bytes_1, freed_1, i, bytes_2, freed_2, j, at_1, at_2, window)
        if length:
            for out, at, b, k in ((out_1, at_1, bytes_1, i), (out_2, at_2, bytes_2, j)):
                made = len(out)
                out.extend(
                    [
                        sum(v for v in b[k : k + length] if v > 0),
                        sum(v for v in b[k : k + length] if v < 0),
                    ]
                )
                for e in range(k, k + length):
                    at[e] = made  # later releases of its allocations free the merged one
            i, j = i + length, j + length
        elif one:
            alone(out_1, at_1, i, bytes_1, out_2)
            i += 2
        elif other:
            alone(out_2, at_2, j, bytes_2, out_1)
            j += 2
        else:
            return None
    while i < n_1 and transient(bytes_1, freed_1, i):
        alone(out_1, at_1, i, bytes_1, out_2)
        i += 2
    while j < n_2 and transient(bytes_2, freed_2, j):
        alone(out_2, at_2, j, bytes_2, out_1)
        j += 2
    if i < n_1 or j < n_2:
        return None
    return out_1, out_2


def _stretch(bytes_1, freed_1, i, bytes_2, freed_2, j, at_1, at_2, window):
    """The least length of a stretch from event i of the first log and j of the second holding the
    same work in both (aligned_logs), or 0 within `window` events."""
    balance = {}  # release key -> count in the first log less count in the second
    made = 0  # allocations in the first log less in the second
    for length in range(1, min(len(bytes_1) - i, len(bytes_2) - j, window) + 1):
        for b, freed, at, start, sign in (
            (bytes_1, freed_1, at_1, i, 1),
            (bytes_2, freed_2, at_2, j, -1),
        ):
            e = start + length - 1
            if b[e] > 0:
                made += sign
                continue
            f = freed[e]
            key = "inside" if f >= start else (at[f] if f >= 0 else -1)
            balance[key] = balance.get(key, 0) + sign
            if balance[key] == 0:
                del balance[key]
        if made == 0 and not balance:
            return length
    return 0


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
