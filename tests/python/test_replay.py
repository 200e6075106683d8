"""The replayed peak (docs/search.md, "The replayed peak"; src/python/autobatch/_replay.py): a
measuring trial's forward and backward, logged event by event by the budget allocator at its first
step's size and its whole step's, give the bytes held at each event as a line in the batch; the
largest of those lines is the forward and backward's peak at any batch, which the guided search
takes in place of its secants. Each test names the wrong implementation it catches."""
import random

import pytest
import torch

import autobatch
from autobatch import _measuring
from autobatch._replay import aligned_logs, peak_lines, upper_envelope
from autobatch._state import ModelState
from autobatch._meter import Meter
from autobatch._trial import EagerProbe, leading_size

GiB = 1 << 30


# Catches an envelope that drops a line which is the largest somewhere in the range (the pop rule
# turned around, equal slopes kept by the smaller intercept, a line dropped for crossing beyond the
# range's low end when it is the largest at it): the envelope's largest line must be the largest of
# all lines at every batch of the range.
def test_the_envelope_is_the_largest_line_at_every_batch():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        intercepts = [rng.uniform(-1e6, 1e6) for _ in range(n)]
        slopes = [rng.choice([0.0, 10.0, 100.0, rng.uniform(-50.0, 500.0)]) for _ in range(n)]
        hull = upper_envelope(intercepts, slopes, 1, 3000)
        assert hull and len(hull) <= n
        for x in range(1, 3001, 7):
            want = max(a + s * x for a, s in zip(intercepts, slopes))
            got = max(a + s * x for a, s in hull)
            assert got == pytest.approx(want, rel=1e-12, abs=1e-6), (x, intercepts, slopes)


# Catches a replay made from logs of different work: another count of events, an allocation where
# the other log releases (and never one that balances it), a release of one made before the log
# where the other releases its own, or two logs at one size (no slope); and one that refuses two
# releases of equal tensors in the other order (autograd frees a node's saved tensors so from run
# to run: a TransformerEncoderLayer's replay came and went with it). Two releases in the other
# order, of tensors of other bytes, are one stretch (aligned_logs): the held bytes between them
# depend on the order, the peak before them does not.
def test_logs_that_differ_in_anything_but_their_sizes_give_no_replay():
    base = ([100, 200, -100, -200], [-1, -1, 0, 1])
    assert peak_lines(base, 2, ([200, 400, -200, -400], [-1, -1, 0, 1]), 4, 0, 0, 100)
    assert peak_lines(base, 2, ([200, 400, -200], [-1, -1, 0]), 4, 0, 0, 100) == []
    assert peak_lines(base, 2, ([200, -400, -200, -400], [-1, -1, 0, 1]), 4, 0, 0, 100) == []
    assert peak_lines(base, 2, ([200, 400, -200, -400], [-1, -1, -1, 1]), 4, 0, 0, 100) == []
    assert peak_lines(base, 2, base, 2, 0, 0, 100) == []
    # held at B: 50 B, 150 B, then 100 B or 50 B by the order, then 0: the largest 150 B
    assert peak_lines(base, 2, ([200, 400, -400, -200], [-1, -1, 1, 0]), 4, 0, 0, 100) == [
        (0.0, 150.0)]
    equal = ([32, 32, 100, -32, -32], [-1, -1, -1, 0, 1])
    swapped = ([32, 32, 300, -32, -32], [-1, -1, -1, 1, 0])
    # held after each event at B: 32, 64, 64 + 50 B, 32 + 50 B, 50 B: the largest 64 + 50 B
    assert peak_lines(equal, 2, swapped, 6, 0, 0, 100) == [(64.0, 50.0)]


