"""The package's CUDA meter on the CPU (issue 39): the C++ CUDA backend through the Python CudaApi
(autobatch/_cuda_api.py) over a fake of torch.cuda (fake_cuda.py), held to the same scenario table
as the C++ backend (tests/fixtures/cuda_meter_scenarios.json, CudaBackendTest.SharedScenarios),
and the trial's rules above the meter (the warm-up, the re-run of an ambiguous failure, no device
call after a fatal error, one synchronize per step, the report's device fields, ranks that search
alone). Each test names the wrong implementation it catches."""
import json
import os
import sys

import pytest
import torch

import autobatch
from autobatch import _core
from autobatch._state import ModelState
from autobatch._meter import Meter
from autobatch._trial import EagerProbe

import fake_cuda
import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "..", "fixtures", "cuda_meter_scenarios.json")
MiB = fake_cuda.MiB


def _table():
    with open(SCENARIOS) as f:
        return json.load(f)["scenarios"]


def _mib(d, key, default=0):
    return d[key] * MiB if key in d else default


def _run_ops(fake, ops):
    used = fake.used()
    for op in ops:
        if "alloc" in op:
            fake.allocate(op["alloc"] * MiB)
        elif "free" in op:
            fake.release(op["free"] * MiB)
        elif "kernel" in op:
            fake.kernel(op["kernel"], op.get("module_mib", 0) * MiB)
        elif "split" in op:
            fake.split(op["split"] * MiB, op["block"] * MiB)
        elif "free_split" in op:
            fake.release_split(op["free_split"] * MiB, op["block"] * MiB)
        elif "fill" in op:
            used = max(used, fake.fill(op["fill"] * MiB))
        else:
            raise AssertionError(f"unknown op {op}")
        used = max(used, fake.used())
    return used


# Catches, row by row, the faults of the package's former CudaMeter (a second copy of the C++
# rules): the cuBLAS workspaces left after the search (row 1), the outside part read once before
# any kernel ran and never again (row 2), the user's fraction replaced by 1.0 and ignored as a cap
# (row 4), a limit above the card kept (row 7), PYTORCH_NO_CUDA_MEMORY_CACHING and cudaMallocAsync
# measured as if they were the caching allocator (row 8). Replayed as the C++ test replays them.
@pytest.mark.parametrize("s", _table(), ids=lambda s: s["name"])
def test_shared_scenario(s):
    e = s["expect"]
    fake = fake_cuda.FakeCuda(total_global=_mib(s, "total_global_mib", 150 * fake_cuda.GiB),
                              meminfo_total=_mib(s, "meminfo_total_mib", None) or None,
                              context_at_init=_mib(s, "context_at_init_mib", 500 * MiB),
                              preset_fraction=s.get("preset_fraction", 1.0), env=s.get("env"),
                              allocator_backend=s.get("allocator_backend", "native"))
    try:
        meter = Meter.cuda(0, _mib(s, "limit_mib"), _mib(s, "reserve_mib"),
                           api=fake_cuda.api_over(fake))
    except _core.Error as error:
        assert "error" in e, error
        assert e["error"] in str(error)
        assert fake.calls["set_per_process_memory_fraction"] == 0
        assert fake.fraction == e["fraction_after_remove"]
        return
    assert "error" not in e, "expected an error"
    assert meter.needs_warm_up()
    if "limit_mib" in e:
        assert meter.backend.limit_bytes() == e["limit_mib"] * MiB
    if "source" in e:
        assert e["source"] in meter.limit_source()
    fake.allocate(_mib(s, "model_mib", 300 * MiB))
    if "warm_up" in s:
        meter.begin()
        _run_ops(fake, s["warm_up"])
        meter.end()
        meter.release()
    meter.finish_setup(0)
    if "outside_after_setup_mib" in e:
        assert meter.backend.outside_bytes() == e["outside_after_setup_mib"] * MiB
    if "allowance_after_setup_mib" in e:
        assert abs(fake.fraction * fake.total_global - e["allowance_after_setup_mib"] * MiB) <= 1
    for i, ops in enumerate(s.get("trials", [])):
        meter.begin()
        used = _run_ops(fake, ops)
        peaks = meter.end()
        meter.release()
        if i >= len(e.get("trials", [])):
            continue
        t = e["trials"][i]
        if "outside_growth_mib" in t:
            assert peaks["outside_growth_bytes"] == t["outside_growth_mib"] * MiB, (i, peaks)
        if "peak_minus_reserved_mib" in t:
            assert peaks["peak_bytes"] - peaks["peak_reserved_bytes"] == \
                t["peak_minus_reserved_mib"] * MiB, (i, peaks)
        if "used_at_most_mib" in t:
            assert used <= t["used_at_most_mib"] * MiB, (i, used / MiB)
        if "inactive_split_peak_mib" in t:
            assert peaks["inactive_split_peak_bytes"] == t["inactive_split_peak_mib"] * MiB, peaks
        if "allocator_retries" in t:
            assert peaks["allocator_retries"] == t["allocator_retries"], (i, peaks)
    if "after_search" in e:
        assert fake.allocated + fake.workspace == e["after_search"]["allocated_mib"] * MiB
        assert fake.reserved() == e["after_search"]["reserved_mib"] * MiB
    warnings = meter.warnings()
    for w in e.get("warnings", []):
        assert any(w in x for x in warnings), (w, warnings)
    meter.remove()
    assert fake.fraction == e["fraction_after_remove"]


