"""autobatch.find(eval=...) and autobatch.check_eval_batch (issue 31): the largest evaluation
batch with the training state resident, the user's own model in eval mode under no_grad, on the
CPU with real out-of-memory from the project's budget allocator. Each test names the wrong
implementation it catches."""
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
MLP_LIMIT = "48MiB"


def adamw(params):
    return torch.optim.AdamW(params)


def fresh_eval(name, limit, *batches):
    """{E: [state_fits, fits, outcome]} of check_eval_batch in a fresh Python process."""
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "fresh_eval_check.py"), name, limit,
                          *map(str, batches)], check=True, capture_output=True, text=True,
                         timeout=600)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def mlp_eval():
    model, example = tiny_models.mlp()
    return autobatch.find(model, example, optimizer=adamw, memory_limit=MLP_LIMIT, margin=0,
                          eval=True)


# Catches: an evaluation search that is not the boundary (an answer taken from a prediction or a
# bisection that stops early), eval trials run with a graph (the answer would be no larger than
# the training batch), and a state in the search's process that a fresh process does not have
# (the optimizer state made once more per trial, or never).
def test_eval_batch_is_larger_than_training_and_exact_in_a_fresh_process(mlp_eval):
    r = mlp_eval
    e = r.eval_max_batch
    assert r.status == "found" and r.max_micro_batch > 4, r.text
    assert e > r.max_micro_batch, r.text
    assert r.eval_safe_batch == e  # margin 0
    evals = [t for t in r.trials if t.eval]
    assert evals and all(t.micro_batches_per_step == 2 for t in evals)
    fits = {t.micro_batch_size for t in evals if t.outcome == "fits"}
    oom = {t.micro_batch_size for t in evals if t.outcome == "out-of-memory"}
    assert e in fits and (e + 1) in oom, r.text
    assert fresh_eval("mlp", MLP_LIMIT, e, e + 1) == {
        e: [True, True, "fits"], e + 1: [True, False, "out-of-memory"]}


# Catches: a report that is not the CLI's for the same result (the keys of docs/evaluation.md's
# "Output": result.eval_*_batch, the eval section, eval trials marked, the text's evaluation
# section, AUTOBATCH_EVAL_BATCH), and a resident state without the optimizer's (AdamW: 2 x the
# parameters) or with the gradients though zero_grad frees them.
def test_report_has_the_clis_eval_section(mlp_eval):
    r = mlp_eval
    doc = r.raw
    assert doc["result"]["eval_max_batch"] == r.eval_max_batch
    assert doc["result"]["eval_safe_batch"] == r.eval_safe_batch
    e = doc["eval"]
    assert e["state"] == "training-resident" and e["state_fits"] is True
    assert e["training_batch"] == 1 and e["batches_per_trial"] == 2
    assert e["training_step"]["outcome"] == "fits"
    assert e["max_batch"] == r.eval_max_batch and e["trial_count"] == sum(t.eval for t in r.trials)
    params = r.memory["parameter_bytes"]
    assert 2 * params <= r.memory["optimizer_state_bytes"] < 2 * params + 4096  # + step counters
    # parameters + AdamW's 2 moments (+ its step counters, a few bytes each), no gradients
    assert 3 * params <= e["resident_bytes"] < 3 * params + 4096, e
    assert "evaluation trials (2 batches each, the previous output alive)" in r.text
    assert f"evaluation batch: max {r.eval_max_batch}, safe {r.eval_safe_batch}" in r.text
    assert f"AUTOBATCH_EVAL_BATCH={r.eval_safe_batch}" in r.env