# Catches a replay lost to the order of intra-op worker threads' allocations (ViT-B/16's layer
# norm backward on 2 threads allocates 20 bytes on each; logged in the race, where 12 of 12
# measuring trials at 4 on a loaded machine read them in the other order than at 2, and the
# search went without the replay), and one that reads such a stretch in either log's order
# rather than at its worst: 15360 B + 400 + 20 + 20, where the first log alone reads 15360 B + 420.
# Also one that merges a stretch longer than its window.
def test_worker_threads_allocations_in_another_order_are_read_at_their_worst():
    first = ([30720, 400, 20, -20, 20, -20, -400, -30720], [-1, -1, -1, 2, -1, 4, 1, 0])
    second = ([61440, 400, 20, 20, -20, -20, -400, -61440], [-1, -1, -1, -1, 3, 2, 1, 0])
    assert peak_lines(first, 2, second, 4, 0, 0, 1000) == [(440.0, 15360.0)]
    assert peak_lines(second, 4, first, 2, 0, 0, 1000) == [(440.0, 15360.0)]
    # The stretch starts at the first event that differs (the second 20 bytes' release where the
    # other log allocates) and ends where both have made and freed the same: 3 events.
    assert aligned_logs(first, second) == ([30720, 400, 20, 20, -40, -400, -30720],
                                           [61440, 400, 20, 20, -40, -400, -61440])
    # Where no stretch closes within the window, the two 20-byte transients are read as one in
    # each log only (aligned_logs' second kind): each lined up with 0 bytes in the other.
    assert aligned_logs(first, second, window=2) == (
        [30720, 400, 20, 0, 0, -20, 20, -20, -400, -30720],
        [61440, 400, 20, 20, -20, -20, 0, 0, -400, -61440])
    # A transient in one log at its end, and one in the shorter log; an allocation in one log
    # only that the next event does not free is no transient: no line-up.
    # A transient's bytes read as scaling from 0 at the size that lacks it: 64 bytes at 4 over
    # 50 B held is the line through (2, 100) and (4, 264); 8 bytes at 2 the line through
    # (2, 108) and (4, 200).
    short = ([100, -100], [-1, 0])
    assert peak_lines(short, 2, ([200, 64, -64, -200, 8, -8], [-1, -1, 1, 0, -1, 4]), 4, 0, 0,
                      100) == [(0.0, 50.0), (-64.0, 82.0)]
    assert peak_lines(([100, 8, -8, -100], [-1, -1, 1, 0]), 2, ([200, -200], [-1, 0]), 4, 0, 0,
                      100) == [(16.0, 46.0), (0.0, 50.0)]
    assert aligned_logs(short, ([200, 64, -200, -64], [-1, -1, 0, 1])) is None
    # Three stretches in one log, one of them at the log's end.
    threads = ([8, -8, 8, -8], [-1, 0, -1, 2])
    other = ([8, 8, -8, -8], [-1, -1, 1, 0])
    a = (threads[0] + [100] + threads[0], threads[1] + [-1] + [f + 5 if f >= 0 else -1
                                                                for f in threads[1]])
    b = (other[0] + [300] + other[0], other[1] + [-1] + [f + 5 if f >= 0 else -1
                                                          for f in other[1]])
    assert peak_lines(a, 2, b, 6, 0, 0, 1000) == [(16.0, 50.0)]


class Block(torch.nn.Module):
    """Self-attention and an MLP on 8 tokens, then a head: allocations of many shapes."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, 64)
        self.layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(64 * 8, 10)

    def forward(self, x, y=None):
        return self.head(self.layer(self.embed(x)).flatten(1))


class Wide(torch.nn.Module):
    """Weights far larger than a sample's activations: backward peaks at its end (every weight
    gradient allocated) up to a few hundred samples, and on the activations above, so secants from
    small batches read its slope low (the fair race's ViT-B/16 in miniature)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 2048)
        self.b = torch.nn.Linear(2048, 2048)
        self.c = torch.nn.Linear(2048, 10)

    def forward(self, x, y=None):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def resnet18():
    """torchvision's ResNet-18 on 16x16 images: on 2 intra-op threads its convolutions and batch
    norms on the CPU make scratch allocations at 6 samples that they do not at 2, each freed by
    the next event (ResNet-50 in the race: 9 between 2 and 4; scripts/bench/replay_order.py). On
    one thread (the test tiers' OMP_NUM_THREADS=1, scripts/env.sh) they make them at every size,
    so the test runs this model on 2."""
    torchvision = pytest.importorskip("torchvision")  # not in the newest-torch environment

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=10)

        def forward(self, x, y=None):
            return self.net(x)

    return Net()


def _example(model_class):
    if model_class is resnet18:
        return torch.randn(1, 3, 16, 16), torch.randint(0, 10, (1,))
    if model_class is Block:
        return torch.randn(1, 8, 16), torch.randint(0, 10, (1,))
    return torch.randn(1, 64), torch.randint(0, 10, (1,))


def _loss(output, batch):
    return torch.nn.functional.cross_entropy(output, batch[1])