class Mlp(torch.nn.Module):
    """A CPU model whose forward can raise an injected error (as cuDNN or a kernel would)."""

    def __init__(self, fail=None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 4))
        self.fail = fail  # fail(batch) -> an exception to raise, or None

    def forward(self, x):
        error = self.fail(x.shape[0]) if self.fail else None
        if error is not None:
            raise error
        return self.net(x)


def probe_on_fake(model, fake, steps=2):
    """An EagerProbe of `model` (on the CPU) whose meter is the CUDA backend over `fake`, set up as
    find() sets it up (warm-up, then finish_setup)."""
    meter = Meter.cuda(0, 8 << 30, 0, api=fake_cuda.api_over(fake))
    state = ModelState(model)
    probe = EagerProbe(model, torch.randn(1, 16), 1, torch.device("cpu"),
                       lambda: torch.optim.SGD(state.params, lr=0.1), None, _nullcontext, meter,
                       state, steps)
    probe.warm_up(1)
    meter.finish_setup(0)
    return probe, meter, state


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


# Row 9. Catches a meter that synchronizes the device at its phase boundaries (the former
# CudaMeter: 4-5 times per micro-batch, inside the timed step, so step times and plan="fastest"
# compared inflated figures): inside a step no synchronize is made; one ends each step.
def test_one_synchronize_per_step_and_none_inside_it():
    fake = fake_cuda.FakeCuda()
    fake.init(0)
    probe, meter, _ = probe_on_fake(Mlp(), fake, steps=3)
    seen = []
    original = fake.synchronize

    def synchronize(index=None):
        seen.append(probe.point[0])
        original(index)
    fake.synchronize = synchronize
    record = probe(4, 2)
    assert record["steps_completed"] == 3
    inside = [p for p in seen if p != "idle"]
    assert inside == [], seen
    # 3 step ends, then the trial's end and the cache release (after the timing).
    assert len(seen) == 3 + 2, seen
    meter.remove()


# Row 3. Catches "GET was unable to find an engine" taken as the model's error: near the limit
# cuDNN finds no engine for lack of workspace, and the former meter ended the whole search with
# ModelError. The largest fit is re-run: it fits, so the failure was memory.
def test_ambiguous_failure_is_memory_when_the_largest_fit_fits_again():
    engine = "cuDNN error: GET was unable to find an engine to execute this computation"
    model = Mlp(lambda b: RuntimeError(engine) if b > 64 else None)
    result = autobatch.find(model, torch.randn(1, 16), memory_limit="256MiB", max_batch=200,
                            margin=0.0)
    assert result.max_micro_batch == 64, [(t.micro_batch_size, t.outcome) for t in result.trials]
    failed = [t for t in result.trials if t.micro_batch_size > 64]
    assert failed and all(t.outcome == "out-of-memory" for t in failed)
    assert "fit when re-run" in failed[0].reason, failed[0].reason


# Row 3, the other side. Catches every ambiguous failure taken as memory: when the largest fit
# fails the same way on its re-run, the error is the model's, and it leaves as ModelError.
def test_ambiguous_failure_that_persists_is_the_models():
    engine = "cuDNN error: GET was unable to find an engine to execute this computation"
    broken = {"on": False}

    def fail(b):
        if b > 64:
            broken["on"] = True
        return RuntimeError(engine) if broken["on"] else None
    with pytest.raises(autobatch.ModelError, match="unable to find an engine"):
        autobatch.find(Mlp(fail), torch.randn(1, 16), memory_limit="256MiB", max_batch=200)


