"""The package as users really call it (issue 40, "hostile input, third round"): each test is a
row of the issue, fails on the code before it, and names the wrong implementation it catches."""
import collections
import random
import threading

import pytest
import torch

import autobatch

LIMIT = "24MiB"


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def x():
    return torch.randn(1, 32)


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# Row 1. Catches the rebuild of an optimizer instance as cls(groups, **defaults): torch 2.11's
# AdamW.defaults holds decoupled_weight_decay, which AdamW() does not take, so every AdamW
# instance failed with TypeError. Every class of torch.optim the model allows runs, the instance
# untouched; LBFGS is refused by name, Muon over parameters that are not 2-D too (its instance
# over the 2-D weights runs), SparseAdam on dense gradients fails in its own words.
def test_every_optimizer_instance_is_rebuilt():
    refused = {"LBFGS": "closure", "SparseAdam": None}
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or \
                cls is torch.optim.Optimizer:
            continue
        model = mlp()
        params = [p for p in model.parameters() if p.dim() == 2 or name != "Muon"]
        opt = cls(params)
        before = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        if name in refused and refused[name] is not None:
            with pytest.raises(autobatch.UsageError, match=refused[name]):
                autobatch.check_batch(model, x(), 4, optimizer=opt, memory_limit=LIMIT)
            continue
        if name == "SparseAdam":  # dense gradients: its own error, as ModelError
            with pytest.raises(autobatch.ModelError, match="SparseAdam"):
                autobatch.check_batch(model, x(), 4, optimizer=opt, memory_limit=LIMIT)
            continue
        trial = autobatch.check_batch(model, x(), 4, optimizer=opt, memory_limit=LIMIT)
        assert trial.outcome == "fits", name
        assert all(float(v.get("step", 0)) == 0 for v in opt.state.values()), name  # not stepped
        assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == before, name


def test_muon_over_parameters_that_are_not_2d_is_refused():
    muon = getattr(torch.optim, "Muon", None)
    if muon is None:
        pytest.skip("this torch has no Muon")
    with pytest.raises(autobatch.UsageError, match="2-D parameters only"):
        autobatch.check_batch(mlp(), x(), 4, optimizer=muon, memory_limit=LIMIT)


# Row 4. Catches a factory that returns the user's existing optimizer: the trials stepped it (its
# step count went 1 -> 13) and its state was never counted.
def test_a_factory_returning_an_existing_optimizer_is_refused():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(autobatch.UsageError, match="already exists"):
        autobatch.find(model, x(), optimizer=lambda p: opt, memory_limit=LIMIT)
    assert not opt.state
    model(x()).sum().backward()
    opt.step()
    steps = opt.state[next(iter(opt.state))]["step"].item()
    with pytest.raises(autobatch.UsageError, match="already exists"):
        autobatch.find(model, x(), optimizer=lambda p: opt, memory_limit=LIMIT)
    assert opt.state[next(iter(opt.state))]["step"].item() == steps


# Row 5. Catches plans read from the JSON's micro_batches list, which is null above 4096 steps:
# autobatch.plan(1, 4097) raised TypeError, and find lost its whole search at the end.
def test_plans_of_any_size():
    p = autobatch.plan(1, 4097)
    assert p.accumulation_steps == 4097 and len(p.micro_batches) == 4097
    assert p.micro_batches[4096] == 1 and sum(p.loss_weights) == pytest.approx(1.0)
    huge = autobatch.plan(3, 2 ** 40 + 1, kind="balanced")
    assert sum(b * n for b, n, _ in huge.groups) == 2 ** 40 + 1
    assert len(huge.micro_batches) == huge.accumulation_steps
    r = autobatch.find(mlp(), x(), memory_limit=LIMIT, max_batch=4, target_batch=20000)
    assert r.plan.effective_batch == 20000 and r.plan.accumulation_steps == 5000


