"""Each exception of autobatch.find, and Ctrl-C (issue 29). Each test names the wrong
implementation it catches."""
import pathlib
import re

import pytest
import torch

import autobatch
import tiny_models


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


# Catches: a limit below the model's own needs reported as a found size 0 (a "safe" answer of
# nothing), or as a model error; and an exception without the result.
def test_nothing_fits_raises_does_not_fit_with_the_result():
    with pytest.raises(autobatch.DoesNotFit) as e:
        autobatch.find(mlp(), torch.randn(1, 32), memory_limit=20_000)
    assert e.value.result.status == "nothing-fits"
    assert e.value.result.raw["result"]["min_batch_needs_at_least_bytes"] > 20_000
    assert e.value.exit_code == 3


# Catches: an exception whose exit_code is not the command's status for the same failure (the
# statuses of docs/errors.md's table, which the command exits with through
# include/autobatch/vocabulary/exit_codes.h): a ModelError given the usage status, a Cancelled given
# 1, or the package's numbers written apart from the command's table.
def test_each_exception_carries_the_commands_exit_status_of_docs_errors():
    page = pathlib.Path(__file__).parents[2] / "docs" / "errors.md"
    statuses = {}
    for codes, names in re.findall(r"^\| ([0-9 /]+) \| (`[^|]+`) \|", page.read_text(), re.M):
        for name in re.findall(r"`([a-z-]+)`", names):
            statuses[name] = int(codes.split("/")[0])
    assert statuses["usage-error"] == 2 and statuses["nothing-fits"] == 3
    expected = {
        autobatch.UsageError: statuses["usage-error"],
        autobatch.DoesNotFit: statuses["nothing-fits"],
        autobatch.ModelError: statuses["runtime-error"],
        autobatch.AutobatchError: statuses["runtime-error"],
        autobatch.Cancelled: statuses["interrupted"],
    }
    assert {k: k.exit_code for k in expected} == expected
    codes = autobatch._core.EXIT_CODES
    assert (codes["usage"], codes["does_not_fit"], codes["ranks"]) == (
        statuses["usage-error"], statuses["nothing-fits"], statuses["ranks-disagree"])


# Catches: bad arguments accepted (a search run on nonsense) or reported as model errors.
@pytest.mark.parametrize("kwargs,words", [
    ({"memory_limit": "lots"}, "memory_limit"),
    ({"memory_limit": -5}, "memory_limit"),
    ({"margin": 2.0}, "margin"),
    ({"margin": "120%"}, "margin"),
    ({"precision": "fp8"}, "precision"),
    ({"steps_per_trial": 0}, "steps_per_trial"),
    ({"optimizer": 3}, "optimizer"),
    ({"target_batch": 10, "world_size": 3}, "world size"),
    ({"strategy": "fastest"}, "strateg"),
    ({"device": "meta"}, "device"),
    ({"step": 3}, "step: expected a function"),
    ({"step": lambda m, b: m(b).mean(), "loss_fn": lambda o, b: o.mean()}, "pass one"),
    ({"ddp": "yes"}, "ddp: expected True or False"),
])
def test_usage_errors(kwargs, words):
    with pytest.raises(autobatch.UsageError) as e:
        autobatch.find(mlp(), torch.randn(1, 32), memory_limit=kwargs.pop("memory_limit", "64MiB"),
                       **kwargs)
    assert words in str(e.value)


# Catches: an example batch without a tensor, and a model that is not a module, accepted.
def test_usage_errors_for_the_model_and_batch():
    with pytest.raises(autobatch.UsageError, match="example_batch"):
        autobatch.find(mlp(), {"x": 3})
    with pytest.raises(autobatch.UsageError, match="torch.nn.Module"):
        autobatch.find(lambda x: x, torch.randn(1, 32))


# Catches: a step function whose return is not a loss (None, a non-scalar) silently trained
# on, or taken for out of memory.
@pytest.mark.parametrize("step", [lambda m, b: None, lambda m, b: m(b)])
def test_a_step_that_returns_no_loss_is_a_model_error(step):
    with pytest.raises(autobatch.ModelError, match="expected the micro-batch's loss"):
        autobatch.find(mlp(), torch.randn(1, 32), memory_limit="64MiB", step=step)


# Catches: a model error (shape mismatch) classified as out of memory (the search would go on
# and report a size), and a model left changed after the error.
def test_a_model_error_is_not_out_of_memory():
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(autobatch.ModelError) as e:
        autobatch.find(model, torch.randn(1, 31), memory_limit="64MiB")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert "mat1 and mat2" in str(e.value)
    assert e.value.micro_batch >= 1
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# Catches: Ctrl-C lost inside a trial (the search goes on), a cancelled trial counted as fitting,
# and a model left in the interrupted trial's state.
def test_ctrl_c_cancels_the_search_and_restores_the_model():
    model, example = tiny_models.gpt2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    def loss_fn(output, batch):
        calls.append(batch["input_ids"].shape[0])
        if len(calls) == 7:  # during the 4th trial (2 steps per trial)
            raise KeyboardInterrupt
        return output.loss
    with pytest.raises(autobatch.Cancelled) as e:
        autobatch.find(model, example, memory_limit="40MiB", loss_fn=loss_fn)
    r = e.value.result
    assert r.status == "cancelled"
    assert len(r.trials) == 4 and r.trials[-1].cancelled
    assert r.max_micro_batch == max(t.micro_batch_size for t in r.trials[:3] if t.outcome == "fits")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# Catches: a planner that is not the library's (not exact), and an impossible target accepted.
