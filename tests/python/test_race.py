"""The fair race of finders (issue 44): every finder under the same exact memory budget. Its first
piece: the budget allocator's refusal, worded so that Lightning's and accelerate's finders take it
for out of memory (_budget.set_refusal_suffix). Each test names the wrong implementation it
catches."""
import pytest
import torch

import autobatch
from autobatch import _budget
from autobatch._meter import Meter

PEER_TEXT = " (DefaultCPUAllocator: can't allocate memory: refused by autobatch's CPU budget)"


def refusal(suffix):
    """The exception a real refusal of the budget raises with `suffix` set."""
    meter = Meter.cpu(8 << 20, 0)
    _budget.set_refusal_suffix(suffix)
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
        _budget.set_refusal_suffix("")
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
    assert _budget.refusals() >= 2


# Catches: autobatch's own search reading the worded refusal as something else (the real
# allocator's failure, or the model's error): the race would then handicap autobatch itself.
def test_autobatch_still_finds_the_boundary_with_the_worded_refusal():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    example = torch.randn(1, 256)
    plain = autobatch.find(model, example, memory_limit="40MiB")
    _budget.set_refusal_suffix(PEER_TEXT)
    try:
        worded = autobatch.find(model, example, memory_limit="40MiB")
    finally:
        _budget.set_refusal_suffix("")
    assert worded.max_micro_batch == plain.max_micro_batch > 0
    assert any(t.outcome == "out-of-memory" for t in worded.trials)


def load_race():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench", "race.py")
    spec = importlib.util.spec_from_file_location("race_script", path)
    race = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(race)
    return race


# Catches: the least process wall of an exact finder summed from the search column instead of
# the process's time outside the search (imports and the model, 0.4 + 2.0 s here), or taken as a
# share of Lightning's search time instead of its wall; and the floor's share of the search.
def test_the_table_states_the_least_wall_an_exact_finder_could_have():
    import argparse
    race = load_race()
    rows = {
        "mlp": [{"finder": "lightning-binsearch", "found": 90, "trials": 10, "search_s": 20.0,
                 "wall_s": 23.0},
                {"finder": "autobatch", "found": 100, "trials": 3, "search_s": 6.0,
                 "wall_s": 6.4, "floor_s": 4.0, "step_ms_at_answer": 500.0,
                 "overhead_ms": [1.0], "recovery_ms": [2.0], "freeing_ms": [0.5]}],
        "vit": [{"finder": "lightning-binsearch", "found": 200, "trials": 12, "search_s": 40.0,
                 "wall_s": 47.0},
                {"finder": "autobatch", "found": 200, "trials": 5, "search_s": 15.0,
                 "wall_s": 17.0, "floor_s": 10.0, "step_ms_at_answer": 2000.0,
                 "overhead_ms": [20.0], "recovery_ms": [30.0], "freeing_ms": [1.0]}],
    }
    tables = [("mlp", 100, rows["mlp"]), ("vit", 200, rows["vit"])]
    text = race.render(tables, argparse.Namespace(device="cpu"), 0.5, 1.5, 60.0)
    assert "| autobatch | 2 of 2 | 8 | 21.0 | 23.4 | 0.36 | 0.35 | 0.33 |" in text
    assert "The floor summed: 14.0 s, 0.23 of Lightning binsearch's search time." in text
    # 4.0 + 0.4 + 10.0 + 2.0 = 16.4 s of Lightning's 70.0 s of wall
    assert "outside its search (imports, the model): 16.4 s, 0.23 of Lightning binsearch's " \
        "wall" in text
