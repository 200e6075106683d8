"""Sizing on the job's data, side by side (docs/benchmarks.md, "Data whose samples grow"): a
dataset of 2,000 token sequences of 16 to 512 tokens sorted shortest first (the first batches are
short, as a length-sorted corpus gives them; tests/python/helpers/loader_data.py), padded to each
batch's longest, a small token model with AdamW, and one CPU budget of 64 MiB for every finder and
every check, each in a fresh process with the budget installed before anything is built:

- Lightning's BatchSizeFinder (Tuner.scale_batch_size, modes power and binsearch, its defaults:
  init_val 2, 3 steps per trial, margin 0.05) on the module's own loader, not shuffled: its trials
  see the first batches;
- the Hugging Face Trainer with auto_find_batch_size=True from per_device_train_batch_size 1024,
  sequential sampling: it trains, and restarts at 0.9 x the batch after each out of memory (its
  restarts and the optimizer steps they threw away are counted);
- autobatch.find on the loader's first batch, and on the loader (its costliest samples);

then, for each answer, one epoch of the user's plain loop over the same loader at that size
(tests/python/helpers/loader_epoch.py): does it train the whole epoch? The budget's refusals carry
"DefaultCPUAllocator: can't allocate memory" (autobatch._budget.set_refusal_suffix), the text the
peers take for out of memory on the CPU.

Usage: python scripts/bench/loader_race.py [--json OUT]   (the project's environment; about 2
minutes on 2 cores). Prints a markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "..", "..", "tests", "python", "helpers")
LIMIT = 64 << 20
SUFFIX = " (DefaultCPUAllocator: can't allocate memory)"


_BACKEND = []  # the budget's backend, alive for the whole process (removed when collected)


def budget():
    """The CPU budget for this whole process, from here on (the model, the data, the finder)."""
    from autobatch import _budget

    backend = _budget.backend(LIMIT, 0)
    backend.finish_setup(0)
    _budget.set_refusal_suffix(SUFFIX)
    _BACKEND.append(backend)


def lightning(mode):
    import tempfile

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.tuner import Tuner

    import loader_data as D

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.batch_size = D.model(), 8

        def train_dataloader(self):
            return D.loader("pad", self.batch_size)

        def training_step(self, batch, _):
            return self.model(**batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    budget()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tempfile.mkdtemp())
    t0 = time.time()
    found = Tuner(trainer).scale_batch_size(Module(), mode=mode, steps_per_trial=3, init_val=2)
    return {"size": found, "seconds": round(time.time() - t0, 1)}


def huggingface():
    import tempfile

    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import loader_data as D

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = D.model()

        def forward(self, input_ids, attention_mask):
            return (self.inner(input_ids, attention_mask),)

    runs = []  # [batch size, optimizer steps done] per (re)start of the training loop

    class Count(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            runs.append([trainer._train_batch_size, 0])

        def on_step_end(self, args, state, control, **kw):
            runs[-1][1] += 1

    budget()
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[],
                             per_device_train_batch_size=1024, auto_find_batch_size=True,
                             num_train_epochs=1, train_sampling_strategy="sequential",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Wrapped(), args=args, train_dataset=D.Tokens(),
                      data_collator=D.pad, callbacks=[Count()])
    t0 = time.time()
    trainer.train()
    return {"size": runs[-1][0], "restarts": len(runs) - 1,
            "steps_lost": sum(steps for _, steps in runs[:-1]),
            "sizes": [size for size, _ in runs], "seconds": round(time.time() - t0, 1)}


def autobatch_find(on):
    import autobatch

    import loader_data as D

    loader = D.loader("pad")
    t0 = time.time()
    r = autobatch.find(D.model(), next(iter(loader)) if on == "first" else loader,
                       memory_limit=LIMIT, device="cpu", progress=False)
    return {"size": r.safe_micro_batch, "max": r.max_micro_batch, "trials": len(r.trials),
            "seconds": round(time.time() - t0, 1), "binding": r.data.get("binding_shape")}


def child(name):
    sys.path.insert(0, HELPERS)
    kind, _, arg = name.partition(":")
    out = {"lightning": lambda: lightning(arg), "huggingface": huggingface,
           "autobatch": lambda: autobatch_find(arg)}[kind]()
    print("RESULT " + json.dumps(out))


def fresh(argv):
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=HELPERS)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith(("RESULT ", "{"))][-1]
    return json.loads(line.removeprefix("RESULT "))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows as JSON here too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return child(a.child)
    finders = [("Lightning BatchSizeFinder, power", "lightning:power"),
               ("Lightning BatchSizeFinder, binsearch", "lightning:binsearch"),
               ("HF Trainer auto_find_batch_size (from 1024)", "huggingface"),
               ("autobatch.find on the first batch", "autobatch:first"),
               ("autobatch.find on the DataLoader", "autobatch:loader")]
    rows = []
    for label, name in finders:
        found = fresh([os.path.abspath(__file__), "--child", name])
        epoch = fresh([os.path.join(HELPERS, "loader_epoch.py"), "epoch", "pad", str(LIMIT),
                       str(found["size"])])
        rows.append({"finder": label, **found, "epoch": epoch})
        print(f"{label}: {found} -> epoch {epoch}", file=sys.stderr)
    print("| finder | answer | its cost | one epoch at the answer (plain loop, same budget) |")
    print("|---|---|---|---|")
    for r in rows:
        e = r["epoch"]
        cost = f"{r['seconds']} s"
        if "restarts" in r:
            cost += (f", {r['restarts']} restarts ({' -> '.join(map(str, r['sizes']))}), "
                     f"{r['steps_lost']} optimizer steps thrown away")
        if "trials" in r:
            cost += f", {r['trials']} trials"
        verdict = (f"trains all {e['batches']} batches" if e["failed_batch"] is None else
                   f"out of memory at batch {e['failed_batch']} (shape {e['shape']})")
        print(f"| {r['finder']} | {r['size']} | {cost} | {verdict} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
