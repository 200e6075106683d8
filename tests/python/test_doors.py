"""Every door answers what the user's own job trains (issue 63): each answer checked against the
user's own loop, or the framework's own fit / evaluate, in a fresh process under the same budget
allocator installed before anything is built (max fits, max + 1 does not)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import autobatch

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script, *args):
    """One fresh process of a check script; its last stdout line as JSON."""
    return run_env({}, script, *args)


def run_env(env, script, *args):
    """run() with `env` added to the environment."""
    out = subprocess.run([sys.executable, os.path.join(HERE, script), *map(str, args)],
                         capture_output=True, text=True, timeout=600, cwd=HERE,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# Catches a CPU baseline of the model's own tensors only (what the budget allocator cannot see:
# storages made before it was installed): a distillation step's frozen teacher, 16 MiB held by
# the step's closure, was left out, and the search answered 2247 where the user's loop runs out
# of memory at 1750 and below. The baseline is every live tensor storage of the process, once,
# as CUDA's allocated bytes count it; the report names it apart.
def test_memory_held_outside_the_model_is_in_the_baseline():
    limit = 48 << 20
    found = run("outside_check.py", "find", limit)
    b = found["max"]
    assert found["held_outside"] >= 4 * 1024 * 1024 * 4, found  # the teacher's four weights
    assert any("held outside the model" in w for w in found["warnings"]), found["warnings"]
    outcomes = [run("outside_check.py", "loop", limit, size)["outcome"] for size in (b, b + 1)]
    assert outcomes == ["fits", "out-of-memory"], (b, outcomes)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10)), torch.randn(1, 256)


# Catches steps_per_trial=1 accepted for every optimizer (the command refuses it where step 2
# holds more: src/probes/runner_checks.cpp): with AdamW one step answered a batch whose second
# step runs out of memory (its state is made at the first step()). Plain SGD and no optimizer
# with gradients set to None repeat step 1 exactly and stay allowed.
@pytest.mark.parametrize("optimizer, zero_grad, words", [
    (None, "none", "optimizer AdamW creates its state"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "none", "optimizer SGD creates"),
    (lambda p: torch.optim.Adam(p), "none", "optimizer Adam creates"),
    ("none", "zeros", "zero_grad='zeros' keeps the gradients alive"),
])
def test_one_step_per_trial_is_refused_where_the_second_step_holds_more(optimizer, zero_grad,
                                                                         words):
    model, x = mlp()
    with pytest.raises(autobatch.UsageError, match="steps_per_trial: expected at least 2") as e:
        autobatch.find(model, x, optimizer=optimizer, zero_grad=zero_grad, steps_per_trial=1,
                       memory_limit="64MiB")
    assert words in str(e.value)


def test_one_step_per_trial_stays_for_optimizers_without_state():
    model, x = mlp()
    for optimizer in ("none", lambda p: torch.optim.SGD(p, lr=0.1)):
        r = autobatch.find(model, x, optimizer=optimizer, steps_per_trial=1,
                           memory_limit="16MiB", margin=0)
        assert r.max_micro_batch > 1 and all(t.steps_completed <= 1 for t in r.trials)


# Catches a Lightning trial that keeps only the loss of a training_step returning a dict:
# Lightning keeps the dict's other values, not detached, through backward and the optimizer's
# step (ClosureResult.extra, lightning/pytorch/loops/optimization/automatic.py), so a trial
# without them answered 3039 where Lightning's own fit runs out of memory above 2303.
def test_lightning_holds_what_a_training_step_dict_keeps_as_its_fit_does():
    pytest.importorskip("lightning")
    limit = 40 << 20
    b = run("lightning_fit_check.py", "find", limit)["max"]
    outcomes = [run("lightning_fit_check.py", "fit", limit, size)["outcome"]
                for size in (b, b + 1)]
    assert outcomes == ["fits", "out-of-memory"], (b, outcomes)


# Catches two ways the Hugging Face drop-in's evaluation trial held less than the Trainer's
# evaluation: the label-smoothed step kept only its loss where prediction_step hands the logits
# to the evaluation loop, which keeps them while the next batch runs (72 where the Trainer runs
# out of memory at 66), and trials with the model's own config.use_cache=True where the Trainer
# sets args.use_cache (False) in its __init__ (every evaluation forward built a key/value cache:
# 58 where the Trainer fits 61). The truth: trainer.train() for one step with an evaluation of two
# batches after it, compute_metrics set and eval_accumulation_steps=1 (hf_eval_check.py).
@pytest.mark.parametrize("smoothing", [0.1, 0.0])
def test_the_hf_evaluation_batch_is_the_trainers_own(smoothing):
    pytest.importorskip("transformers")
    limit = 40 << 20
    e = run("hf_eval_check.py", "find", limit, smoothing)["eval_max"]
    outcomes = [run_env({"METRICS": "1"}, "hf_eval_check.py", "evaluate", limit, smoothing,
                        size)["outcome"] for size in (e, e + 1)]
    assert outcomes == ["fits", "out-of-memory"], (e, outcomes)