# Row 5. Catches cleanup after a sticky CUDA error (the former meter synchronized and emptied the
# cache after it, so the raw error escaped instead of ModelError and the meter was never removed):
# after the fatal error no device call is made, ModelError says the device is unusable, and
# removing the meter touches nothing.
def test_fatal_device_error_ends_in_model_error_with_no_device_call_after_it():
    fake = fake_cuda.FakeCuda()
    fake.init(0)

    def fail(b):
        if b > 8:
            fake.sticky = True
            return RuntimeError(fake_cuda.STICKY)
        return None
    probe, meter, _ = probe_on_fake(Mlp(fail), fake)
    assert probe(8, 1).get("outcome", "fits") == "fits"
    touches = []
    fake._touch = lambda: touches.append(1)  # any device call from here on is recorded
    with pytest.raises(autobatch.ModelError) as info:
        probe(16, 1)
    message = str(info.value)
    assert "fatal error at micro-batch 16" in message and "Start a new process" in message
    assert "device-side assert triggered" in message
    assert touches == []
    assert meter.poisoned()
    meter.remove()
    assert touches == []


# Catches a trial whose end takes the backend's own refusal for a fatal device error: memory outside
# the caching allocator grown past the limit by a kernel first run at a larger size (1100 MiB of
# modules under 1.5 GiB) made the backend refuse to set the fraction after the trial
# (cuda_backend.cpp, applyFraction); the probe marked the device poisoned, so the weights stayed as
# the trial left them, the process kept the search's small fraction, and the words said "fatal
# error, start a new process". Now a UsageError in the backend's words, the weights restored, the
# fraction back to the process's.
def test_a_refusal_after_a_trial_is_a_usage_error_and_puts_everything_back():
    fake = fake_cuda.FakeCuda()
    fake.init(0)

    def grow(b):
        if b > 2:
            fake.kernel("big", 1100 * fake_cuda.MiB)
        return None
    model = Mlp(grow)
    meter = Meter.cuda(0, 1536 * fake_cuda.MiB, 0, api=fake_cuda.api_over(fake))
    state = ModelState(model)
    before = [p.detach().clone() for p in model.parameters()]
    probe = EagerProbe(model, torch.randn(1, 16), 1, torch.device("cpu"),
                       lambda: torch.optim.SGD(state.params, lr=0.1), None, _nullcontext, meter,
                       state, 2)
    probe.warm_up(1)
    meter.finish_setup(0)
    with pytest.raises(autobatch.UsageError, match="memory limit"):
        probe(4, 1)
    assert not meter.poisoned()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    state.restore(True)
    meter.remove()
    assert fake.fraction == 1.0


# Catches an evaluation probe whose release after a fatal device error (a device-side assert in the
# evaluation forward) copies the weights back: on a GPU the copy raises the sticky error again, and
# that raw error replaced the ModelError that says to start a new process. No device call after the
# error.
def test_a_fatal_error_in_evaluation_leaves_the_device_untouched_by_the_release():
    from autobatch._eval import EvalProbe
    fake = fake_cuda.FakeCuda()
    fake.init(0)

    class EvalAssert(Mlp):
        def forward(self, x):
            if not self.training and x.shape[0] > 2:
                fake.sticky = True
                raise RuntimeError(fake_cuda.STICKY)
            return self.net(x)
    probe, meter, state = probe_on_fake(EvalAssert(), fake)
    restores = []
    state.restore_weights = lambda: restores.append(1)
    evaluator = EvalProbe(probe)
    assert evaluator.hold(True, 1, 1).get("holds")
    restores.clear()
    assert evaluator(4, 2)["cancelled"]  # the search stops; find() raises what it kept
    assert isinstance(probe.stopped_by, autobatch.ModelError)
    assert "Start a new process" in str(probe.stopped_by)
    evaluator.release()  # the C++ side's withState releases the state after the evaluation
    assert meter.poisoned() and restores == []
    meter.remove()


# Row 2, above the meter. Catches a search that reads the outside part before any step ran: the
# warm-up step runs before finish_setup, so the modules its kernels load are in the baseline.
def test_warm_up_runs_before_the_outside_part_is_read():
    fake = fake_cuda.FakeCuda()
    fake.init(0)

    class Loading(Mlp):
        def forward(self, x):
            fake.kernel("matmul", 40 * MiB)
            return super().forward(x)
    probe, meter, _ = probe_on_fake(Loading(), fake)
    assert meter.backend.outside_bytes() == 540 * MiB
    assert probe.count == 0  # the warm-up is not one of the search's trials
    meter.remove()


