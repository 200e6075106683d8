"""autobatch.lightning.AutobatchFinder (issue 30) on the CPU with the budget allocator's real OOM:
the sizes the fit loop then uses, the schedule that reads estimated_stepping_batches, 2 DDP ranks
that agree, and each refusal."""
import math

import pytest
import torch

pytest.importorskip("lightning")  # not in the newest-torch environment (requirements-newest.txt)
import autobatch  # noqa: E402
import autobatch.lightning as abl  # noqa: E402
import lightning as L  # noqa: E402
import lightning_models as lm  # noqa: E402
import loader_data  # noqa: E402
import torchrun  # noqa: E402

LIMIT = "7MiB"  # the MLP's largest micro-batch is then about 63 (16 KB a sample, the batch
# alive through the optimizer step, whose AdamW temporaries set the peak)


def fit(finder, model=None, data=None, **trainer_options):
    model, data = model or lm.Net(), data or lm.Data()
    trainer = lm.trainer(finder, **trainer_options)
    trainer.fit(model, datamodule=data)
    return trainer, model, data


def test_sets_micro_batch_and_accumulation_for_the_target():
    # Catches: setting the size after the loader was built (training_step would still see 4),
    # not setting accumulate_grad_batches, a plan that is not uniform or misses the target.
    finder = abl.AutobatchFinder(target_batch=512, memory_limit=LIMIT, margin=0)
    trainer, model, data = fit(finder)
    micro, steps = finder.micro_batch, trainer.accumulate_grad_batches
    assert data.batch_size == micro != 4
    assert micro * steps == 512 and steps == finder.accumulation_steps >= 2
    assert micro <= finder.result.safe_micro_batch
    assert model.seen and set(model.seen) == {micro}  # 512 samples: whole batches only
    assert trainer.global_step == len(model.seen) // steps  # the epoch trained with them
    trial = finder.result.trials[-1]
    assert trial.outcome in ("fits", "out-of-memory")
    assert finder.result.raw["options"]["step"].endswith("_training_step")
    # The trial's optimizer, set on the strategy for the step, is let go after each trial (its
    # AdamW state stayed alive into the next: "tensors made by the trials stay alive")
    assert not any("stay alive" in w for w in finder.result.warnings), finder.result.warnings


def test_trial_is_the_modules_training_step():
    # Catches: a trial of model(x) and a loss of autobatch's instead of training_step (this
    # module's step runs the network twice, so its answer is well under a forward's); without a
    # target the size is the safe micro-batch itself and the accumulation stays as the script set.
    # 12 MiB: the second pass's input copy (x.flip(0), saved for backward) makes backward the
    # peak; under LIMIT the optimizer step, with the batch alive through it, binds both nets.
    # The forward's answer first, with nothing of a fit alive (Lightning keeps the module, and so
    # the trainer and its optimizer, alive through every callback: callback.log, set by its
    # callback_connector._attach_model_logging_functions).
    x = torch.randn(4, lm.FEATURES)
    forward_only = autobatch.find(lm.Net().net, x, memory_limit="12MiB", margin=0,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    finder = abl.AutobatchFinder(memory_limit="12MiB", margin=0)
    trainer, model, data = fit(finder, model=lm.TwoPassNet(), accumulate_grad_batches=3)
    assert trainer.accumulate_grad_batches == 3 and finder.plan is None
    assert data.batch_size == finder.micro_batch == finder.result.safe_micro_batch
    # measured 251 against 287: the copy's 16 KB a sample in backward (a trial of model(x)
    # would answer the forward's 287)
    assert finder.micro_batch < 0.92 * forward_only.safe_micro_batch


def test_schedule_from_estimated_stepping_batches_follows_the_new_sizes():
    # Catches: sizing after configure_optimizers (on_fit_start) without rebuilding, and a loader
    # built by the trials' estimated_stepping_batches at the old size being kept.
    finder = abl.AutobatchFinder(target_batch=512, memory_limit=LIMIT, margin=0)
    trainer, model, data = fit(finder, model=lm.ScheduledNet(), max_epochs=2)
    micro, steps = finder.micro_batch, trainer.accumulate_grad_batches
    expected = math.ceil(math.ceil(data.samples / micro) / steps) * 2
    old = math.ceil(math.ceil(data.samples / 4) / 1) * 2
    total = trainer.lr_scheduler_configs[0].scheduler.total_steps
    assert total == expected != old
    assert trainer.global_step == expected  # OneCycleLR raises if stepped past total_steps


def test_precision_of_the_trainer():
    # Catches: trials in fp32 whatever the trainer's precision.
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0, max_batch=64)
    fit(finder, precision="bf16-mixed", limit_train_batches=1)
    assert finder.result.raw["options"]["precision"] == "amp-bf16"