class Counting(torch.nn.Module):
    """A Linear that records the batch of every forward it runs (``calls``): a test that expects
    a refusal before any trial expects none."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 4)
        self.calls = []

    def forward(self, v):
        self.calls.append(v.shape[0])
        return self.lin(v)


# Rows 6 and 13. Catches options taken as "no limit" or cast raw: memory_limit=0 sized against
# the whole machine, min_batch="4" raised pybind11's RuntimeError, 2.5 and 2.0 were truncated, a
# margin or reserve that leaves nothing ran trials first, " 8MiB " said "(no number)".
@pytest.mark.parametrize("options,match", [
    ({"memory_limit": 0}, "more than 0 bytes"),
    ({"memory_limit": "0"}, "more than 0 bytes"),
    ({"memory_limit": "0GiB"}, "more than 0 bytes"),
    ({"memory_limit": " 8MiB "}, "none around it"),
    ({"memory_limit": LIMIT, "min_batch": "4"}, "min_batch: expected an int"),
    ({"memory_limit": LIMIT, "max_batch": 2.5}, "max_batch: expected an int"),
    ({"memory_limit": LIMIT, "world_size": 2.0}, "world_size: expected an int"),
    ({"memory_limit": LIMIT, "dataset_size": 1e4}, "dataset_size: expected an int"),
    ({"memory_limit": LIMIT, "time_limit": "10"}, "time_limit: expected seconds"),
    ({"memory_limit": "8MiB", "margin": "100MiB"}, "margin: .* not less than"),
    ({"memory_limit": "8MiB", "reserve": "8MiB"}, "reserve: .* leave nothing"),
])
def test_bad_options_are_usage_errors_before_any_trial(options, match):
    model = Counting()
    with pytest.raises(autobatch.UsageError, match=match):
        autobatch.find(model, x(), **options)
    assert model.calls == []


# Row 7 (the second half). Catches a second search in the same process at the same time, which
# met the first one's budget allocator ("expected no other TrialRunner"): a UsageError in the
# user's terms, and the first search unharmed.
def test_a_second_search_at_the_same_time_is_a_usage_error():
    started, release, errors, results = threading.Event(), threading.Event(), [], []

    class Waiting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, v):
            started.set()
            release.wait(30)
            return self.lin(v)

    def first():
        results.append(autobatch.check_batch(Waiting(), x(), 2, memory_limit=LIMIT))
    t = threading.Thread(target=first, name="first-search")
    t.start()
    assert started.wait(30)
    try:
        autobatch.find(mlp(), x(), memory_limit=LIMIT)
    except autobatch.UsageError as e:
        errors.append(str(e))
    release.set()
    t.join(60)
    assert errors and "another autobatch search is running" in errors[0], errors
    assert "first-search" in errors[0]
    assert results and results[0].outcome == "fits"


# Rows 2 and 8. Catches state the search left changed or did not count: a tensor attribute built
# before the search (not counted: the answer did not fit a fresh process), a GRU-style carried
# state left as the trials' shape, a buffer registered in forward left behind, a module's
# generator, Python's and numpy's generators advanced, the example's .grad changed.
def test_the_model_and_the_process_as_they_were():
    np = pytest.importorskip("numpy")

    class Stateful(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)
            self.table = torch.zeros(512 * 1024)  # 2 MiB, a plain attribute
            self.hidden = torch.zeros(1, 4)
            self.gen = torch.Generator().manual_seed(7)

        def forward(self, v):
            random.random()
            np.random.rand()
            noise = torch.rand(v.shape[0], 4, generator=self.gen)
            self.hidden = self.lin(v).detach()[:1] + self.hidden  # carried across calls
            if "seen" not in self._buffers:
                self.register_buffer("seen", torch.ones(1))
            return self.lin(v) + noise + self.table[:4]
    model = Stateful()
    example = torch.randn(1, 32, requires_grad=True)
    hidden, gen_state = model.hidden, model.gen.get_state()
    py_state, np_state = random.getstate(), np.random.get_state()
    r = autobatch.find(model, example, memory_limit=LIMIT)
    assert model.hidden is hidden and model.hidden.shape == (1, 4)
    assert torch.equal(model.gen.get_state(), gen_state)
    assert "seen" not in model._buffers
    assert random.getstate() == py_state
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    assert example.grad is None
    note = [w for w in r.warnings if "neither parameters nor buffers" in w]
    assert note and "table (2.00 MiB)" in note[0], r.warnings
    # The table counts: the same model without it fits more.
    del model.table
    model.forward = lambda v: model.lin(v)
    bare = autobatch.find(model, example, memory_limit=LIMIT)
    assert bare.max_micro_batch > r.max_micro_batch


# Row 9. Catches trials run in the caller's grad mode: under no_grad the loss had no grad_fn and
# the model was blamed; inference_mode is refused in the caller's terms.
def test_grad_modes_of_the_caller():
    model = mlp()
    with torch.no_grad():
        r = autobatch.find(model, x(), memory_limit=LIMIT, max_batch=64)
        assert not torch.is_grad_enabled()
    assert r.max_micro_batch == 64
    with torch.inference_mode():
        with pytest.raises(autobatch.UsageError, match="inference_mode"):
            autobatch.find(model, x(), memory_limit=LIMIT)


# Row 10. Catches batches taken only as dict: a tokenizer's BatchEncoding (a UserDict) was
# refused, and a defaultdict made the batch maker raise (defaultdict(items) needs a factory).
def test_any_mapping_is_a_batch():
    class Keyed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, features, scale):
            return self.lin(features) * scale

    class Encoding(collections.UserDict):
        pass
    for batch in (Encoding(features=x(), scale=torch.ones(1, 1)),
                  collections.defaultdict(list, features=x(), scale=torch.ones(1, 1))):
        r = autobatch.find(Keyed(), batch, memory_limit=LIMIT, max_batch=32)
        assert r.max_micro_batch == 32, type(batch)


# Row 11. Catches lazy modules passed uninitialized: torch's raw ValueError escaped.
def test_lazy_modules_are_a_usage_error():
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with pytest.raises(autobatch.UsageError, match="run one forward"):
        autobatch.find(model, x(), memory_limit=LIMIT)


# Row 12. Catches a ModelError raised without the search's result: the sizes verified before the
# failure are in .result, as docs/python.md says.
def test_a_model_error_carries_the_verified_sizes():
    class Failing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, v):
            if v.shape[0] > 40:
                raise ValueError("shapes above 40 are not supported")
            return self.lin(v)
    with pytest.raises(autobatch.ModelError, match="shapes above 40") as info:
        autobatch.find(Failing(), x(), memory_limit=LIMIT)
    result = info.value.result
    assert result is not None and 0 < result.max_micro_batch <= 40
    assert all(t.micro_batch_size <= 40 for t in result.trials
               if t.outcome == "fits" and not t.cancelled)
    assert result.trials[-1].cancelled and result.trials[-1].micro_batch_size > 40
    assert isinstance(info.value.__cause__, ValueError)


# Row 14. Catches a Hugging Face model called without labels failing with a message that never
# names them.
def test_a_transformers_model_without_labels_names_them():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                     n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (1, 16))
    with pytest.raises(autobatch.ModelError, match="labels"):
        autobatch.find(model, {"input_ids": ids}, memory_limit="64MiB")


# Row 7 (the first half). Catches another thread's allocations counted as the trials' without a
# word (a background thread allocating 5 MiB made the answer 746 instead of 2322, status found):
# the result says other work ran. The other thread allocates inside every forward (the forward
# waits for it), so it runs while a trial does whatever the scheduler does: a free-running thread
# was not always given the GIL during the short trials (a CI run then gave no warning).
def test_other_threads_allocations_are_said():
    request, done, stop = threading.Event(), threading.Event(), threading.Event()

    def serve():  # a data loader's prefetch, say
        while not stop.is_set():
            if request.wait(0.1):
                request.clear()
                torch.empty(256 * 1024)  # 1 MiB, released at once
                done.set()

    class WaitsForAnotherThread(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, v):
            done.clear()
            request.set()
            if not done.wait(10):
                raise RuntimeError("the other thread did not allocate within 10 s")
            return self.lin(v)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        r = autobatch.find(WaitsForAnotherThread(), x(), memory_limit=LIMIT, max_batch=256)
    finally:
        stop.set()
        t.join(10)
    assert any("other threads of this process allocated" in w for w in r.warnings), r.warnings
    alone = autobatch.find(mlp(), x(), memory_limit=LIMIT, max_batch=256)
    assert not any("other threads" in w for w in alone.warnings), alone.warnings


# Catches state put back by rebinding alone: a buffer that forward replaces (an EMA), lists and
# dicts filled in place, a counter, a tensor attribute changed in place, a generator kept in a list;
# the cache key then changed at every call (a counter in the fingerprint) and never hit.
def test_state_changed_in_place_or_rebound_is_put_back(tmp_path):
    class Busy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)
            self.register_buffer("ema", torch.zeros(4))
            self.acts, self.by_call, self.calls = [], {}, 0
            self.counter = torch.zeros(1)
            self.gens = [torch.Generator().manual_seed(3)]

        def forward(self, v):
            y = self.lin(v) + torch.rand(v.shape[0], 4, generator=self.gens[0])
            self.ema = 0.9 * self.ema + 0.1 * y.detach().mean(0)
            self.acts.append(y.detach())
            self.by_call[len(self.by_call)] = y.detach()
            self.calls += 1
            self.counter.add_(1)
            return y
    model = Busy()
    ema, gen_state = model.ema, model.gens[0].get_state()
    before = state(model)
    first = autobatch.find(model, x(), memory_limit=LIMIT, max_batch=256, cache=str(tmp_path))
    assert model.ema is ema and torch.equal(model.ema, torch.zeros(4))
    assert model.acts == [] and model.by_call == {} and model.calls == 0
    assert model.counter.item() == 0.0 and torch.equal(model.gens[0].get_state(), gen_state)
    assert all(torch.equal(v, before[k]) for k, v in state(model).items())
    again = autobatch.find(model, x(), memory_limit=LIMIT, max_batch=256, cache=str(tmp_path))
    assert first.cache["outcome"] == "miss" and again.cache["outcome"] == "hit"


# Catches a namedtuple batch handed to the model as a plain tuple (batch.y failed), keys of mixed
# types in a batch (the fingerprint sorted them: TypeError), a factory that takes no parameters
# (a raw TypeError), plan() truncating floats and taking strings, and ints past int64 (pybind11's
# cast errors).
def test_more_shapes_of_input():
    Batch = collections.namedtuple("Batch", "x y")

    class XY(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, v, w):
            return self.lin(v)
    r = autobatch.find(XY(), Batch(x(), torch.tensor([1])), memory_limit=LIMIT, max_batch=16,
                       loss_fn=lambda out, b: out.mean() + 0 * b.y.sum())
    assert r.max_micro_batch == 16

    class K(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, inputs):
            return self.lin(inputs[0]) + self.lin(inputs["b"])
    assert autobatch.find(K(), {"inputs": {0: x(), "b": x()}}, memory_limit=LIMIT,
                          max_batch=16).max_micro_batch == 16
    model = mlp()
    with pytest.raises(autobatch.UsageError, match="trainable parameters: TypeError"):
        autobatch.find(model, x(), optimizer=lambda: torch.optim.AdamW(model.parameters()),
                       memory_limit=LIMIT)
    with pytest.raises(autobatch.UsageError, match="Invalid learning rate"):
        autobatch.find(model, x(), optimizer=lambda p: torch.optim.Adam(p, lr=-1),
                       memory_limit=LIMIT)
    for args in ((8, 16.9), (8.7, 16), ("8", 16), (True, 4), (None, 16), (2 ** 70, 100),
                 (8, 2 ** 64)):
        with pytest.raises(autobatch.UsageError):
            autobatch.plan(*args)
    for options in ({"memory_limit": 2 ** 70}, {"max_batch": 2 ** 70},
                    {"target_batch": 2 ** 70}):
        with pytest.raises(autobatch.UsageError, match="2\\^63"):
            autobatch.find(mlp(), x(), **{"memory_limit": LIMIT, **options})


# Catches trials that ran under the caller's autocast while the report said fp32 (the answer was
# twice the fp32 one): the trials run as precision= says, and the result says why.
def test_an_enclosing_autocast_is_not_the_trials():
    plain = autobatch.find(mlp(), x(), memory_limit=LIMIT, max_batch=4096)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = autobatch.find(mlp(), x(), memory_limit=LIMIT, max_batch=4096)
        assert torch.is_autocast_enabled("cpu")
    assert inside.max_micro_batch == plain.max_micro_batch
    assert any("inside torch.autocast" in w for w in inside.warnings), inside.warnings


# Row 15, in the package: the search's deadline was seen only before a trial, so a step at a
# large batch ran whole past `time_limit` (here each forward is 20,000 scalar ops per sample, up
# to 3,000,000: batch 1 steps in about 0.1 s, guided's jump to a large batch would step for tens
# of seconds). Now the deadline is asked between steps and at every CPU allocation inside one.
# Catches: a deadline not checked inside the trial (steps_completed 1 or 2, elapsed far past the
# budget), and the stopped step reported as the model's error or as out of memory.
def test_the_time_limit_stops_a_step_in_progress():
    class PerSample(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 4)

        def forward(self, v):
            s = torch.zeros(1)
            for _ in range(min(20000 * v.shape[0], 3_000_000)):
                s = s + 1.0
            return self.lin(v) + s
    r = autobatch.find(PerSample(), x(), memory_limit=LIMIT, time_limit=2.0)
    assert r.status == "time-budget" and r.capped_by == "time-budget"
    last = r.trials[-1]
    assert last.cancelled and last.steps_completed == 0 and last.outcome != "out-of-memory"
    assert r.max_micro_batch >= 1 and last.micro_batch_size > r.max_micro_batch
    elapsed = r.raw["result"]["elapsed_s"]
    assert elapsed < 2.0 + 1.5, elapsed
    # Outside a trial nothing is an interruption: a flag left set would turn the next find's
    # warm-up error into a cancelled trial.
    assert not autobatch._core.trial_interrupted()


# Unchecked, a loss_fn or step of the wrong arity fails at the first trial as the model's
# TypeError ("<lambda>() takes 1 positional argument but 2 were given"), and BatchNorm1d at the
# default min_batch=1 as the model's ValueError, neither saying the fix. Catches: no check of the
# signature before the trials (the forward would run), and a BatchNorm error without min_batch=2
# in it.
def test_wrong_arity_and_batchnorm_at_one_say_the_fix():
    model = Counting()
    with pytest.raises(autobatch.UsageError, match=r"loss_fn\(output, batch\)"):
        autobatch.find(model, x(), memory_limit=LIMIT, loss_fn=lambda out: out.sum())
    with pytest.raises(autobatch.UsageError, match=r"step\(model, batch\)"):
        autobatch.find(model, x(), memory_limit=LIMIT, step=lambda model: model.lin.weight)
    with pytest.raises(autobatch.UsageError, match="loss_fn: expected a function"):
        autobatch.find(model, x(), memory_limit=LIMIT, loss_fn="mse")
    assert model.calls == []
    # Two arguments, however written, are taken.
    r = autobatch.find(Counting(), x(), memory_limit=LIMIT, max_batch=8,
                       loss_fn=lambda *args: args[0].sum())
    assert r.max_micro_batch == 8

    torch.manual_seed(0)
    bn = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                             torch.nn.Linear(64, 4))
    with pytest.raises(autobatch.ModelError, match="pass min_batch=2"):
        autobatch.find(bn, x(), memory_limit=LIMIT)
    assert autobatch.find(bn, x(), memory_limit=LIMIT, min_batch=2, max_batch=16) \
        .max_micro_batch == 16


# ---- Hostile calls a new user makes: each test names what it catches.

# Catches the autograd drain after a failed step allocating its scalar inside the budget: under a
# limit the model's own bytes already fill, its refusal left find() as a raw OutOfMemoryError.
def test_a_limit_below_the_model_is_does_not_fit_naming_min_batch():
    model = mlp()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    before = state(model)
    with pytest.raises(autobatch.DoesNotFit) as e:
        autobatch.find(model, x(), memory_limit=weights // 2, progress=False)
    assert "micro-batch 1 does not fit" in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # Catches words that named micro-batch 1 whatever min_batch was (1 fits here: it was never
    # tried).
    with pytest.raises(autobatch.DoesNotFit) as e:
        autobatch.find(mlp(), x(), memory_limit="1MiB", min_batch=100000, progress=False)
    assert "micro-batch 100000 does not fit" in str(e.value)
    assert [t.micro_batch_size for t in e.value.result.trials] == [100000]


# Catches "out of memory" matched anywhere in the step's error: a cache's own error with those
# words was taken for out of memory and the search answered 7 where thousands fit.
def test_a_step_error_that_says_out_of_memory_is_the_models_error():
    def step(m, b):
        if b.shape[0] >= 8:
            raise RuntimeError("my token cache: out of memory slots, call cache.reset()")
        return m(b).square().mean()
    with pytest.raises(autobatch.ModelError, match="out of memory slots") as e:
        autobatch.find(mlp(), x(), step=step, memory_limit=LIMIT, progress=False)
    assert e.value.micro_batch >= 8


# Catches a factory error other than TypeError and ValueError leaving find() raw.
@pytest.mark.parametrize("error", [RuntimeError("factory broken"), KeyError("lr"),
                                   AttributeError("no .params")])
def test_a_failing_optimizer_factory_is_a_usage_error_whatever_it_raises(error):
    def factory(params):
        raise error
    with pytest.raises(autobatch.UsageError, match="optimizer: .* failed when called") as e:
        autobatch.find(mlp(), x(), optimizer=factory, memory_limit=LIMIT, progress=False)
    assert e.value.__cause__ is error


# Catches counts the library holds in a C++ int passed on unchecked: 2^40 failed in pybind11's
# cast ("Unable to cast Python instance of type <class 'int'> to C++ type '?'") after a trial.
@pytest.mark.parametrize("what", ["steps_per_trial", "world_size", "max_trials"])
def test_counts_above_a_cpp_int_are_usage_errors(what):
    kwargs = {what: 1 << 40}
    if what == "world_size":
        kwargs["target_batch"] = 1 << 41
    with pytest.raises(autobatch.UsageError, match=f"{what}: expected an int >= 1 and <= "
                                                   "2147483647"):
        autobatch.find(mlp(), x(), memory_limit=LIMIT, progress=False, **kwargs)


# Catches a restore that puts back parameters and buffers but not the module tree: a step that
# replaced a child module left the last trial's module (other weights, other parameters) in the
# user's model after find().
def test_a_child_module_a_step_replaces_is_put_back():
    model = mlp()
    child, before = model[2], state(model)
    params = [id(p) for p in model.parameters()]

    def step(m, b):
        m[2] = torch.nn.Linear(64, 4)
        m.extra = torch.nn.ReLU()  # a child the trial adds
        return m(b).square().mean()
    autobatch.find(model, x(), step=step, memory_limit=LIMIT, max_batch=64, progress=False)
    assert model[2] is child and not hasattr(model, "extra")
    assert [id(p) for p in model.parameters()] == params
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# Catches a final restore that removes only the tensors a trial left as new attributes: a
# counter the forward made on its first call stayed on the user's model.
def test_an_attribute_a_forward_creates_is_gone_after_find():
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, b):
            self.calls = getattr(self, "calls", 0) + 1
            return self.net(b)
    model = Counting()
    autobatch.find(model, x(), memory_limit=LIMIT, max_batch=64, progress=False)
    assert not hasattr(model, "calls")


# Catches what find() cannot train reaching the first trial and leaving as torch's own error:
# a TorchScript module (TypeError from BufferDict.contains), parameters made under
# inference_mode (RuntimeError "Inplace update to inference tensor"), a sparse example
# (NotImplementedError "Cannot access storage of SparseTensorImpl").
def test_what_find_cannot_train_is_a_usage_error_before_any_trial():
    with pytest.raises(autobatch.UsageError, match="model: a TorchScript module"):
        autobatch.find(torch.jit.script(mlp()), x(), memory_limit=LIMIT, progress=False)
    with torch.inference_mode():
        frozen = mlp()
    with pytest.raises(autobatch.UsageError, match="model: 4 of its tensors .* are inference "):
        autobatch.find(frozen, x(), memory_limit=LIMIT, progress=False)
    sparse = torch.eye(32)[:1].to_sparse()
    with pytest.raises(autobatch.UsageError, match=r"example_batch\[0\]: expected dense"):
        autobatch.find(mlp(), (sparse,), step=lambda m, b: m(b[0].to_dense()).sum(),
                       memory_limit=LIMIT, progress=False)


# Catches the formatting of the step's error raising itself: an exception whose __str__ raises
# left find() as that RuntimeError, the user's exception lost.
def test_an_error_whose_str_raises_is_still_the_models_error():
    class Opaque(Exception):
        def __str__(self):
            raise RuntimeError("str fails")

    def step(m, b):
        raise Opaque()
    with pytest.raises(autobatch.ModelError, match="str\\(\\) of this Opaque raised") as e:
        autobatch.find(mlp(), x(), step=step, memory_limit=LIMIT, progress=False)
    assert isinstance(e.value.__cause__, Opaque)


# Catches words that name values also refused or another interface's: memory_limit=-1 said
# ">= 0" (0 is refused), min_batch above max_batch said "0 (no bound)" (refused in Python),
# margin=True named only bytes.
@pytest.mark.parametrize("kwargs, words", [
    ({"memory_limit": -1}, "memory_limit: expected more than 0 bytes, but got -1"),
    ({"min_batch": 8, "max_batch": 4},
     "max_batch: expected None (no bound) or an int >= min_batch 8, but got 4"),
    ({"margin": True}, "margin: expected a fraction in [0, 1) such as 0.05, a percentage"),
])
def test_argument_words_name_only_what_find_takes(kwargs, words):
    kwargs = {"memory_limit": LIMIT, **kwargs}
    with pytest.raises(autobatch.UsageError) as e:
        autobatch.find(mlp(), x(), progress=False, **kwargs)
    assert words in str(e.value)


# Catches a step whose loss does not depend on the model taken as a training step: every trial
# measured a step that trains nothing, and find() answered 47741 where the model's step fits 5495.
def test_a_loss_that_gives_the_model_no_gradient_is_the_models_error():
    w = torch.ones(1, requires_grad=True)
    with pytest.raises(autobatch.ModelError, match="no trainable parameter of the model received"):
        autobatch.find(mlp(), x(), step=lambda m, b: (b.sum() * w).sum(), memory_limit=LIMIT,
                       progress=False)


# Catches a search that counts unreachable objects holding tensors (here a cycle a step of an
# earlier call left, 4 MiB the budget allocator made): with Python's collector not run before
# the search (disabled here, as it is between its automatic runs) the answer was smaller by the
# garbage's bytes over a sample's, and had the collector run in the middle of the search, the
# trials before it and after it would have met different limits.
def test_garbage_holding_tensors_is_collected_before_the_search():
    import gc
    clean = autobatch.find(mlp(), x(), memory_limit=LIMIT, margin=0.0)
    left = []

    def leave_a_cycle(model, batch):
        if not left:
            cycle = {"tensor": torch.ones(1 << 20)}
            cycle["self"] = cycle
            left.append(True)
        return model(batch).square().mean()

    gc.disable()
    try:
        autobatch.check_batch(mlp(), x(), 1, memory_limit=LIMIT, step=leave_a_cycle)
        again = autobatch.find(mlp(), x(), memory_limit=LIMIT, margin=0.0)
    finally:
        gc.enable()
    assert left and clean.max_micro_batch > 100
    assert again.max_micro_batch == clean.max_micro_batch


# Catches a factory's optimizer that the trial cannot step as the user's loop does: LBFGS from a
# factory (or Lightning's configure_optimizers) failed in its step with a TypeError reported as the
# model's error, where the same class as an instance is refused by name before any trial.
def test_an_optimizer_class_refused_as_an_instance_is_refused_from_a_factory():
    with pytest.raises(autobatch.UsageError, match="LBFGS steps with a closure"):
        autobatch.find(mlp(), x(), optimizer=lambda p: torch.optim.LBFGS(p), memory_limit=LIMIT)


# Catches batches whose per-sample plain values (a collated batch's texts, which a Lightning or
# Trainer step tokenizes) stay as long as the example while the tensors' rows grow to the trial's
# size: a step tokenizing them failed with a size mismatch, or was sized without the texts' share.
# They are repeated in order as the rows are, in the full steps and in a measuring trial's first
# step (its first samples).
def test_per_sample_texts_are_repeated_with_the_rows():
    seen = []

    def step(model, batch):
        rows, texts = batch
        seen.append((rows.shape[0], list(texts)))
        return model(rows).square().mean()
    example = (torch.randn(2, 32), ["first", "second"])
    autobatch.check_batch(mlp(), example, 5, memory_limit=LIMIT, step=step)
    assert seen and all(n == len(texts) for n, texts in seen), seen
    assert seen[-1][1] == ["first", "second", "first", "second", "first"]
    seen.clear()
    autobatch.find(mlp(), example, memory_limit=LIMIT, step=step, max_batch=64)
    assert all(n == len(texts) for n, texts in seen), [(n, len(t)) for n, t in seen]


# Catches arguments that reached pybind11's casts (strategy=3, plan=1, plan()'s kind=None or
# world_size=2**31: "Unable to cast" / "incompatible function arguments"), one trial's calls taking
# find()'s search options as _Session's TypeError, progress taken by identity (progress="no" or 0
# drew the bar), and a balanced plan printed as "84+2 x 83 x 3 accumulation steps", arithmetic that
# does not make its target.
@pytest.mark.parametrize("call, words", [
    (lambda: autobatch.find(mlp(), x(), memory_limit=LIMIT, strategy=3), "strategy: expected"),
    (lambda: autobatch.find(mlp(), x(), memory_limit=LIMIT, plan=1), "plan: expected"),
    (lambda: autobatch.find(mlp(), x(), memory_limit=LIMIT, progress="no"), "progress: expected"),
    (lambda: autobatch.find(mlp(), x(), memory_limit=LIMIT, progress=0), "progress: expected"),
    (lambda: autobatch.plan(10, 10, kind=None), "kind: expected"),
    (lambda: autobatch.plan(10, 10, world_size=2**31), "world_size: expected"),
    (lambda: autobatch.check_batch(mlp(), x(), 4, memory_limit=LIMIT, progress=True),
     "check_batch: no option 'progress'"),
    (lambda: autobatch.check_eval_batch(mlp(), x(), 4, memory_limit=LIMIT, cache=True),
     "check_eval_batch: no option 'cache'"),
])
def test_arguments_that_reached_the_bindings_are_usage_errors(call, words):
    with pytest.raises(autobatch.UsageError, match=words):
        call()


def test_a_balanced_plan_prints_as_it_adds_up():
    plan = autobatch.plan(84, 250, kind="balanced")
    assert str(plan) == ("balanced plan: micro-batches 1 x 84 + 2 x 83 (3 accumulation steps) x "
                         "1 rank(s) = 250")
    assert sum(b * n for b, n, _ in plan.groups) == 250
