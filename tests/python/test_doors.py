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
HELPERS = os.path.join(HERE, "helpers")


def run(script, *args):
    """One fresh process of a check script; its last stdout line as JSON."""
    return run_env({}, script, *args)


def run_env(env, script, *args):
    """run() with `env` added to the environment."""
    out = subprocess.run([sys.executable, os.path.join(HELPERS, script), *map(str, args)],
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


# Catches find_sharded run in a worker thread: the next call, in any thread, crashed the process
# in torch's fake-tensor code (a segmentation fault). Refused there before any work.
def test_find_sharded_outside_the_main_thread_is_refused():
    import concurrent.futures
    import tiny_models
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(autobatch.find_sharded, tiny_models.ShardedMlp,
                           tiny_models.shard_units, tiny_models.sharded_mlp_batch(),
                           world_size=4, step=tiny_models.sharded_mlp_step,
                           optimizer=tiny_models.adamw, memory_limit="24MiB", device="cpu")
        with pytest.raises(autobatch.UsageError, match="runs in the main thread only"):
            call.result()


# Catches the enable_input_require_grads hook that activation checkpointing leaves on the input
# embeddings of a plain (not PEFT) model: its disable removes it only for PEFT, so every call of
# fit_training_arguments(activation_checkpointing=True) left one more.
def test_checkpointing_for_the_trials_leaves_no_hook(tmp_path):
    pytest.importorskip("transformers")
    import autobatch.transformers as abt
    import tiny_models
    from transformers import TrainingArguments
    model, example = tiny_models.llama()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             activation_checkpointing=True, per_device_train_batch_size=2)
    embeddings = model.get_input_embeddings()
    before = len(embeddings._forward_hooks)
    for _ in range(2):
        abt.fit_training_arguments(args, model, example, 8, memory_limit="40MiB")
    assert len(embeddings._forward_hooks) == before
    assert not getattr(model, "is_activation_checkpointing", False)


# Catches autobatch's own TypeError on a loss_fn that returns (loss, metrics), a dict or a
# per-sample vector, reported as the model's error (the vector only at micro-batch 2).
@pytest.mark.parametrize("loss_fn, words", [
    (lambda out, batch: (out.mean(), {"acc": 1.0}), "returned a tuple of 2"),
    (lambda out, batch: {"loss": out.mean()}, "returned a dict"),
    (lambda out, batch: out.mean(dim=1), "a tensor of shape (1,)"),
])
def test_a_loss_fn_that_returns_more_than_the_loss_is_a_usage_error(loss_fn, words):
    model, x = mlp()
    with pytest.raises(autobatch.UsageError, match="loss_fn: expected it to return") as e:
        autobatch.find(model, x, loss_fn=loss_fn, memory_limit="16MiB")
    assert words in str(e.value)


# Catches a DataLoader's (inputs, targets) tuple passed as model(*batch) with an error that did
# not say how to size such a job.
def test_a_tuple_batch_the_model_cannot_take_points_to_step():
    model, x = mlp()
    with pytest.raises(autobatch.ModelError, match="step=lambda model, batch"):
        autobatch.find(model, (x, torch.zeros(1, dtype=torch.long)), memory_limit="16MiB")


# Catches check_batch taking options it cannot apply: micro_batches_per_step unchecked, and the
# search's bounds and time limit silently ignored (no deadline is set for one trial, so a
# time_limit would look applied and bound nothing).
@pytest.mark.parametrize("options, words", [
    ({"micro_batches_per_step": 0}, "micro_batches_per_step: expected an int >= 1"),
    ({"micro_batches_per_step": -1}, "micro_batches_per_step: expected an int >= 1"),
    ({"micro_batches_per_step": 2.0}, "micro_batches_per_step: expected an int >= 1"),
    ({"micro_batches_per_step": "2"}, "micro_batches_per_step: expected an int >= 1"),
    ({"micro_batches_per_step": True}, "micro_batches_per_step: expected an int >= 1"),
    ({"micro_batches_per_step": None}, "micro_batches_per_step: expected an int >= 1"),
    ({"time_limit": 5}, "time_limit bounds or plans a search"),
    ({"max_batch": 8, "min_batch": 2}, "max_batch, min_batch bound or plan a search"),
    ({"dataset_size": 100}, "dataset_size bounds or plans a search"),
    ({"target_batch": 64}, "target_batch bounds or plans a search"),
])
def test_check_batch_refuses_what_one_trial_cannot_apply(options, words):
    model, x = mlp()
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.check_batch(model, x, 4, memory_limit="16MiB", **options)


# Catches the docs and the parser disagreeing: "1.5 GB" is read as the command reads it.
def test_a_size_with_a_space_before_its_unit_is_read_as_the_command_reads_it():
    model, x = mlp()
    trial = autobatch.check_batch(model, x, 2, memory_limit="8 MiB")
    assert trial.outcome == "fits"
    from autobatch._options import _limit
    assert _limit("1.5 GB") == 1_500_000_000 and _limit("8 MiB") == 8 << 20
    with pytest.raises(autobatch.UsageError, match="none around it"):
        _limit(" 8MiB")


# Catches an extension that cannot load for a missing system library blamed on torch ("rebuild
# it against this torch").
def test_a_missing_library_is_named():
    from autobatch import _load_failure
    text = _load_failure("libfmt.so.9: cannot open shared object file: No such file or directory")
    assert "needs the shared library libfmt.so.9" in text and "reinstall" not in text
    assert "reinstall autobatch" in _load_failure("undefined symbol: _ZN3c10")