def _ddp(tmp_path, target, limits):
    return torchrun.run(tmp_path, "lightning_ddp.py", target, *limits)


@pytest.mark.slow  # a torchrun job: the slow tier
def test_ddp_ranks_agree_on_the_smaller_ranks_size(tmp_path):
    # Catches: each rank keeping its own size (the ranks' loaders would differ), the maximum
    # taken instead of the minimum, a plan that ignores the world size, trials without DDP's
    # gradient buckets.
    run, ranks = _ddp(tmp_path, 376, ["8MiB", "7.25MiB"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    own = [r["own"] for r in ranks]
    assert own[1] < own[0]  # the rank with less memory has the smaller size
    micro, steps = ranks[0]["micro_batch"], ranks[0]["accumulation"]
    assert all(r["micro_batch"] == micro and r["accumulation"] == steps for r in ranks)
    assert micro <= min(own) and micro * steps * 2 == 376
    # Every batch the loop gave training_step has the agreed size (the last may be the rest).
    assert all(set(r["seen"][:-1]) == {micro} and r["seen"][-1] <= micro for r in ranks)
    assert all(r["ddp_bucket_bytes"] > 0 for r in ranks)


@pytest.mark.slow  # a torchrun job: the slow tier
def test_ddp_rank_where_nothing_fits_stops_every_rank(tmp_path):
    # Catches: a rank that raises before the agreement (the other waits in all_reduce until the
    # timeout) and ranks that train with a size one of them cannot hold.
    run, ranks = _ddp(tmp_path, 512, ["8MiB", "6MiB"])
    assert run.returncode != 0 and not ranks
    text = run.stdout + run.stderr
    assert "another rank did not size (rank 1: DoesNotFit: " in text
    assert "nothing fits: micro-batch 1 does not fit" in text


@pytest.mark.parametrize("case, message", [
    ("manual", "manual optimization"),
    ("loader", "passed to fit\\(\\) directly"),
    ("attribute", "no attribute 'batch_size'"),
    ("precision", "precision '64-true' is not supported"),
    ("derived", "come from the trainer"),
    ("target", "not a multiple of the world size 2"),
])
def test_refusals(case, message):
    # Catches: each configuration that the finder cannot size being sized anyway (a wrong answer
    # or Lightning's own error later).
    model, data, options = lm.Net(), lm.Data(), {}
    if case == "manual":
        model = lm.ManualNet()
    if case == "precision":
        options["precision"] = "64-true"
    with pytest.raises(autobatch.UsageError, match=message):
        if case == "derived":
            abl.AutobatchFinder(precision="bf16-mixed")
        if case == "target":  # 2 ranks cannot share 3 samples equally; checked before any trial
            abl.AutobatchFinder(target_batch=3).setup(_Seen(lm.trainer(), world_size=2), model,
                                                      "fit")
        trainer = lm.trainer(abl.AutobatchFinder(memory_limit=LIMIT), **options)
        if case == "loader":
            data.setup("fit")
            trainer.fit(model, train_dataloaders=data.train_dataloader())
        elif case == "attribute":
            trainer.fit(model, datamodule=_NoSize())
        else:
            trainer.fit(model, datamodule=data)


class _Seen:
    """A real single-process trainer with some attributes replaced (what this machine cannot
    build: 2 ranks, an FSDP strategy, which Lightning builds only on GPUs)."""

    def __init__(self, trainer, **replaced):
        self._t, self._replaced = trainer, replaced

    def __getattr__(self, name):
        return self._replaced[name] if name in self._replaced else getattr(self._t, name)


class _NoSize(lm.Data):
    def __init__(self):
        super().__init__()
        del self.batch_size

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=4)


def test_unsupported_strategy():
    # Catches: FSDP sized as if each rank held the whole model (the check must come before any
    # trial; Lightning builds FSDP only on GPUs, so the strategy object stands in a CPU trainer).
    from lightning.pytorch.strategies import FSDPStrategy
    finder = abl.AutobatchFinder(memory_limit=LIMIT)
    trainer = _Seen(lm.trainer(), strategy=FSDPStrategy())
    with pytest.raises(autobatch.UsageError, match="FSDPStrategy strategy is not supported") as e:
        finder.setup(trainer, lm.Net(), "fit")
    assert "autobatch.find_sharded" in str(e.value)  # the way that does size it


# Catches a finder that sizes before the module's own setup, which Lightning calls after the
# callbacks' (trainer/call.py): a module building its data there failed with a raw AttributeError,
# one building layers there was sized without them. Sized after it, the answer is Net's with Data
# (the same network and samples).
def test_a_module_that_builds_in_its_setup_is_sized_whole():
    reference = _reference_size()
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    trainer = lm.trainer(finder, limit_train_batches=1)
    model = lm.SetupNet()
    trainer.fit(model)
    assert finder.micro_batch == reference == model.batch_size
    assert "setup" not in vars(model)  # the finder's wrapper is gone


def _reference_size():
    """Net's size with Data under LIMIT, its fit let go: Lightning keeps the module (and so the
    trainer and its optimizer's state) alive through every callback it was given (callback.log,
    callback_connector._attach_model_logging_functions), and a later search counts what the
    process holds."""
    reference = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    fit(reference, limit_train_batches=1)
    return reference.micro_batch


# Catches trials that call training_step(batch, 0) whatever its signature (a step without batch_idx,
# which Lightning trains, failed as the model's TypeError), and trials whose step reads
# self.optimizers() / self.lr_schedulers() from the strategy's empty lists (AttributeError). Both
# are sized as Net is; after the search the strategy holds the fit's own optimizer and scheduler
# (the epoch trains).
@pytest.mark.parametrize("model_class", [lm.NoIndexNet, lm.LrLoggingNet])
def test_training_step_forms_lightning_trains(model_class):
    reference = _reference_size()
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    trainer, model, _ = fit(finder, model=model_class(), limit_train_batches=2)
    assert finder.micro_batch == reference
    assert trainer.global_step == 2 and len(trainer.optimizers) == 1


# Catches trials under autocast with its cache on where Lightning's mixed precision turns it off
# (plugins/precision/amp.py: cache_enabled=False): a weight used 8 times is cast 8 times in
# Lightning's step and once in such a trial, whose answer then did not fit. B fits and B+1 does not
# in the module's step under Lightning's own autocast.
def test_mixed_precision_is_sized_with_lightnings_autocast():
    limit = "64MiB"  # its 1.1 M parameters, their gradients and AdamW's state take 17 MiB
    finder = abl.AutobatchFinder(memory_limit=limit, margin=0)
    model = lm.SharedWeightNet()
    lm.trainer(finder, precision="bf16-mixed", limit_train_batches=1).fit(model)
    b = finder.result.max_micro_batch
    # The fit's trainer and optimizer state go with the finder (see _reference_size), and the
    # gradients its last step left: the checks below run on the module as a fresh fit starts it.
    del finder
    model.trainer = None
    model.zero_grad(set_to_none=True)

    def lightnings_step(m, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            return m.training_step(batch, 0)
    example = (torch.randn(1, 64), torch.zeros(1, dtype=torch.long))
    outcomes = [autobatch.check_batch(model, example, size, step=lightnings_step,
                                      memory_limit=limit, keep_output=False,
                                      optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3)).outcome
                for size in (b, b + 1)]
    assert outcomes == ["fits", "out-of-memory"], (b, outcomes)


class _FitStartRng(lm.L.Callback):
    def on_fit_start(self, trainer, module):
        self.rng = torch.get_rng_state()


# Catches a finder that draws from torch's generator outside find()'s snapshot: the train loader's
# iterator, made for the example batch, draws its base seed, so a seeded fit's stream differed from
# the same fit without the finder.
def test_the_fit_starts_with_the_random_state_it_had():
    states = []
    for finder in (None, abl.AutobatchFinder(memory_limit=LIMIT, margin=0)):
        seen = _FitStartRng()
        torch.manual_seed(123)
        trainer = lm.trainer(*[c for c in (finder, seen) if c], limit_train_batches=1)
        trainer.fit(lm.Net(), datamodule=lm.Data())
        states.append(seen.rng)
    assert torch.equal(states[0], states[1])


class _DictWithoutLoss(lm.Net):
    def training_step(self, batch, batch_idx):
        return {"train_loss": super().training_step(batch, batch_idx)}


class _FloatLoss(lm.Net):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).item()


