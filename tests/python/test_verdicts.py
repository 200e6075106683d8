"""The trial verdict table (tests/fixtures/trial_verdicts.json) replayed against the Python door.

Each case runs its trials on one EagerProbe over an MLP on the CPU under the budget allocator, the
forward raising what the case scripts at each trial (torch.OutOfMemoryError for a trial that ran
out of memory, RuntimeError with the library's text for the failing trial and a failing re-run).
The C++ door replays the same table through its trial runner (tests/probes/trial_verdicts_test.cpp). Both
call the one rule, TrialEvidence (src/probes/trial_evidence.h, here _core.TrialEvidence): what
each door can still get wrong is what it hands over (the trial's peak, the evidence per kind of
trial, the re-run's answer) and what it does with the verdict (the record, ModelError, the listed
re-run, the warning). Each case names the wrong rule it catches in its "catches".
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from autobatch import ModelError
from autobatch._state import ModelState
from autobatch._meter import Meter
from autobatch._trial import EagerProbe

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                     "trial_verdicts.json")
CASES = json.load(open(TABLE, encoding="utf-8"))["cases"]
LIMIT = 256 << 20


class Scripted(torch.nn.Module):
    """An MLP whose forward asks ``action()`` first: None runs it; ("oom",) raises
    torch.OutOfMemoryError; ("raise", message, hold_bytes) holds that many bytes (counted by the
    budget allocator, so they are in the trial's peak), then raises RuntimeError(message)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 4))
        self.action = lambda: None

    def forward(self, x):
        action = self.action()
        if action is not None and action[0] == "oom":
            raise torch.OutOfMemoryError("CPU budget allocator: out of memory: tried to allocate "
                                         "4096 bytes (scripted)")
        if action is not None:
            held = torch.ones(max(action[2], 1), dtype=torch.uint8)  # noqa: F841  in the peak
            raise RuntimeError(action[1])
        return self.net(x)


def _script(case):
    """Trial index -> the forward's action, as the case orders its trials: the ones before, the
    failing trial, then the re-run to classify."""
    actions = {i: (("oom",) if outcome == "out-of-memory" else None)
               for i, (_, outcome) in enumerate(case["before"])}
    trial = case["trial"]
    actions[len(case["before"])] = ("raise", trial["message"], trial["hold_bytes"])
    rerun = case["rerun"]
    if rerun is not None and rerun["does"] != "fits":
        actions[len(case["before"]) + 1] = (
            ("oom",) if rerun["does"] == "out-of-memory" else ("raise", rerun["message"], 0))
    return actions


def _probe(model, case):
    meter = Meter.cpu(LIMIT, 0)
    limit = case["process_limit"]
    if limit is None:
        meter.process_limit_near = lambda peak, request: False
    else:
        meter.process_limit_near = (
            lambda peak, request: request > 0 or peak >= limit["near_at_peak"])
    state = ModelState(model)
    probe = EagerProbe(model, torch.randn(1, 16), 1, torch.device("cpu"),
                       lambda: torch.optim.SGD(state.params, lr=0.1), None, _nullcontext, meter,
                       state, 2)
    return probe, meter


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_python_door_gives_the_tables_verdict(case, caplog):
    model = Scripted()
    actions, trials = _script(case), []
    # set before the probe: its state puts the module's attributes back after each trial
    model.action = lambda: actions.get(trials[0].count - 1)
    probe, meter = _probe(model, case)
    trials.append(probe)
    caplog.set_level(logging.WARNING, logger="autobatch")
    try:
        for batch, outcome in case["before"]:
            record = probe(batch, 1)
            assert record.get("outcome", "fits") == outcome, (batch, record)
        expect = case["expect"]
        batch = case["trial"]["micro_batch"]
        if expect["verdict"] == "rethrow":
            with pytest.raises(ModelError) as raised:
                probe(batch, 1)
            assert expect["text"] in str(raised.value)
            record = {}
        else:
            record = probe(batch, 1)
            assert record.get("outcome") == expect["verdict"], record
            assert expect["text"] in record["reason"], record["reason"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if expect["warning"] is None:
            assert not [w for w in warnings if "re-run" in w], warnings
        else:
            assert any(expect["warning"] in w for w in warnings), warnings
        listed = record.get("classification_rerun")
        if expect["rerun_micro_batch"] is None:
            assert listed is None, listed
        else:
            assert listed["micro_batch_size"] == expect["rerun_micro_batch"], listed
            assert listed["reason"].startswith("re-run to classify: "), listed["reason"]
    finally:
        meter.remove()


def _facts():
    return {"name": "m", "device": "cpu", "steps_per_trial": 2, "fingerprint": "", "step": "",
            "model": {"parameter_count": 1}, "context": {"device": "cpu"}}


# The binding's schema (src/python/core.cpp: kSearchOptionKeys, kTrialRecordKeys, also read by
# Python from _core). Catches a converter that reads a misspelled key as its default: the search
# then ran with no max_batch (max_bach) or took a failed trial for a fit (outcom), silently.
def test_a_misspelled_key_crossing_the_binding_is_an_error():
    from autobatch import _core

    def probe(size, micro):
        return {"outcome": "fits" if size <= 8 else "out-of-memory", "peak_bytes": size,
                "steps_completed": 2}

    assert "max_batch" in _core.SEARCH_OPTION_KEYS and "outcome" in _core.TRIAL_RECORD_KEYS
    with pytest.raises(ValueError, match='search options: unknown key "max_bach"'):
        _core.search(probe, {"max_bach": 16, "margin_fraction": 0.0}, _facts())

    def misspelled(size, micro):
        return {"outcom": "out-of-memory", "steps_completed": 2}

    with pytest.raises(ValueError, match='the trial\'s record: unknown key "outcom"'):
        _core.search(misspelled, {"max_batch": 16, "margin_fraction": 0.0}, _facts())
    out = _core.search(probe, {"max_batch": 16, "margin_fraction": 0.0}, _facts())
    assert json.loads(out["json"])["result"]["max_micro_batch"] == 8