# Catches tensors that outlive their trial going unnamed: a forward hook that appends
# `o.detach()` to a list of the user's kept every trial's activations, each trial ran with the
# earlier ones alive, and the result said only "non-monotonic" (safe 19 against max 94).
def test_tensors_a_step_keeps_past_its_end_are_named():
    model, x = mlp()
    saved = []

    def save_activations(module, args, output):
        saved.append(output.detach())
    hook = model[0].register_forward_hook(save_activations)
    try:
        r = autobatch.find(model, x, memory_limit="16MiB", margin=0, max_trials=6)
    finally:
        hook.remove()
    notes = [w for w in r.warnings if "stay alive after them" in w]
    assert saved and notes, r.warnings
    assert "in the closure of the function" in notes[0] and "save_activations" in notes[0]
    saved.clear()
    clean = autobatch.find(model, x, memory_limit="16MiB", margin=0, max_trials=6)
    assert not any("stay alive after them" in w for w in clean.warnings), clean.warnings


# Catches find_sharded's eval= results that carried no evaluation sizes, and an eval="only"
# text that called the evaluation batch a micro-batch beside a training maximum never sized.
def test_find_sharded_says_which_batch_it_sized():
    from test_sharded import find_mlp
    only = find_mlp(4, eval="only")
    assert only.eval_safe_batch == min(r.result.eval_safe_batch for r in only.ranks) > 0
    text = str(only)
    assert f"evaluation batch {only.eval_safe_batch} (max {only.eval_max_batch})" in text
    assert "micro-batch" not in text and only.to_dict()["eval"]["state"] == "parameters-only"
    both = find_mlp(4, eval=True)
    assert 0 < both.eval_safe_batch and both.to_dict()["eval"]["state"] == "training-resident"
    assert f"evaluation batch {both.eval_safe_batch}" in str(both)
    assert find_mlp(4).eval_safe_batch == 0 and "eval" not in find_mlp(4).to_dict()


# Catches fit_training_arguments refusing a call without a target, where the Trainer's
# auto_find_batch_size it replaces needs none: per_device_train_batch_size is then the cap (never
# grown past), and gradient_accumulation_steps is left as the user set it.
def test_fit_training_arguments_without_a_target_works_as_auto_find_batch_size(tmp_path):
    pytest.importorskip("transformers")
    import autobatch.transformers as abt
    import tiny_models
    from transformers import TrainingArguments
    model, example = tiny_models.llama()

    def args(size):
        return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=size, gradient_accumulation_steps=3,
                                 auto_find_batch_size=True)
    small, r = abt.fit_training_arguments_with_result(args(8), model, example,
                                                      memory_limit="40MiB")
    assert (small.per_device_train_batch_size, small.gradient_accumulation_steps) == (8, 3)
    assert r.max_micro_batch == 8 and r.plan is None and small.auto_find_batch_size is False
    large, r = abt.fit_training_arguments_with_result(args(512), model, example,
                                                      memory_limit="40MiB")
    assert large.per_device_train_batch_size == r.safe_micro_batch < 512
    assert large.gradient_accumulation_steps == 3


class _CompilesPerSize(torch.nn.Module):
    """A forward whose first call at each new batch size costs 1.2 s, as torch.compile's
    compilation per shape does (without dynamic=True); later calls cost nothing more."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(256, 10)
        self.compiled = set()

    def forward(self, x):
        if x.shape[0] not in self.compiled:
            import time
            time.sleep(1.2)
            self.compiled.add(x.shape[0])
        return self.net(x)


# Catches a compiled model's compilation counted as step time: the mean of a trial's steps
# predicted 21,208 s for a trial that runs in seconds, and the time budget stopped the search at
# micro-batch 1 (eager: 1972). The step time is the steps' after the first; the first steps'
# excess is said in the warnings.
def test_compilation_at_a_new_size_is_not_step_time():
    torch.manual_seed(0)
    r = autobatch.find(_CompilesPerSize(), torch.randn(1, 256), memory_limit="16MiB", margin=0,
                       time_limit=120, max_trials=8)
    full = [t for t in r.trials if t.steps_completed >= 2 and not t.shortened]
    assert full and all(t.step_ms < 500 for t in full), [(t.micro_batch_size, t.step_ms)
                                                          for t in r.trials]
    assert any("the first step at" in w and "compilation per shape" in w for w in r.warnings)
    assert r.max_micro_batch > 100


# Catches Result.micro_batch answering the safe micro-batch beside the plan's accumulation steps:
# with accumulation the two do not pair (66 x 8 for a target of 256 where the plan is 32 x 8; a
# new user's loop ran out of memory at 66 x 2), so micro_batch x accumulation_steps must be the
# target for a uniform plan, and micro_batch the plan's own.
def test_the_micro_batch_to_train_with_is_the_plans():
    model, x = mlp()
    r = autobatch.find(model, x, memory_limit="8MiB", margin=0, target_batch=1 << 16,
                       plan="uniform", max_batch=4096)
    assert r.plan is not None and r.plan.accumulation_steps > 1
    assert r.micro_batch == r.plan.micro_batch_size
    assert r.micro_batch * r.accumulation_steps == 1 << 16
    assert r.micro_batch <= r.safe_micro_batch
    model, x = mlp()
    no_target = autobatch.find(model, x, memory_limit="8MiB", margin=0, max_batch=4096)
    assert no_target.plan is None and no_target.micro_batch == no_target.safe_micro_batch