class _LbfgsNet(lm.Net):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters())


# Catches, each before or instead of a misleading error or a wrong size: eval='only' setting the
# training batch from an evaluation search; an unknown option or a batch_arg_name that is no str
# reaching Lightning or find() raw; a dict without "loss" called a skipped batch; a float loss
# naming our internal step; LBFGS from configure_optimizers failing as the model's TypeError; a
# target with a GradientAccumulationScheduler refused by Lightning only after the search (here,
# before any trial).
@pytest.mark.parametrize("case, message", [
    ("eval-only", "eval='only'"),
    ("unknown", "no option 'foo'"),
    ("arg-name", "batch_arg_name: expected"),
    ("dict", "without 'loss'"),
    ("float", "returned float"),
    ("lbfgs", "LBFGS"),
    ("accumulation", "GradientAccumulationScheduler"),
])
def test_misuses_are_refused_in_words_before_any_size(case, message):
    from lightning.pytorch.callbacks import GradientAccumulationScheduler
    options = {"eval-only": {"eval": "only"}, "unknown": {"foo": 1},
               "arg-name": {"batch_arg_name": 5}}.get(case, {})
    model = {"dict": _DictWithoutLoss, "float": _FloatLoss, "lbfgs": _LbfgsNet}.get(case, lm.Net)()
    finder = None
    with pytest.raises(autobatch.UsageError, match=message):
        finder = abl.AutobatchFinder(memory_limit=LIMIT, target_batch=64, **options)
        extra = [GradientAccumulationScheduler({0: 1})] if case == "accumulation" else []
        lm.trainer(finder, *extra).fit(model, datamodule=lm.Data())
    assert finder is None or finder.result is None


