"""autobatch.transformers.fit_training_arguments (issue 30) on the CPU with the budget allocator's
real out-of-memory: a tiny Llama from a config (tiny_models.py), the arguments it returns, and a
Trainer that trains a step with them."""
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

import autobatch
import autobatch.transformers as abt
import tiny_models
import torchrun

LIMIT = "40MiB"  # the tiny Llama's largest micro-batch is then about 40 samples of 64 tokens


def arguments(tmp_path, **kw):
    kw.setdefault("per_device_train_batch_size", 2)
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kw)


def test_returns_a_uniform_plan_for_the_target_and_leaves_args_alone(tmp_path):
    # Catches: sizes that do not multiply to the target, auto_find_batch_size left on (the
    # Trainer would halve the size on its own), the user's arguments changed in place, and an
    # optimizer not taken from args (optim adamw_torch_fused is the Trainer's default).
    model, example = tiny_models.llama()
    args = arguments(tmp_path, auto_find_batch_size=True)
    sized, result = abt.fit_training_arguments_with_result(args, model, example, 256,
                                                           memory_limit=LIMIT, margin=0)
    micro, steps = sized.per_device_train_batch_size, sized.gradient_accumulation_steps
    assert micro * steps == 256 and steps >= 2 and micro <= result.safe_micro_batch
    assert sized.auto_find_batch_size is False
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps,
            args.auto_find_batch_size) == (2, 1, True)
    assert result.memory["optimizer_impl"] == "fused"
    loop = abt.fit_training_arguments_with_result(arguments(tmp_path, optim="adamw_torch"), model,
                                                  example, 256, memory_limit=LIMIT, margin=0)[1]
    assert loop.memory["optimizer_impl"] == "loop"


def test_activation_checkpointing_and_bf16_change_the_size(tmp_path):
    # Catches: trials that ignore args.activation_checkpointing (or its deprecated alias) or bf16,
    # and checkpointing left enabled (with use_cache changed) on the user's model afterwards.
    model, example = tiny_models.llama()
    use_cache = model.config.use_cache

    def size(**kw):
        return abt.fit_training_arguments_with_result(arguments(tmp_path, **kw), model, example,
                                                      256, memory_limit=LIMIT, margin=0)[1]
    plain = size()
    checkpointed = size(activation_checkpointing=True)
    alias = size(gradient_checkpointing=True)
    assert checkpointed.safe_micro_batch > 1.5 * plain.safe_micro_batch
    assert alias.safe_micro_batch == checkpointed.safe_micro_batch
    assert not abt._checkpointing_on(model) and model.config.use_cache == use_cache
    bf16 = size(bf16=True)
    assert bf16.raw["options"]["precision"] == "amp-bf16"
    assert bf16.safe_micro_batch != plain.safe_micro_batch


def test_a_trainer_trains_a_step_with_the_returned_arguments(tmp_path):
    # Catches: arguments the Trainer does not take as given (its dataloader at another size, the
    # accumulation not applied): every forward of the step sees the micro-batch, as many times
    # as the accumulation steps.
    model, example = tiny_models.llama()
    sized = abt.fit_training_arguments(arguments(tmp_path, max_steps=1, logging_steps=1), model,
                                       example, 96, memory_limit=LIMIT, margin=0)
    micro, steps = sized.per_device_train_batch_size, sized.gradient_accumulation_steps
    rows = [{"input_ids": example["input_ids"][0], "labels": example["labels"][0]}] * 96
    seen = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        out = Trainer(model=model, args=sized, train_dataset=rows).train()
    finally:
        hook.remove()
    assert out.global_step == 1 and seen == [micro] * steps and micro * steps == 96


def _with(args, **changes):
    import dataclasses
    return dataclasses.replace(args, **changes)


# Catches: FSDP turned on by accelerate's environment (`accelerate launch --use_fsdp`, which sets
# ACCELERATE_USE_FSDP=true and no TrainingArguments field) missed: the Trainer would shard the
# model while the trial held it whole on every rank.
def test_fsdp_from_accelerates_environment_is_refused(tmp_path, monkeypatch):
    model, example = tiny_models.llama()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(autobatch.UsageError,
                       match=r"FSDP \(ACCELERATE_USE_FSDP=true.*autobatch.find_sharded"):
        abt.fit_training_arguments(arguments(tmp_path), model, example, 64)


@pytest.mark.parametrize("call, message", [
    (lambda args, m, x: abt.fit_training_arguments({"lr": 1}, m, x, 64), "TrainingArguments"),
    (lambda args, m, x: abt.fit_training_arguments(args, m, x, 64, optimizer="sgd"),
     "come from the TrainingArguments"),
    (lambda args, m, x: abt.fit_training_arguments(args, m, x, 0), "target_batch"),  # None: no target
    (lambda args, m, x: abt.fit_training_arguments(args, m, x, 64, memory_limit="1MiB"), None),
    # FSDP: refused before any trial (each rank would hold the whole model), naming the way that
    # sizes it (issue 43)
    (lambda args, m, x: abt.fit_training_arguments(_with(args, fsdp=True), m, x, 64),
     "FSDP is not supported yet.*autobatch.find_sharded"),
    # a model that is no module (a hub id, None) and an option find() does not take: refused in
    # words, not as a raw AttributeError or TypeError
    (lambda args, m, x: abt.fit_training_arguments(args, "gpt2", x, 64), "model: expected"),
    (lambda args, m, x: abt.fit_training_arguments(args, m, x, 64, foo=1), "no option 'foo'"),
])
def test_refusals(tmp_path, call, message):
    # Catches: bad arguments accepted and sized anyway; a limit the model cannot fit reported as
    # a size instead of DoesNotFit.
    model, example = tiny_models.llama()
    if message is None:
        with pytest.raises(autobatch.DoesNotFit):
            call(arguments(tmp_path), model, example)
        return
    with pytest.raises(autobatch.UsageError, match=message):
        call(arguments(tmp_path), model, example)


