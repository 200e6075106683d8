"""A Hugging Face Trainer script with `auto_find_batch_size=True` replaced by autobatch's
`fit_training_arguments`: per_device_train_batch_size and gradient_accumulation_steps for an exact
effective batch, measured with the optimizer, precision and activation checkpointing the
arguments ask for (docs/drop-ins.md, "Hugging Face Trainer"). A tiny Llama built from a config:
nothing is downloaded.

    python examples/python/hf_trainer_autobatch.py --target-batch 256 --memory-limit 80MiB

On a GPU drop --memory-limit (the card's memory is the limit). Prints the sizes found and trains
--max-steps steps with them; exits 3 when nothing fits. Run by ctest (PythonExampleTest.HuggingFace).
"""
import argparse
import sys
import tempfile

import torch  # before autobatch (its extension binds to this torch)
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import autobatch
from autobatch.transformers import fit_training_arguments


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-batch", type=int, default=256)
    p.add_argument("--memory-limit", default=None, help="e.g. 80MiB (default: the device's)")
    p.add_argument("--cpu", action="store_true", default=not torch.cuda.is_available())
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--max-steps", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (64, 128))
    rows = [{"input_ids": r, "labels": r} for r in ids]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=a.cpu, per_device_train_batch_size=8,
                                 auto_find_batch_size=True, max_steps=a.max_steps,
                                 activation_checkpointing=a.activation_checkpointing,
                                 report_to=[], logging_steps=1, save_strategy="no")
        example = {"input_ids": ids[:1], "labels": ids[:1]}
        try:
            args = fit_training_arguments(args, model, example, a.target_batch,
                                          memory_limit=a.memory_limit)
        except autobatch.DoesNotFit as e:
            print(f"does not fit: {e}", file=sys.stderr)
            return 3
        micro, steps = args.per_device_train_batch_size, args.gradient_accumulation_steps
        print(f"per_device_train_batch_size {micro} x gradient_accumulation_steps {steps} = "
              f"{micro * steps} (target {a.target_batch})")
        result = Trainer(model=model, args=args, train_dataset=rows * 64).train()
    print(f"trained {result.global_step} optimizer steps, loss {result.training_loss:.3f}")
    return 0 if micro * steps == a.target_batch and result.global_step == a.max_steps else 1


if __name__ == "__main__":
    sys.exit(main())