# Issue 63 rows 14 and 15. Catches BatchSizeFinder's arguments failing as "no option", a finder
# that searches under fast_dev_run (Lightning's own skips with its warning), and max_trials=0
# not keeping the script's size.
@pytest.mark.parametrize("name, words", [("mode", "strategy="), ("init_val", "min_batch="),
                                         ("max_val", "max_batch=")])
def test_batch_size_finders_arguments_name_ours(name, words):
    with pytest.raises(autobatch.UsageError, match=f"{name}= is BatchSizeFinder's: .*{words}"):
        abl.AutobatchFinder(**{name: 4})


@pytest.mark.parametrize("trainer_options, finder_options", [
    ({"fast_dev_run": True}, {}), ({"limit_train_batches": 1}, {"max_trials": 0})])
def test_the_finder_skips_as_batch_size_finder_does(trainer_options, finder_options, recwarn):
    finder = abl.AutobatchFinder(memory_limit=LIMIT, **finder_options)
    trainer, model, data = fit(finder, **trainer_options)
    assert data.batch_size == 4 and finder.result is None
    assert set(model.seen) == {4}
    if "fast_dev_run" in trainer_options:
        assert any("Skipping batch size scaler" in str(w.message) for w in recwarn)


# Lightning's own tests of BatchSizeFinder (tests/tests_pytorch/tuner/test_scale_batch_size.py),
# ported from their meaning to the drop-in. Where the attribute lives: on the module, on the
# datamodule, on both (lightning_setattr sets every place that has it), in the module's hparams.
class _SizedNet(lm.Net):
    def __init__(self, batch_size=None, hparams=False):
        super().__init__()
        if hparams:
            self.save_hyperparameters({"batch_size": batch_size})
        elif batch_size is not None:
            self.batch_size = batch_size


class _OwnData(_SizedNet):
    """The module's own train_dataloader, reading its batch size where it was set."""

    def train_dataloader(self):
        size = self.hparams.batch_size if "batch_size" in self.hparams else self.batch_size
        return torch.utils.data.DataLoader(lm.Samples(64), batch_size=size)


@pytest.mark.parametrize("model_kind, data_size", [("attribute", None), ("attribute", 3),
                                                   (None, 3), ("hparams", None)])
def test_the_size_is_set_where_lightning_sets_it(model_kind, data_size):
    model = (_OwnData(2, hparams=model_kind == "hparams") if model_kind and data_size is None
             else _SizedNet(2) if model_kind else lm.Net())
    data = lm.Data(batch_size=data_size) if data_size is not None else None
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    trainer = lm.trainer(finder, limit_train_batches=1)
    trainer.fit(model, datamodule=data) if data is not None else trainer.fit(model)
    size = finder.micro_batch
    assert size > 4
    if model_kind == "hparams":
        assert model.hparams.batch_size == size
    elif model_kind:
        assert model.batch_size == size
    if data is not None:
        assert data.batch_size == size
    assert set(model.seen) == {size}