def test_plan():
    p = autobatch.plan(100, 512)
    assert p.accumulation_steps * p.micro_batch_size == 512 and p.micro_batch_size <= 100
    with pytest.raises(autobatch.UsageError, match="world size"):
        autobatch.plan(100, 100, world_size=3)


# Catches: a fingerprint blind to the structure (a changed layer size or dtype) or to the options.
def test_fingerprint():
    a = autobatch.fingerprint(mlp(), torch.randn(1, 32), memory_limit=1)
    assert a == autobatch.fingerprint(mlp(), torch.randn(1, 32), memory_limit=1)
    assert a != autobatch.fingerprint(mlp().double(), torch.randn(1, 32), memory_limit=1)
    assert a != autobatch.fingerprint(mlp(), torch.randn(1, 32), memory_limit=2)
    other = torch.nn.Sequential(torch.nn.Linear(32, 65), torch.nn.ReLU(), torch.nn.Linear(65, 4))
    assert a != autobatch.fingerprint(other, torch.randn(1, 32), memory_limit=1)


# Catches: a JSON report that describes the command's default step instead of the one that ran
# (options.precision "fp32" under autocast, keep_output as the command's default rather than the
# step's, optimizer "adamw" for an SGD), and a progress option that shows nothing.
def test_the_report_names_the_step_that_ran(capsys):
    model, example = tiny_models.gpt2()
    r = autobatch.find(model, example, memory_limit="40MiB", precision="amp-bf16", max_batch=8,
                       optimizer=lambda p: torch.optim.SGD(p, lr=0.1), progress=True,
                       keep_output=False)
    o = r.raw["options"]
    assert (o["precision"], o["keep_output"], o["loss"], o["optimizer"]) == (
        "amp-bf16", False, "model", "torch.optim.sgd.SGD")
    assert o["inputs"] == ["int64:64", "int64:64"]
    assert r.raw["fingerprint"]["model_sha1"] == r.fingerprint
    assert "the user's eager step" in r.text and "amp-bf16" in r.text
    assert f"{len(r.trials)}trial" in capsys.readouterr().err.replace(" ", "")


# Catches: a search stopped by its time budget before any batch was verified returned as an
# answer (safe micro-batch 0 taken as a size), instead of the command's exit status 3.
def test_a_budget_that_verifies_nothing_does_not_fit():
    with pytest.raises(autobatch.DoesNotFit, match="time budget") as e:
        autobatch.find(mlp(), torch.randn(1, 32), memory_limit="64MiB", time_limit=1e-6)
    assert e.value.result.status == "time-budget" and e.value.result.safe_micro_batch == 0


# Catches torch's own errors for a device autobatch cannot measure
# (an unknown type, CUDA without a GPU, a meta model) instead of a UsageError, and target_batch=0
# silently taken as "no plan".
@pytest.mark.parametrize("kwargs,words", [
    ({"device": "tpu"}, "expected 'cpu', 'cuda'"),
    ({"device": "cpu:3"}, "no index"),
    ({"target_batch": 0}, "target_batch"),
    ({"margin": "lots"}, "percentage"),
])
def test_usage_errors_a_new_user_met(kwargs, words):
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.find(mlp(), torch.randn(1, 32), memory_limit="64MiB", **kwargs)


# Catches: torch's own errors for CUDA without a GPU and a meta model instead of a UsageError.
def test_usage_errors_for_devices_autobatch_cannot_measure():
    if not torch.cuda.is_available():
        with pytest.raises(autobatch.UsageError, match="is_available"):
            autobatch.find(mlp(), torch.randn(1, 32), device="cuda")
    with pytest.raises(autobatch.UsageError, match="meta device"):
        autobatch.find(mlp().to("meta"), torch.randn(1, 32))


# Catches a _core that links torch again (c10, torch_cpu: one build per torch, an undefined
# symbol after every torch upgrade) or anything beyond the C and C++ runtime (Debian's libfmt or
# zlib: an import that fails on a machine without them), and a _core linked against libautobatch.so
# (which needs LibTorch's CMake config, and with torch's CUDA wheel the CUDA toolkit, to build).
def test_the_extension_needs_only_the_c_and_cxx_runtime():
    import shutil
    import subprocess
    import sys
    from autobatch import _core
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", _core.__file__], capture_output=True, text=True,
                             check=True).stdout
    needed = sorted(line.split("[", 1)[1].split("]", 1)[0]
                    for line in dynamic.splitlines() if "(NEEDED)" in line)
    runtime = ("libstdc++.so", "libgcc_s.so", "libc.so", "libm.so", "ld-linux", "libpthread.so")
    assert needed and all(n.startswith(runtime) for n in needed), needed
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, dynamic

    code = ("import autobatch\n"
            "maps = open('/proc/self/maps').read()\n"
            "print('libautobatch' in maps, 'libc10' in maps)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == "False", run.stdout
