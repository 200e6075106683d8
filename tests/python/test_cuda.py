"""autobatch.find on CUDA (issues 29 and 39, docs/python.md): the command's CUDA backend through the
package's CudaApi over torch.cuda, held to the device's own figures. Runs
only where torch sees a GPU (scripts/device/python.sh on the GPU machine, or a user's GPU
environment); skipped on the CPU machines of CI. Each test names the wrong implementation it
catches."""
import json
import os
import subprocess
import sys

import pytest
import torch

import autobatch
import tiny_models

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "helpers")
LIMIT = "2GiB"  # above the CUDA context (about 0.5 GiB), which the limit counts


def on_cuda(name):
    if name in ("gpt2", "llama"):
        pytest.importorskip("transformers")
    model, example = tiny_models.MODELS[name]()
    example = ({k: v.cuda() for k, v in example.items()} if isinstance(example, dict)
               else example.cuda())
    return model.cuda(), example


def adamw(params):
    return torch.optim.AdamW(params)


def eager_peak(model, example, b):
    """The user's own job at micro-batch b: AdamW, 2 steps, the loss from the output (its .loss,
    else its mean, as find's default), the output alive through backward (find's default
    keep_output=True); max_memory_allocated
    over it (bytes)."""
    def grow(v):
        return v.repeat(b, *([1] * (v.dim() - 1)))
    batch = ({k: grow(v) for k, v in example.items()} if isinstance(example, dict)
             else grow(example))
    opt = torch.optim.AdamW(model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        out = model(**batch) if isinstance(batch, dict) else model(batch)
        loss = out.loss if hasattr(out, "loss") else out.mean()
        loss.backward()  # the output alive through it: find's keep_output=True
        del loss, out
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del opt
    model.zero_grad(set_to_none=True)
    return peak


def run(script, *args):
    out = subprocess.run([sys.executable, os.path.join(HELPERS, script), *map(str, args)],
                         check=True, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AUTOBATCH_TEST_DEVICE": "cuda"})
    return json.loads(out.stdout.strip().splitlines()[-1])


# Catches: a CUDA search whose answer is not the boundary under the emulated limit (a fraction
# that counts the model or the CUDA context twice, or not at all, so that B+1 fits in the user's
# process or B does not), and memory left allocated by the search. The search and the checks each
# run in a process of their own, one at a time, as a user's preflight and job do.
@pytest.mark.parametrize("name", ["mlp", "gpt2", "llama"])
def test_answer_is_exact_in_a_fresh_process_and_memory_is_returned(name):
    if name != "mlp":
        pytest.importorskip("transformers")
    r = run("cuda_find.py", name, LIMIT)
    assert r["status"] == "found" and r["backend"] == "cuda-caching", r
    b = r["max_micro_batch"]
    assert b in r["fits"] and (b + 1) in r["oom"], r
    assert r["after"] == r["before"], r
    assert r["driver"] >= 10000, r  # cuDriverGetVersion, never torch's always-0 call
    assert run("fresh_check.py", name, LIMIT, b, b + 1) == {str(b): "fits",
                                                            str(b + 1): "out-of-memory"}


# Catches: peaks that are not the caching allocator's (reserved taken for allocated, one phase's
# peak missed by a reset in the wrong place, the baseline left out): the trial's peak against the
# user's own eager loop's max_memory_allocated at the same batch, within 1%.
@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_the_trials_peak_is_the_eager_loops(name):
    model, example = on_cuda(name)
    b = 16
    trial = autobatch.check_batch(model, example, b, optimizer=adamw, memory_limit="8GiB")
    assert trial.outcome == "fits"
    eager = eager_peak(model, example, b)
    assert abs(trial.peak_allocated_bytes - eager) <= 0.01 * eager, (trial.peak_allocated_bytes,
                                                                     eager)
    assert trial.peak_reserved_bytes >= trial.peak_allocated_bytes
    assert set(trial.phase_peaks) >= {"forward", "backward", "optimizer-step"}


def eager(name, b, precision="fp32"):
    return run("eager_check.py", name, b, precision)


# Issue 39, item 3. Catches a meter whose figures hold only against itself (the former CudaMeter:
# the search and fresh_check.py shared it): at the answer B the user's own eager job, in a fresh
# process without autobatch, uses at most the limit on the device as the device counts it (the
# part outside the allocator plus max_memory_reserved), and at B+1 more than the limit. A conv net
# (cuDNN workspaces), an MLP, a transformer under amp-bf16. Memory (allocated and reserved, the
# cuBLAS workspaces included) is back after the search.
@pytest.mark.parametrize("name,precision", [("mlp", "fp32"), ("resnet18", "fp32"),
                                            ("gpt2", "amp-bf16")])
def test_the_device_itself_holds_the_answer(name, precision):
    if name == "gpt2":
        pytest.importorskip("transformers")
    r = run("cuda_find.py", name, LIMIT, precision)
    assert r["status"] == "found", r
    assert r["after"] == r["before"] and r["reserved_after"] <= r["reserved_before"], r
    assert r["device"]["total_bytes"] > 0 and r["device"]["allocator_fraction"] < 1.0, r
    b = r["max_micro_batch"]
    at_b, above = eager(name, b, precision), eager(name, b + 1, precision)
    assert at_b["outcome"] == "fits" and at_b["device_use_bytes"] <= r["limit"], (b, at_b, r)
    assert above["device_use_bytes"] > r["limit"], (b + 1, above, r)


def check(name, **env):
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "cuda_checks.py"), name],
                         check=True, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