@pytest.mark.slow  # a torchrun job: the slow tier
def test_ranks_under_torchrun_agree_on_the_smaller_size(tmp_path):
    # Catches: each rank keeping its own size (its Trainer would step with another batch than
    # the other's), the maximum instead of the minimum (target 80: 40 x 1 from the larger rank's
    # 47, 20 x 2 from the smaller's 39), and trials without DDP's gradient buckets.
    run, ranks = torchrun.run(tmp_path, "transformers_ddp.py", 80, "48MiB", "40MiB", port_offset=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    own = [r["own"] for r in ranks]
    assert own[1] < own[0] and all(r["world_size"] == 2 for r in ranks)
    micro, steps = ranks[0]["micro_batch"], ranks[0]["accumulation"]
    assert all((r["micro_batch"], r["accumulation"]) == (micro, steps) for r in ranks)
    assert micro <= min(own) and micro * steps * 2 == 80
    assert all(r["ddp_bucket_bytes"] > 0 for r in ranks)


def test_eval_sets_the_evaluation_batch_and_the_trainer_evaluates_with_it(tmp_path):
    # Catches (issue 31): eval=True not passed to the search (per_device_eval_batch_size left at
    # the user's 3, or set from the training batch), the raw maximum taken for the safe batch,
    # and arguments the Trainer's evaluation loop does not take as given.
    model, example = tiny_models.llama()
    args = arguments(tmp_path, per_device_eval_batch_size=3)
    sized, result = abt.fit_training_arguments_with_result(args, model, example, 64,
                                                           memory_limit=LIMIT, margin=0.05,
                                                           eval=True)
    e = sized.per_device_eval_batch_size
    assert e == result.eval_safe_batch and 0 < e <= result.eval_max_batch
    assert e > result.safe_micro_batch >= sized.per_device_train_batch_size, result.text
    assert result.eval["state"] == "training-resident" and args.per_device_eval_batch_size == 3
    rows = [{"input_ids": example["input_ids"][0], "labels": example["labels"][0]}] * (e + 1)
    seen = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        Trainer(model=model, args=sized, eval_dataset=rows).evaluate()
    finally:
        hook.remove()
    assert seen == [e, 1]
    with pytest.raises(autobatch.UsageError, match="eval='only' has no place"):
        abt.fit_training_arguments(args, model, example, 64, eval="only")


# Catches trials of the model's own loss where the Trainer computes a label-smoothed one
# (label_smoothing_factor > 0: the labels popped, LabelSmoother on the logits, -log_softmax of the
# whole logits and shifted copies): the answer was 40 with or without it,
# where the Trainer's step runs out of memory at 36. B fits and B+1 does not in the Trainer's own
# compute_loss (a Trainer built from the same arguments), run as the trial's step.
def test_label_smoothing_is_sized_as_the_trainers_compute_loss(tmp_path):
    model, example = tiny_models.llama()
    args = arguments(tmp_path, label_smoothing_factor=0.1, optim="adamw_torch")
    sized, result = abt.fit_training_arguments_with_result(args, model, example, 256,
                                                           memory_limit=LIMIT, margin=0)
    plain = abt.fit_training_arguments_with_result(arguments(tmp_path, optim="adamw_torch"),
                                                   model, example, 256, memory_limit=LIMIT,
                                                   margin=0)[1]
    b = result.max_micro_batch
    assert b < plain.max_micro_batch, (b, plain.max_micro_batch)
    trainer = Trainer(model=model, args=args)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)

    def trainers_step(m, batch):
        return trainer.compute_loss(m, dict(batch))
    outcomes = [autobatch.check_batch(model, example, size, step=trainers_step,
                                      optimizer=lambda p: cls(p, **kwargs), keep_output=False,
                                      memory_limit=LIMIT).outcome for size in (b, b + 1)]
    assert outcomes == ["fits", "out-of-memory"], (b, outcomes)


def _padded(samples):
    """A causal-LM collator's rule: pad to the batch's longest, labels -100 on the padding."""
    t = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), t, dtype=torch.long)
    labels = torch.full((len(samples), t), -100)
    mask = torch.zeros(len(samples), t, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n] = labels[i, :n] = s["input_ids"]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_a_dataloader_in_place_of_the_example_sizes_on_its_longest_sequences(tmp_path):
    # Catches: a drop-in that sizes on the loader's first batch (8 to 14 tokens here) or that
    # cannot take the loader at all: the answer must hold for the 128-token rows.
    model, _ = tiny_models.llama()
    data = [{"input_ids": torch.arange(n) % 512} for n in range(8, 129, 2)]  # sorted, 61 samples
    loader = DataLoader(data, batch_size=4, collate_fn=_padded)
    sizes = {}
    for name, example in (("first", next(iter(loader))), ("loader", loader)):
        sized, result = abt.fit_training_arguments_with_result(
            arguments(tmp_path), model, example, None, memory_limit=LIMIT, max_batch=4096)
        sizes[name] = result.safe_micro_batch
    assert result.data["binding_shape"]["input_ids"] == [1, 128]
    assert sized.per_device_train_batch_size == sizes["loader"]  # max_batch raised the cap
    assert 4 * sizes["loader"] < sizes["first"]
