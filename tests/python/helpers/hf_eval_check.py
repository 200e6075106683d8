"""The Hugging Face Trainer's own evaluation as the truth for fit_training_arguments(eval=True),
in a fresh process on the CPU (test_doors.py): the tiny Llama (tiny_models.py), AdamW
(optim="adamw_torch"), label smoothing (label_smoothing_factor, the Trainer's LabelSmoother on
the logits).

    python hf_eval_check.py find LIMIT SMOOTHING         prints {"eval_max": E, "max": B}
    python hf_eval_check.py evaluate LIMIT SMOOTHING E   prints {"outcome": ...}

`evaluate` installs the budget allocator before anything is built, then runs trainer.train() for
one optimizer step at micro-batch 1 with an evaluation after it (eval_strategy="steps",
eval_steps=1) over two evaluation batches of E: the evaluation with the training state resident,
as the Trainer runs it in the middle of training, without autobatch; eval_accumulation_steps=1,
and with METRICS=1 in the environment a compute_metrics, so that the loop keeps each batch's
logits (prediction_loss_only is then False)."""
import json
import os
import sys
import tempfile

import torch
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fresh_budget import print_outcome  # noqa: E402
import tiny_models  # noqa: E402


def arguments(out, smoothing, **kw):
    return TrainingArguments(output_dir=out, use_cpu=True, report_to=[], optim="adamw_torch",
                             label_smoothing_factor=smoothing, save_strategy="no", **kw)


def main():
    mode, limit, smoothing = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    out = tempfile.mkdtemp()
    if mode == "find":
        import autobatch.transformers as abt
        model, example = tiny_models.llama()
        _, r = abt.fit_training_arguments_with_result(
            arguments(out, smoothing, per_device_train_batch_size=1), model, example, 1,
            memory_limit=limit, margin=0, eval=True)
        print(json.dumps({"eval_max": r.eval_max_batch, "max": r.max_micro_batch}))
        return
    e = int(sys.argv[4])

    def job():
        model, example = tiny_models.llama()
        row = {"input_ids": example["input_ids"][0], "labels": example["labels"][0]}
        del example
        args = arguments(out, smoothing, per_device_train_batch_size=1,
                         per_device_eval_batch_size=e, max_steps=1, eval_strategy="steps",
                         eval_steps=1, logging_strategy="no", eval_accumulation_steps=1)
        metrics = (lambda p: {}) if os.environ.get("METRICS") else None
        Trainer(model=model, args=args, train_dataset=[row], eval_dataset=[row] * (2 * e),
                compute_metrics=metrics).train()
    print_outcome(limit, job)

if __name__ == "__main__":
    main()