# Row 4. Catches a search that ignores the fraction the user's process set (its answer does not
# fit the user's capped job) or restores 1.0 after it (the job then trains without its cap).
def test_a_preset_fraction_caps_the_limit_and_comes_back():
    r = check("preset-fraction")
    assert abs(r["limit"] - r["expected"]) <= 1, r
    assert "already set in this process" in r["source"], r
    assert r["after"] == pytest.approx(0.02), r


# Row 8. Catches a search under cudaMallocAsync, whose statistics and limit are not the caching
# allocator's: refused with the setting named.
def test_an_unsupported_allocator_setting_is_refused():
    r = check("refused-setting", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    assert r["outcome"] == "UsageError" and "cudaMallocAsync" in r["message"], r


# Row 5. Catches cleanup after a sticky device-side assert (a raw error, or a hang): the search
# ends in ModelError that says the device is unusable, within the subprocess's timeout.
def test_a_device_side_assert_ends_in_model_error():
    r = check("device-assert", CUDA_LAUNCH_BLOCKING="1")
    assert r["outcome"] == "ModelError" and "Start a new process" in r["message"], r


# Evaluation sizing on CUDA: the answer's check in the same process holds.
def test_evaluation_sizing_on_cuda():
    r = check("eval")
    assert r["eval_safe_batch"] > 0 and r["fits"], r


# Catches a search that counts a deleted object's CUDA tensors held by a reference cycle (the
# collector not run before the baseline: the answer below the clean one's), or frees them without
# saying so (test_hostile.py has the CPU's case).
def test_garbage_is_collected_before_the_baseline_and_said():
    r = check("garbage")
    assert r["answer"] == r["clean"], r
    assert len(r["warnings"]) == 1, r
    freed = int(r["warnings"][0].split(" freed ")[1].split()[0])
    assert freed >= 64 << 20, r  # the cycle's tensor, with whatever else was garbage


# find_sharded on CUDA (issue 43): catches a rank's trial that misses or double-counts FSDP2's
# CUDA allocations (all-gather outputs on the all-gather stream, reduce-scatter inputs, the
# padded shard) against the user's own FSDP2 loop, rank 0 of 8 under torch's fake process group,
# max_memory_allocated over two steps.
def test_a_sharded_ranks_trial_peak_matches_its_own_fsdp2_loop():
    pytest.importorskip("transformers")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    ids = torch.randint(0, 503, (1, 64), device="cuda")
    example = {"input_ids": ids, "labels": ids}
    r = autobatch.find_sharded(tiny_models.sharded_llama, tiny_models.shard_units, example,
                               world_size=8, optimizer=tiny_models.adamw, memory_limit=LIMIT,
                               device="cuda")
    b = next(t for t in reversed(r.result.trials) if t.outcome == "fits").micro_batch_size
    trial = next(t for t in r.result.trials if t.outcome == "fits" and t.micro_batch_size == b)
    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    try:
        with torch.device("meta"):
            model = tiny_models.sharded_llama()
        tiny_models.shard_units(model, init_device_mesh("cuda", (8,)))
        model.to_empty(device="cuda")
        batch = {k: v.repeat(b, 1) for k, v in example.items()}
        opt = tiny_models.adamw(model.parameters())
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    finally:
        dist.destroy_process_group()
    assert abs(trial.peak_allocated_bytes - peak) <= 0.01 * peak, (b, trial, peak)


# The soak on CUDA (issue 67 item 2): each step's window of the caching allocator (its reserved
# peak too), and the fragmentation at the worst step from the seam's inactive split bytes and
# retries. A forward hook that keeps its layer's output (32 x 512 float32 = 64 KiB a step, a
# multiple of the allocator's 512-byte blocks): the growth is exactly that, on the device's own
# figures. Catches: CPU figures reported on CUDA (no fragmentation, reserved == allocated), a
# window that does not reset per step (no growth fitted), and the fragmentation read from the
# last step instead of the worst.
def test_the_soak_measures_growth_and_fragmentation_on_the_device():
    import soak_models

    model = soak_models.hook_store().cuda()
    r = autobatch.soak(model, soak_models.example().cuda(), 32, steps=10, memory_limit=LIMIT,
                       step=soak_models.step, optimizer=soak_models.optimizer)
    assert r.device == "cuda" and r.outcome == "fits" and len(r.steps) == 10
    assert r.growing and r.growth_bytes_per_step == 32 * soak_models.HIDDEN * 4, str(r)
    assert all(s.peak_reserved_bytes >= s.peak_bytes > 0 for s in r.steps)
    worst = r.steps[r.worst_step]
    assert r.fragmentation["reserved_minus_allocated_bytes"] == (
        worst.peak_reserved_bytes - worst.peak_bytes)
    assert r.fragmentation["inactive_split_peak_bytes"] == worst.inactive_split_peak_bytes >= 0
    assert r.fragmentation["allocator_retries"] == sum(s.allocator_retries for s in r.steps)
    assert "fragmentation at the worst step" in str(r) and r.leaks, str(r)
