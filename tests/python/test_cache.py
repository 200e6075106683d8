"""autobatch.find(cache=...): the command's result cache (docs/cache.md) for the user's own eager
step (issue 29). On the CPU with real out-of-memory from the budget allocator. Each test names the
wrong implementation it catches."""
import functools
import json
import re

import pytest
import torch

import autobatch
import tiny_models

LIMIT = "24MiB"


def net(p=0.1):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Dropout(p),
                               torch.nn.Linear(1024, 8))


def find(model, x, folder, **kwargs):
    return autobatch.find(model, x, cache=folder, **{"memory_limit": LIMIT, "target_batch": 4000,
                                                     **kwargs})


# Catches: a cache that never stores, or searches again on a hit; a hit answered without its
# confirming trial, or with another micro-batch than the cached answer; a hit whose plan is not
# the search's; a model left changed by the confirming trial.
def test_a_repeat_search_is_answered_after_one_confirming_trial(tmp_path):
    model, x = net(), torch.randn(1, 256)
    first = find(model, x, tmp_path)
    assert first.cache["outcome"] == "miss" and first.cache["store_error"] == ""
    assert len(first.trials) > 3, first.text
    assert [p.name for p in tmp_path.iterdir()] == [f"{first.cache['key']}.json"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    again = find(model, x, tmp_path)
    assert again.cache["outcome"] == "hit" and again.cache["cached"], again.text
    assert again.cache["key"] == first.cache["key"]
    assert again.cache["cached_trials"] == len(first.trials)
    assert (again.max_micro_batch, again.safe_micro_batch) == (first.max_micro_batch,
                                                              first.safe_micro_batch)
    assert again.plan == first.plan and again.plan.accumulation_steps >= 2
    (trial,) = again.trials
    # The plan accumulates: the confirming trial is its largest micro-batch, 2 per step.
    assert (trial.micro_batch_size, trial.micro_batches_per_step) == (
        again.plan.micro_batch_size, 2)
    assert trial.outcome == "fits"
    assert trial.peak_bytes <= again.memory_limit_bytes - again.margin_bytes
    assert re.search(r"cached +from .* confirmed by the trial above", again.text), again.text
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# Catches: cache_trust that still runs a trial, or one honoured without a cache.
def test_trust_answers_a_hit_without_a_trial(tmp_path):
    model, x = net(), torch.randn(1, 256)
    first = find(model, x, tmp_path)
    trusted = find(model, x, tmp_path, cache_trust=True)
    assert trusted.cache["outcome"] == "hit" and trusted.cache["trusted"]
    assert trusted.trials == [] and trusted.safe_micro_batch == first.safe_micro_batch


# Catches: a key blind to what the memory depends on, so that a size found for one setting is
# reused for another (the public failure of issue 18: a size found at 64 tokens reused at 512):
# the inputs' shape, the margin, the optimizer, the precision, a module's setting (Dropout's p:
# eager returns the input at p = 0, no mask) and the code of a forward. And a key that changes
# with what does not matter (the target batch, the world size: a hit plans again).
def test_the_key_holds_what_the_answer_depends_on(tmp_path):
    model, x = net(), torch.randn(1, 256)
    key = find(model, x, tmp_path).cache["key"]
    same = find(model, x, tmp_path, target_batch=512, world_size=2)
    assert same.cache["outcome"] == "hit" and same.cache["key"] == key
    assert sum(same.plan.micro_batches) * 2 == 512
    fields = autobatch.find(model, x, memory_limit=LIMIT, cache=tmp_path,
                            cache_trust=True).cache["fields"]
    assert fields["memory_limit_bytes"] == str(24 << 20) and fields["format"] == "python-eager"
    changed = {
        "inputs": lambda: find(model, torch.randn(1, 2, 256), tmp_path),
        "margin": lambda: find(model, x, tmp_path, margin=0.1),
        "optimizer": lambda: find(model, x, tmp_path, optimizer=lambda p: torch.optim.SGD(p)),
        "precision": lambda: find(model, x, tmp_path, precision="amp-bf16"),
        "dropout p": lambda: find(net(p=0.0), x, tmp_path),
    }
    for what, run in changed.items():
        r = run()
        assert r.cache["outcome"] == "miss" and r.cache["key"] != key, what

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    m = Net()
    key = find(m, x, tmp_path).cache["key"]
    Net.forward = lambda self, x: self.b(torch.relu(self.a(x)) * torch.sigmoid(self.a(x)))
    assert find(m, x, tmp_path).cache["key"] != key


# Catches: a cached answer taken on trust when it no longer fits (an entry edited, or written
# on a machine where more fit): the confirming trial must fail, the entry be dropped and the
# search run and store its own answer.
def test_an_entry_that_does_not_confirm_is_dropped_and_searched_again(tmp_path):
    model, x = net(), torch.randn(1, 256)
    first = find(model, x, tmp_path)
    path = tmp_path / f"{first.cache['key']}.json"
    entry = json.loads(path.read_text())
    entry.update(max_micro_batch=first.max_micro_batch * 4, safe_micro_batch=first.max_micro_batch * 4,
                 accumulation_max_micro_batch=0)
    path.write_text(json.dumps(entry))
    r = find(model, x, tmp_path, target_batch=None)
    assert r.cache["outcome"] == "confirm-failed", r.text
    assert r.trials[0].micro_batch_size == first.max_micro_batch * 4
    assert r.trials[0].outcome == "out-of-memory"
    assert r.safe_micro_batch == first.safe_micro_batch
    assert any("did not confirm" in w for w in r.warnings)
    assert json.loads(path.read_text())["safe_micro_batch"] == first.safe_micro_batch


# Catches: a cache option accepted where it means nothing (trust without a cache, the evaluation
# search, a folder given as a number), or a bad one failing later as another error.
@pytest.mark.parametrize("kwargs,words", [
    ({"cache_trust": True}, "cache_trust=True needs cache="),
    ({"cache": True, "eval": True}, "drop cache= when you pass eval="),
    ({"cache": 5}, "cache: expected True"),
    ({"cache": "", "cache_trust": False}, "cache: expected True"),
    ({"cache": True, "cache_trust": "yes"}, "cache_trust: expected True or False"),
])
def test_usage_errors(kwargs, words):
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.find(net(), torch.randn(1, 256), memory_limit=LIMIT, target_batch=64, **kwargs)


# Catches: the default folder not the command's ($AUTOBATCH_CACHE_DIR first).
def test_cache_true_uses_the_commands_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "results"))
    r = autobatch.find(net(), torch.randn(1, 256), memory_limit=LIMIT, cache=True)
    assert r.cache["dir"] == str(tmp_path / "results")
    assert (tmp_path / "results" / f"{r.cache['key']}.json").is_file()