def test_the_attribute_on_the_module_and_in_its_hparams_warns_as_lightning_does(recwarn):
    model = _OwnData(2)
    model.save_hyperparameters({"batch_size": 2})
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    lm.trainer(finder, limit_train_batches=1).fit(model)
    assert any("are mutually exclusive" in str(w.message) for w in recwarn)


_VALIDATION_CALLS = []  # outside the module: find() puts the module's attributes back


class _ValNet(lm.Net):
    """Net with a validation loader sized by its own attribute and a validation step that
    records its calls (in _VALIDATION_CALLS) and the loop's batch sizes."""

    def __init__(self, batch_size=4):
        super().__init__()
        self.batch_size = batch_size
        self.val_seen = []

    def val_dataloader(self):
        return torch.utils.data.DataLoader(lm.Samples(4096), batch_size=self.batch_size)

    test_dataloader = predict_dataloader = val_dataloader

    def validation_step(self, batch, batch_idx):
        _VALIDATION_CALLS.append(len(batch[0]))
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss)
        return loss

    test_step = validation_step

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self.val_seen.append(len(batch[0]))

    on_test_batch_start = on_validation_batch_start


# Issue 63 row 14. Catches trainer.validate / test / predict left unsized (BatchSizeFinder sizes
# the loop that runs), and eval=True sizing training_step in eval mode where the validation loop
# runs validation_step.
@pytest.mark.parametrize("method", ["validate", "test", "predict"])
def test_the_loop_that_runs_is_sized_with_its_own_step(method):
    _VALIDATION_CALLS.clear()
    model = _ValNet()
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0)
    trainer = lm.trainer(finder, limit_val_batches=1, limit_test_batches=1,
                         limit_predict_batches=1)
    getattr(trainer, method)(model)
    e = finder.micro_batch
    assert e == finder.result.eval_safe_batch == model.batch_size > 4
    assert finder.result.eval["state"] == "parameters-only"
    if method != "predict":  # the trials ran the loop's step, at sizes above the loop's
        assert model.val_seen == [e] and max(_VALIDATION_CALLS) > e


def test_eval_true_sizes_the_validation_step():
    _VALIDATION_CALLS.clear()
    model = _ValNet()
    finder = abl.AutobatchFinder(memory_limit=LIMIT, margin=0, eval=True)
    lm.trainer(finder, limit_train_batches=1, limit_val_batches=0).fit(model,
                                                                       datamodule=lm.Data())
    assert _VALIDATION_CALLS and finder.result.eval_safe_batch > 0


# Catches a batch size set above the samples the train loader has (4705 for 4096 rows), where
# BatchSizeFinder stops at the dataset's length.
def test_the_size_is_capped_at_the_datasets_length():
    finder = abl.AutobatchFinder(memory_limit="64MiB", margin=0)
    trainer, model, data = fit(finder, data=lm.Data(samples=96), limit_train_batches=1)
    assert finder.micro_batch == data.batch_size == 96
    assert finder.result.capped_by != "memory"


class _TokenModule(L.LightningModule):
    """loader_data's token model under Lightning, over its sorted dataset (the first batches
    short): `batch_size` on the module, the padding collator."""

    def __init__(self, batch_size=8):
        super().__init__()
        self.batch_size, self.model = batch_size, loader_data.model()

    def train_dataloader(self):
        return loader_data.loader("pad", self.batch_size)

    def training_step(self, batch, batch_idx):
        return self.model(**batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


def test_from_loader_sizes_on_the_train_loaders_costliest_samples():
    # Catches: a from_loader that still sizes on the first batch (16 to 20 tokens: an answer
    # many times the 512-token rows' one), and a finder that does not pass the loader to
    # find() (its Result would not say what bound it).
    sizes = {}
    for from_loader in (False, True):
        finder = abl.AutobatchFinder(memory_limit="64MiB", from_loader=from_loader)
        module = _TokenModule()
        lm.trainer(finder, limit_train_batches=1).fit(module)
        sizes[from_loader] = finder.micro_batch
        assert module.batch_size == finder.micro_batch
    assert finder.result.data["binding_shape"]["input_ids"] == [1, loader_data.LONGEST]
    assert finder.result.data["scope"] == "the epoch"
    assert 10 * sizes[True] < sizes[False]
    with pytest.raises(autobatch.UsageError, match="from_loader: expected True"):
        abl.AutobatchFinder(from_loader="yes")
