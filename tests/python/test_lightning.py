"""autobatch.lightning.AutobatchFinder (issue 30) on the CPU with the budget allocator's real OOM:
the sizes the fit loop then uses, the schedule that reads estimated_stepping_batches, 2 DDP ranks
that agree, and each refusal."""
import math

import pytest
import torch

pytest.importorskip("lightning")  # not in the newest-torch environment (requirements-newest.txt)
import autobatch  # noqa: E402
import autobatch.lightning as abl  # noqa: E402
import lightning_models as lm  # noqa: E402
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


def test_trial_is_the_modules_training_step():
    # Catches: a trial of model(x) and a loss of autobatch's instead of training_step (this
    # module's step runs the network twice, so its answer is well under a forward's); without a
    # target the size is the safe micro-batch itself and the accumulation stays as the script set.
    # 12 MiB: the second pass's input copy (x.flip(0), saved for backward) makes backward the
    # peak; under LIMIT the optimizer step, with the batch alive through it, binds both nets.
    finder = abl.AutobatchFinder(memory_limit="12MiB", margin=0)
    trainer, model, data = fit(finder, model=lm.TwoPassNet(), accumulate_grad_batches=3)
    assert trainer.accumulate_grad_batches == 3 and finder.plan is None
    assert data.batch_size == finder.micro_batch == finder.result.safe_micro_batch
    x = torch.randn(4, lm.FEATURES)
    forward_only = autobatch.find(lm.Net().net, x, memory_limit="12MiB", margin=0,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
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