class WideOutput(torch.nn.Module):
    """A small body with a wide output: 16 inputs -> 8192 outputs (32 KiB per sample in fp32),
    so that evaluation memory is mostly outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(16, 64)
        self.head = torch.nn.Linear(64, 8192)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


# Catches: an evaluation trial that drops the previous batch's output before the next batch runs
# (or runs one batch): its forward peak would hold one output, not two, and the answer would be
# about twice as large as what a loop with `output = model(x)` fits.
def test_previous_output_is_alive_while_the_next_batch_runs():
    model, example = WideOutput(), torch.randn(1, 16)
    limit = 24 << 20
    r = autobatch.find(model, example, optimizer=adamw, memory_limit=limit, margin=0,
                       eval="only")
    out = 8192 * 4  # bytes of one sample's output
    e = r.eval_max_batch
    last_fit = [t for t in r.trials if t.eval and t.micro_batch_size == e][-1]
    resident = r.eval["resident_bytes"]
    # forward of the second batch: the previous output and the new one are alive together
    assert last_fit.phase_peaks["forward"] - resident >= 2 * e * out, last_fit
    assert 2 * e * out <= limit - resident < 2 * (e + 1) * out + 3 * (e + 1) * 64 * 4 + (1 << 20)


# Catches: an evaluation beside the parameters only when the training state should be resident
# (eval=True no smaller than eval="only"), the optimizer state left out of the state, and
# zero_grad="zeros" not keeping the gradients (resident bytes equal with and without it).
def test_training_state_is_resident():
    model, example = tiny_models.mlp()
    kw = dict(optimizer=adamw, memory_limit=MLP_LIMIT, margin=0)
    with_state = autobatch.find(model, example, eval=True, **kw)
    alone = autobatch.find(model, example, eval="only", **kw)
    zeros = autobatch.check_eval_batch(model, example, 8, zero_grad="zeros", **kw)
    none = autobatch.check_eval_batch(model, example, 8, **kw)
    params = with_state.memory["parameter_bytes"]
    assert alone.eval["state"] == "parameters-only"
    assert alone.eval["resident_bytes"] < with_state.eval["resident_bytes"] - 2 * params + 4096
    assert alone.eval_max_batch > with_state.eval_max_batch
    # eval="only" is the run's answer, as --eval-only: result.search is the evaluation search
    assert alone.max_micro_batch == alone.eval_max_batch and all(t.eval for t in alone.trials)
    assert zeros.state_fits and none.state_fits and zeros.fits and none.fits
    assert zeros.resident_bytes - none.resident_bytes == params  # the gradients kept


# Catches: the training state not fitting reported as an evaluation result (fits, or an
# out-of-memory evaluation trial), and a search that raises its own error instead of saying so.
def test_training_state_that_does_not_fit_is_reported_as_such():
    model, example = tiny_models.mlp()
    params = sum(p.numel() * 4 for p in model.parameters())
    # room for the parameters and their gradients, not for AdamW's 2 moments as well
    c = autobatch.check_eval_batch(model, example, 4, optimizer=adamw,
                                   memory_limit=int(2.5 * params), margin=0)
    assert not c.state_fits and not c.fits and not c.fits_with_margin
    assert c.trial.outcome == "out-of-memory" and not c.trial.eval
    assert c.raw["check"]["state_fits"] is False and c.raw["status"] == "does-not-fit"
    assert "the training state does not fit" in c.text
    # eval="only": room for the parameters and almost nothing else, so no evaluation batch fits;
    # raised as the evaluation's DoesNotFit (the command's exit 3), not as a training answer
    with pytest.raises(autobatch.DoesNotFit, match="beside the parameters") as caught:
        autobatch.find(model, example, optimizer=adamw, memory_limit=params + 2048, margin=0,
                       eval="only")
    r = caught.value.result
    assert r.eval_max_batch == 0 and r.raw["status"] == "nothing-fits" and r.trials
    assert all(t.eval and t.outcome == "out-of-memory" for t in r.trials)


class Recorder(torch.nn.Module):
    """An MLP with dropout that records (training, grad enabled) at every forward, in a list
    outside the module (lists the module holds are put back after each trial, as its other
    attributes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Dropout(0.5),
                                       torch.nn.Linear(256, 4))
        _SEEN.clear()

    def forward(self, x):
        _SEEN.append((self.training, torch.is_grad_enabled()))
        return self.net(x)


_SEEN = []


# Catches: an evaluation trial in train mode or with a graph, and a search that leaves the model
# in eval mode, drops the user's gradients or moves the RNG.
def test_eval_trial_is_eval_mode_no_grad_and_everything_is_restored():
    model = Recorder()
    model.train()
    grads = []
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
        grads.append(p.grad)
    example = torch.randn(1, 32)
    rng = torch.get_rng_state()
    r = autobatch.find(model, example, optimizer=adamw, memory_limit="64MiB",
                       max_batch=64, eval=True)
    assert r.eval_max_batch == 64 and r.max_micro_batch == 64
    assert (False, False) in _SEEN and (True, True) in _SEEN
    assert all(m.training for m in model.modules())
    assert all(p.grad is g and bool((g == 0.5).all()) for p, g in zip(model.parameters(), grads))
    assert torch.equal(torch.get_rng_state(), rng)


# Catches: bad values taken silently (an unknown eval= sizing training only, eval="only" with a
# plan it cannot make, a check of a batch < 1, an unknown zero_grad).
def test_bad_values_are_usage_errors_naming_the_fix():
    model, example = tiny_models.mlp()
    cases = [
        (lambda: autobatch.find(model, example, eval="yes"), "'only'"),
        (lambda: autobatch.find(model, example, eval="only", target_batch=64),
         "drop target_batch"),
        (lambda: autobatch.check_eval_batch(model, example, 0), "int >= 1"),
        (lambda: autobatch.check_eval_batch(model, example, True), "int >= 1"),
        (lambda: autobatch.check_eval_batch(model, example, 4, eval=True), "drop it"),
        (lambda: autobatch.find(model, example, zero_grad="zero"), "'zeros'"),
    ]
    for call, fix in cases:
        with pytest.raises(autobatch.UsageError, match=fix):
            call()


class _RaisesInEval(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 10)

    def forward(self, x):
        if not self.training:
            raise ValueError("no evaluation path")
        return self.lin(x)


# Catches an evaluation trial's ModelError that leaves the search raw: it had no .result (the
# training search's verified answer lost) and did not say it came from evaluation. Now the error
# names the evaluation trial and carries the training answer.
def test_a_model_error_in_evaluation_keeps_the_training_answer():
    torch.manual_seed(0)
    with pytest.raises(autobatch.ModelError, match="in an evaluation trial") as info:
        autobatch.find(_RaisesInEval(), torch.randn(1, 64), memory_limit="8MiB", margin=0,
                       eval=True)
    result = info.value.result
    assert result is not None and result.safe_micro_batch > 100, result
    assert info.value.micro_batch >= 1 and isinstance(info.value.__cause__, ValueError)
