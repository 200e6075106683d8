"""autobatch.find with the user's own eager step as the trial (issue 29), on the CPU with real
out-of-memory from the project's budget allocator. Each test names the wrong implementation it
catches."""
import json
import os
import subprocess
import sys

import pytest
import torch

import autobatch
import tiny_models

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "helpers")


def adamw(params):
    return torch.optim.AdamW(params)


def fresh(name, limit, *batches):
    """{B: outcome} of check_batch in a fresh Python process."""
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "fresh_check.py"), name, limit,
                          *map(str, batches)], check=True, capture_output=True, text=True,
                         timeout=600)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


# Catches: a search whose answer is not the boundary (a bisection that stops early, an answer
# taken from a prediction instead of a trial, peaks that miss the model's baseline so the limit
# is reached later in the fresh process), and a plan that is not exact.
@pytest.mark.parametrize("name,limit", [("resnet18", "210MiB"), ("llama", "40MiB"),
                                        ("gpt2", "40MiB")])
def test_answer_is_exact_in_a_fresh_process(name, limit):
    if name == "resnet18":
        pytest.importorskip("torchvision")  # not in the newest-torch environment
    model, example = tiny_models.MODELS[name]()
    # min_batch 2: ResNet-18's BatchNorm cannot train on one 3x32x32 sample (its last stage is
    # 1x1: "Expected more than 1 value per channel when training"), as in the user's own loop.
    result = autobatch.find(model, example, optimizer=adamw, memory_limit=limit,
                            target_batch=256, min_batch=2)
    assert result.status == "found"
    b = result.max_micro_batch
    assert b > 4, result.text
    fits = {t.micro_batch_size for t in result.trials
            if t.outcome == "fits" and t.micro_batches_per_step == 1}
    oom = {t.micro_batch_size for t in result.trials if t.outcome == "out-of-memory"}
    assert b in fits and (b + 1) in oom, result.text
    assert fresh(name, limit, b, b + 1) == {b: "fits", b + 1: "out-of-memory"}
    plan = result.plan
    assert sum(plan.micro_batches) * plan.world_size == 256
    assert max(plan.micro_batches) <= result.safe_micro_batch <= b
    assert abs(sum(plan.loss_weights) - 1.0) < 1e-3


# Catches: a Hugging Face output that needs a wrapper (ModelOutput not read for .loss), a dict
# batch passed positionally, and token ids made random floats (the embedding would raise).
def test_hugging_face_model_and_dict_batch_need_no_wrapper():
    model, example = tiny_models.llama()
    trial = autobatch.check_batch(model, example, 3, memory_limit="1GiB", optimizer=adamw)
    assert trial.outcome == "fits"
    assert set(trial.phase_peaks) >= {"inputs", "forward", "loss", "backward", "optimizer-step"}
    # The output's logits (B x T x vocab float32) are dropped before backward: forward's peak is
    # above the inputs' by at least them.
    logits = 3 * tiny_models.TOKENS * 512 * 4
    assert trial.phase_peaks["forward"] - trial.phase_peaks["inputs"] >= logits


def _state(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [(m, m.training) for m in model.modules()],
            [(p, p.requires_grad, p.grad) for p in model.parameters()])


def _live_tensors():
    import gc
    gc.collect()
    seen, count, total = set(), 0, 0
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.device.type == "cpu":
            st = o.untyped_storage()
            try:
                ptr = st.data_ptr()
            except RuntimeError:  # a fake tensor an earlier test's torch.export left: no memory
                continue
            count += 1
            if ptr not in seen:
                seen.add(ptr)
                total += st.nbytes()
    return count, total