# Row 10. Catches the report's device fields left at their defaults on CUDA (allocator_fraction
# 1.0, total_bytes 0, expandable_segments false): they come from the backend and torch's device.
def test_report_device_fields_come_from_the_backend():
    fake = fake_cuda.FakeCuda(env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    meter = Meter.cuda(0, 4 << 30, 0, api=fake_cuda.api_over(fake))
    fake.allocate(300 * MiB)
    meter.finish_setup(0)
    facts = {"name": "m", "device": "cuda:0", "steps_per_trial": 2, "fingerprint": "", "step": "",
             "model": {"parameter_count": 1}, "cuda_devices": [
                 {"index": 0, "name": "Fake GPU", "total_bytes": fake.total_global, "major": 9,
                  "minor": 0}],
             "context": {"device": "cuda:0", "micro_batches_per_trial": 1, **meter.context()}}

    def probe(size, micro):
        return {"outcome": "fits" if size <= 8 else "out-of-memory", "peak_bytes": size,
                "memory_limit_bytes": meter.limit_bytes(), "steps_completed": 2}
    out = _core.search(probe, {"max_batch": 16, "margin_fraction": 0.0}, facts)
    device = json.loads(out["json"])["device"]
    assert device["total_bytes"] == fake.total_global
    assert device["expandable_segments"] is True
    assert device["allocator_fraction"] == pytest.approx(fake.fraction)
    assert device["allocator_fraction"] < 1.0
    assert device["backend"] == "cuda-caching"
    meter.remove()


# Row 6. Catches ranks that each search on their own while their step runs a collective (they try
# different batches at different times, so a collective waits for a rank that never joins: a hang
# until the process group's timeout): refused before the collective runs, naming the module, on
# every rank, within the test's bound.
@pytest.mark.slow  # a torchrun job: the slow tier
def test_a_step_with_a_collective_is_refused_on_every_rank(tmp_path):
    run, ranks = torchrun.run(tmp_path, "ranks_alone.py", "collective", port_offset=200,
                              timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(ranks) == 2, run.stderr[-3000:]
    for r in ranks:
        assert r["outcome"] == "error" and r["type"] == "UsageError", r
        assert "c10d::allreduce_" in r["message"] and "module 'body'" not in r["message"], r
        assert "in the forward of module 'Reducing'" in r["message"], r


# Row 5, the ranks. Catches an agreement that a rank skips when its search raised an error that is
# not an AutobatchError (the former all_reduce: the other rank then waited until gloo's timeout):
# both ranks end, rank 1 with its own error, rank 0 naming the other rank.
@pytest.mark.slow  # a torchrun job: the slow tier
def test_an_error_on_one_rank_ends_every_rank(tmp_path):
    run, ranks = torchrun.run(tmp_path, "ranks_alone.py", "error", port_offset=300, timeout=240)
    assert len(ranks) == 2, run.stderr[-3000:]
    by_rank = {r["rank"]: r for r in ranks}
    assert by_rank[1]["outcome"] == "error" and "broken" in by_rank[1]["message"], by_rank
    assert by_rank[0]["outcome"] == "error", by_rank
    # rank 0 names rank 1 and its error (the agreement carries each rank's error text)
    assert "another rank did not size (rank 1: " in by_rank[0]["message"], by_rank
    assert "broken" in by_rank[0]["message"], by_rank


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# Catches find_ddp / find_sharded's real lock-step check run on the whole card without memory_limit:
# on CUDA it has no meter of ours, so the device's use at the steps' peak (outside the caching
# allocator + its peak reserved) is held to the limit less the reserve after the steps; above it,
# the answer does not hold (out of memory, which verify() reports as memory). torch.cuda's figures
# are the fake's.
def test_the_real_steps_device_use_is_held_to_the_memory_limit(monkeypatch):
    from autobatch._distributed import _in_job as _sharded_job
    gib = 1 << 30
    figures = {"free": 100 * gib, "reserved": 30 * gib, "peak": 36 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (figures["free"], 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: figures["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: figures["peak"])
    device = torch.device("cuda:0")
    # outside: 140 - 100 - 30 = 10 GiB; use at the peak 46 GiB
    _sharded_job._check_cuda_use(device, {"memory_limit": 46 * gib})
    _sharded_job._check_cuda_use(device, {})  # no limit: the whole card, nothing to hold
    with pytest.raises(torch.OutOfMemoryError, match="more than the limit less the reserve"):
        _sharded_job._check_cuda_use(device, {"memory_limit": "48GiB", "reserve": "4GiB"})


# Catches a report whose driver version is read from a call torch does not have
# (torch._C._cuda_getDriverVersion: always 0): cuDriverGetVersion from libcuda.so.1, 0 where the
# library or the call is missing or fails.
def test_the_driver_version_comes_from_the_driver_library():
    import ctypes
    from autobatch._cuda_api import driver_version

    class Driver:
        def __init__(self, status):
            self.status = status

        def cuDriverGetVersion(self, pointer):
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int))[0] = 13000
            return self.status

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    assert driver_version(lambda name: Driver(0)) == 13000
    assert driver_version(lambda name: Driver(35)) == 0  # CUDA_ERROR_INSUFFICIENT_DRIVER
    assert driver_version(missing) == 0