def _probe(model, example):
    """An EagerProbe of 3 steps a trial (AdamW) on the CPU budget allocator, as find() sets it up
    with min_batch 2: (probe, meter, state); the caller removes the meter and restores."""
    state = ModelState(model, example)
    meter = Meter.cpu(8 * GiB, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    probe = EagerProbe(model, example, leading_size(example), torch.device("cpu"),
                       lambda: torch.optim.AdamW(params, lr=1e-3), _loss,
                       lambda: torch.autocast("cpu", enabled=False), meter, state, 3)
    probe.state_batch = 2
    meter.finish_setup(state.untracked_bytes())
    return probe, meter, state


def _forward_backward_peak(record):
    return max(p["peak_allocated_bytes"] for p in record["phase_peaks"]
               if p["phase"] in ("forward", "loss", "backward"))


# Catches a replay whose start leaves out the batch's own bytes (every other size off by its bytes
# per sample times the difference), one that lines up events of different steps or of the state's
# making, and one that reads an event's bytes as constant: a measuring trial's replay at 6 must
# give every full trial's forward and backward peak at other sizes, to the byte. On ResNet-18 the
# measuring trial's whole step logs transients its first step (2 samples) does not make: catches
# a line-up that gives up on logs of other lengths (no replay), or pairs the events after a
# transient one off (another peak).
@pytest.mark.parametrize("model_class,sizes", [
    (Wide, (3, 29, 301)), (Block, (3, 29, 301)), (resnet18, (3, 64, 100))])
def test_a_measuring_trials_replay_is_every_full_trials_peak(model_class, sizes, monkeypatch):
    lengths = []

    def logged(first, *rest):  # the two logs' lengths, to show what ResNet-18's case exercises
        lengths.append((len(first[0]), len(rest[1][0])))
        return peak_lines(first, *rest)

    monkeypatch.setattr(_measuring, "peak_lines", logged)
    threads = torch.get_num_threads()
    if model_class is resnet18:
        torch.set_num_threads(2)
    torch.manual_seed(0)
    probe, meter, state = _probe(model_class(), _example(model_class))
    try:
        probe(2, 1)  # the search's first trial (min_batch, in full)
        lines = probe.measure(6, 1)["replayed_peak"]
        assert lines
        if model_class is resnet18:  # the transients are there: logs of other lengths
            assert lengths and lengths[0][0] != lengths[0][1]
        for size in sizes:
            record = probe(size, 1)
            want = _forward_backward_peak(record)
            assert max(a + s * size for a, s in lines) == pytest.approx(want, abs=1.0), size
    finally:
        meter.remove()
        state.restore(True)
        torch.set_num_threads(threads)


# Catches a search that does not take the replay (the key dropped between the probe and the
# search, or the secants kept for forward and backward): on Wide the secants from 2 and the second
# probe guess backward's slope low, and the replay puts the first guess on the answer: min_batch,
# the second probe, B* in full, B* + 1 measured. The answers equal binsearch's (full trials only).
def test_find_goes_from_the_second_probe_to_the_answer():
    x, y = _example(Wide)
    for limit in (130 << 20,):  # 8 s; the race has the others (docs/benchmarks.md)
        found = {}
        for strategy in ("guided", "binsearch"):
            torch.manual_seed(0)
            found[strategy] = autobatch.find(Wide(), (x, y), loss_fn=_loss, memory_limit=limit,
                                             margin=0.0, steps_per_trial=3, min_batch=2,
                                             strategy=strategy, progress=False)
        best = found["binsearch"].max_micro_batch
        trials = found["guided"].raw["trials"]
        assert found["guided"].max_micro_batch == best, limit
        assert [t["micro_batch_size"] for t in trials][2:] == [best, best + 1], limit
        assert trials[1].get("replayed_peak") and not trials[2].get("shortened"), limit


class FailsAt(torch.nn.Module):
    """Raises in its forward at the batch sizes in `sizes`."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 32)
        self.sizes = set()

    def forward(self, x, y=None):
        if x.shape[0] in self.sizes:
            raise RuntimeError("a model error in forward")
        return self.a(x)


# Catches a recording left running by a step that failed inside it (the budget allocator's log is
# process-wide: every allocation after it piled up in the log until the next one started): after
# a measuring trial whose first step's or whole step's forward raised, nothing is recorded.
@pytest.mark.parametrize("failing", [2, 6])
def test_a_step_that_fails_inside_its_log_stops_the_recording(failing):
    from autobatch import _budget
    torch.manual_seed(0)
    model = FailsAt()
    probe, meter, state = _probe(model, _example(Wide))
    try:
        probe(2, 1)
        model.sizes = {failing}
        with pytest.raises(Exception, match="a model error in forward"):
            probe.measure(6, 1)
        kept = torch.ones(4096)  # 16 KiB through the budget allocator, after the trial
        assert _budget.stop_allocation_log_events() == ([], [])
        del kept
    finally:
        meter.remove()
        state.restore(True)