# Catches: weights left as the last trial's steps made them (an optimizer step changes every
# parameter; BatchNorm's running stats and num_batches_tracked change in train mode), training
# flags left on (find trains in train mode), requires_grad or gradients replaced, the RNG state
# advanced by the trials (dropout, random targets), the user's optimizer stepped or its state
# touched, and tensors of the trials left alive (memory not back to its value).
def test_the_model_and_process_are_as_before():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 14 * 14, 10))
    model.eval()
    model[1].train()  # mixed flags
    model[0].bias.requires_grad_(False)
    user_opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                               momentum=0.9)
    x = torch.randn(2, 3, 16, 16)
    model(x).sum().backward()
    user_opt.step()  # momentum buffers exist, gradients are set
    opt_state = json.dumps(str(user_opt.state_dict()))
    momenta = [user_opt.state[p]["momentum_buffer"].clone() for p in user_opt.state]
    weights, flags, grads = _state(model)
    grad_values = [g.clone() if g is not None else None for _, _, g in grads]
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    before = _live_tensors()

    result = autobatch.find(model, x[:1], optimizer=user_opt, memory_limit="64MiB", max_batch=64)
    assert result.max_micro_batch == 64

    assert _live_tensors() == before
    assert torch.equal(torch.get_rng_state(), rng)
    after_weights, after_flags, after_grads = _state(model)
    for k, v in weights.items():
        assert torch.equal(v, after_weights[k]) and v.dtype == after_weights[k].dtype, k
    assert [t for _, t in flags] == [t for _, t in after_flags]
    for (p, r, g), (p2, r2, g2), value in zip(grads, after_grads, grad_values):
        assert p is p2 and r == r2 and g is g2
        assert (g is None and value is None) or torch.equal(g, value)
    assert json.dumps(str(user_opt.state_dict())) == opt_state
    assert all(torch.equal(a, user_opt.state[p]["momentum_buffer"])
               for a, p in zip(momenta, user_opt.state))


# Catches: a failed step whose tensors stay alive (the exception or its frames kept: the next
# trial would start above the baseline and the answer would drop), and an OOM treated as a model
# error.
def test_out_of_memory_frees_the_failed_step():
    model, example = tiny_models.gpt2()
    first = autobatch.check_batch(model, example, 1, memory_limit="40MiB", optimizer=adamw)
    failed = autobatch.check_batch(model, example, 4096, memory_limit="40MiB", optimizer=adamw)
    again = autobatch.check_batch(model, example, 1, memory_limit="40MiB", optimizer=adamw)
    assert failed.outcome == "out-of-memory" and failed.failed_phase in (
        "inputs", "forward", "loss", "backward", "optimizer-step")
    assert failed.failed_in_use_bytes > 0
    assert first.outcome == again.outcome == "fits"
    assert again.peak_bytes == first.peak_bytes


# Catches: a trial that ran out of memory after whole steps reporting none of them (the command's
# record counts them, trial_runner.cpp; scripts/bench/race.py's step counts of find() and the
# command differed by one a failure), or leaving their mean step_ms 0 (the command's record gives
# it, fillTrialResult). AdamW's state arrives with step 0's optimizer step, so the failure one
# above the answer comes in step 1, after one whole step.
def test_out_of_memory_record_counts_the_steps_before_it():
    model, x = tiny_models.mlp()
    # binsearch: its trials are all full (guided's trial one above the answer is a shortened
    # measuring trial, whose failure comes in its one step at the size: test_measuring.py).
    result = autobatch.find(model, x, optimizer=adamw, memory_limit="48MiB", steps_per_trial=3,
                            margin=0.0, strategy="binsearch")
    above = [t for t in result.trials if t.micro_batch_size == result.max_micro_batch + 1]
    assert above and above[0].outcome == "out-of-memory"
    assert above[0].steps_completed == 1, above[0]
    assert all(t.steps_completed == 3 for t in result.trials if t.outcome == "fits")
    assert above[0].step_ms > 0.0, above[0]  # its one whole step's time


# Catches: a LoRA model whose frozen base weights get gradients or optimizer state in the trial
# (the optimizer built over all parameters, requires_grad ignored).
def test_peft_lora_trains_only_its_adapters():
    peft = pytest.importorskip("peft")
    model, example = tiny_models.llama()
    full = autobatch.check_batch(model, example, 4, memory_limit="1GiB", optimizer=adamw)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8)
    lora = peft.get_peft_model(model, config)
    adapters = sum(p.numel() * p.element_size() for p in lora.parameters() if p.requires_grad)
    result = autobatch.find(lora, example, optimizer=adamw, memory_limit="1GiB", max_batch=4)
    assert result.memory["gradient_bytes"] == adapters
    # exp_avg and exp_avg_sq of each adapter, and its `step` (a float32 scalar tensor).
    count = sum(1 for p in lora.parameters() if p.requires_grad)
    assert result.memory["optimizer_state_bytes"] == 2 * adapters + 4 * count
    lora_trial = [t for t in result.trials if t.micro_batch_size == 4][-1]
    base = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    # Full fine-tuning holds gradients and two AdamW moments of every weight at its step.
    assert full.phase_peaks["optimizer-step"] - lora_trial.phase_peaks["optimizer-step"] > 2 * base