# Catches: a fingerprint (the cache key's model field) blind to what changes a Hugging Face
# model's memory without changing its structure: activation checkpointing (a flag on each layer)
# and the attention implementation (a value of the config the modules hold).
def test_the_fingerprint_sees_checkpointing_and_the_attention_implementation():
    model, example = tiny_models.llama()
    plain = autobatch.fingerprint(model, example)
    assert autobatch.fingerprint(model, example) == plain
    model.config._attn_implementation = "eager"
    eager = autobatch.fingerprint(model, example)
    model.config._attn_implementation = "sdpa"
    assert eager != plain and autobatch.fingerprint(model, example) == plain
    model.activation_checkpointing_enable()
    assert autobatch.fingerprint(model, example) not in (plain, eager)


def _views_loss(output, batch, k):
    return output.repeat(k, 1).exp().mean()


class _Views(torch.nn.Module):
    """A forward whose memory depends on a setting held in a dict, an int of the example, and a
    tensor held outside the parameters."""

    def __init__(self, views=1, held=1):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(256, 64), torch.nn.Linear(64, 8)
        self.cfg = {"views": views}
        self.table = torch.zeros(held)

    def forward(self, x, k=1):
        return self.b(torch.relu(self.a(x.repeat(self.cfg["views"] * k, 1)))) + self.table[:1]


class _ScaledLoss(torch.nn.Module):
    def forward(self, output, batch):
        return output.exp().mean()


class _WiderLoss(torch.nn.Module):
    def forward(self, output, batch):
        return output.repeat(8, 1).exp().mean()


def _steps(k):
    return lambda model, batch: model(batch).repeat(k, 1).mean()


def _grouped_sgd(momentum):
    return lambda params: torch.optim.SGD([{"params": params, "momentum": momentum}], lr=0.1)


def _patched(model):
    model.forward = lambda x, k=1: model.b(torch.relu(model.a(x.repeat(8, 1))))
    return model


def _hooked(model):
    model.a.register_forward_hook(lambda module, args, out: out.exp() * out.sin())
    return model


# Catches a cache key blind to what changes a step's memory, which served another setup's answer as
# a hit (with cache_trust one that did not fit): a step's closure, a functools.partial's argument, a
# loss module's forward, an optimizer's param-group option, a forward hook, a setting in a dict, a
# plain value in the example, a tensor held as an attribute, a forward patched on the instance,
# autocast_cache. Each pair's keys differ; the same setup built twice keys the same (a hit across
# processes stays a hit).
@pytest.mark.parametrize("what, first, second", [
    ("step closure", dict(step=_steps(1)), dict(step=_steps(8))),
    ("partial", dict(loss_fn=functools.partial(_views_loss, k=1)),
     dict(loss_fn=functools.partial(_views_loss, k=8))),
    ("loss module", dict(loss_fn=_ScaledLoss()), dict(loss_fn=_WiderLoss())),
    ("param group", dict(optimizer=_grouped_sgd(0.9)), dict(optimizer=_grouped_sgd(0.0))),
    ("hook", dict(), dict(model=_hooked)),
    ("dict setting", dict(model=lambda m: _Views(views=1)), dict(model=lambda m: _Views(views=8))),
    ("example value", dict(example=lambda x: (x, 1)), dict(example=lambda x: (x, 8))),
    ("held tensor", dict(model=lambda m: _Views(held=1)), dict(model=lambda m: _Views(held=4096))),
    ("patched forward", dict(), dict(model=_patched)),
    ("autocast_cache", dict(precision="amp-bf16"),
     dict(precision="amp-bf16", autocast_cache=False)),
])
def test_the_key_sees_what_a_step_closes_over(tmp_path, what, first, second):
    def key(setup):
        setup = dict(setup)
        model = setup.pop("model", lambda m: m)(_Views())
        example = setup.pop("example", lambda x: x)(torch.randn(1, 256))
        return autobatch.find(model, example, cache=tmp_path, cache_trust=True, max_batch=16,
                              memory_limit=LIMIT, **setup).cache["key"]
    assert key(first) == key(first), what
    assert key(first) != key(second), what


# Catches an optimizer field of the key that holds the defaults only: a param group's own option
# (SGD's momentum, which makes its buffers) is in it too.
def test_the_optimizer_field_holds_param_groups_own_options(tmp_path):
    fields = autobatch.find(_Views(), torch.randn(1, 256), cache=tmp_path, cache_trust=True,
                            max_batch=16, memory_limit=LIMIT,
                            optimizer=_grouped_sgd(0.9)).cache["fields"]["optimizer"]
    assert "('momentum', '0.9')" in fields, fields
