"""The fair race of finders (issue 44): every finder under the same exact memory budget. Its first
piece: the budget allocator's refusal, worded so that Lightning's and accelerate's finders take it
for out of memory (_core.set_refusal_suffix). Each test names the wrong implementation it
catches."""
import pytest
import torch

import autobatch
from autobatch import _core
from autobatch._trial import Meter

PEER_TEXT = " (DefaultCPUAllocator: can't allocate memory: refused by autobatch's CPU budget)"


def refusal(suffix):
    """The exception a real refusal of the budget raises with `suffix` set."""
    meter = Meter.cpu(8 << 20, 0)
    _core.set_refusal_suffix(suffix)
    try:
        meter.finish_setup(0)
        meter.begin()
        try:
            torch.empty(64 << 20, dtype=torch.uint8)
        except RuntimeError as e:
            return e
        finally:
            meter.end()
        raise AssertionError("64 MiB under an 8 MiB budget was not refused")
    finally:
        _core.set_refusal_suffix("")
        meter.remove()


# Catches: a suffix that is not applied, or an exception the peers reject for its form (not a
# RuntimeError, or more than one argument): their finders would then stop at the first
# refusal, as they do with the budget's own words (checked here too, so the test shows why the
# suffix exists).
def test_the_worded_refusal_is_out_of_memory_to_lightning_and_accelerate():
    memory = pytest.importorskip("lightning.pytorch.utilities.memory")
    accelerate = pytest.importorskip("accelerate.utils.memory")
    plain = refusal("")
    assert isinstance(plain, torch.OutOfMemoryError) and len(plain.args) == 1
    assert not memory.is_oom_error(plain) and not accelerate.should_reduce_batch_size(plain)
    worded = refusal(PEER_TEXT)
    assert isinstance(worded, torch.OutOfMemoryError) and len(worded.args) == 1
    assert "CPU budget allocator: out of memory" in worded.args[0]
    assert memory.is_oom_error(worded) and accelerate.should_reduce_batch_size(worded)
    assert _core.refusals() >= 2


# Catches: autobatch's own search reading the worded refusal as something else (the real
# allocator's failure, or the model's error): the race would then handicap autobatch itself.
def test_autobatch_still_finds_the_boundary_with_the_worded_refusal():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    example = torch.randn(1, 256)
    plain = autobatch.find(model, example, memory_limit="40MiB")
    _core.set_refusal_suffix(PEER_TEXT)
    try:
        worded = autobatch.find(model, example, memory_limit="40MiB")
    finally:
        _core.set_refusal_suffix("")
    assert worded.max_micro_batch == plain.max_micro_batch > 0
    assert any(t.outcome == "out-of-memory" for t in worded.trials)