# Catches: activation checkpointing not in effect in the trial (the model run in eval mode, or
# the trial calling something else than the user's model).
def test_activation_checkpointing_shows_the_lower_peak():
    model, example = tiny_models.llama()
    plain = autobatch.check_batch(model, example, 16, memory_limit="1GiB", optimizer=adamw)
    model.activation_checkpointing_enable()
    ckpt = autobatch.check_batch(model, example, 16, memory_limit="1GiB", optimizer=adamw)
    assert ckpt.outcome == plain.outcome == "fits"
    assert ckpt.phase_peaks["backward"] < plain.phase_peaks["backward"]
    assert ckpt.phase_peaks["forward"] < 0.8 * plain.phase_peaks["forward"]


# Catches: ddp=True that holds no bucket (a DDP job's answer too large by one gradient copy per
# trial), or one of the wrong size; and a step function whose loss is not what is trained.
def test_ddp_buckets_and_a_step_function():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x = torch.randn(2, 64)
    plain = autobatch.check_batch(model, x, 100, memory_limit="64MiB")
    ddp = autobatch.check_batch(model, x, 100, memory_limit="64MiB", ddp=True)
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ddp.peak_bytes - plain.peak_bytes == gradients
    step = autobatch.check_batch(model, x, 100, memory_limit="64MiB",
                                 step=lambda m, b: m(b).float().mean())
    dropped = autobatch.check_batch(model, x, 100, memory_limit="64MiB", keep_output=False)
    assert step.outcome == "fits" and step.peak_bytes == dropped.peak_bytes  # the same step
    # Issue 40 row 3: by default the output is alive through backward, as in the hand-written
    # `out = model(x); loss(out).backward()`; a package that always dropped it (the former one)
    # answered batches that loop cannot hold. Here the peak is in backward: exactly the output's
    # 100 x 10 float32 more.
    assert plain.peak_bytes - dropped.peak_bytes == 100 * 10 * 4
    twice = autobatch.check_batch(model, x, 100, memory_limit="64MiB",
                                  step=lambda m, b: m(b).mean() + m(b.flip(0)).mean())
    assert twice.phase_peaks["backward"] > plain.phase_peaks["backward"]


# Catches trials that keep autocast's casts of the weights alive past the forward: find() runs the
# trials inside its own autocast(enabled=False), and torch empties the cast cache only when the
# outermost autocast exits, so every amp trial held the casts through backward, the optimizer's step
# and the next batch (an answer below the user's, whose autocast is the outermost), whether the
# autocast was precision='amp-bf16' or the step's own. B fits and B+1 does not in the user's plain
# loop, in fresh processes under the same budget.
def _own_autocast_step(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return tiny_models.amp_mlp_step(model, batch)


@pytest.mark.parametrize("precision,step", [("amp-bf16", tiny_models.amp_mlp_step),
                                            (None, _own_autocast_step)])
def test_an_amp_answer_is_the_plain_loops_under_its_outermost_autocast(precision, step):
    limit = 48 << 20
    model, example = tiny_models.amp_mlp()
    result = autobatch.find(model, example, step=step, optimizer=adamw, precision=precision,
                            memory_limit=limit, margin=0.0)
    b = result.max_micro_batch
    assert b > 100, result.text

    def plain(size):
        out = subprocess.run([sys.executable, os.path.join(HELPERS, "plain_amp_check.py"),
                              str(limit), "amp-bf16", str(size)], check=True,
                             capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])["outcome"]
    assert (plain(b), plain(b + 1)) == ("fits", "out-of-memory"), result.text
