"""The peer batch finders of the benchmark, and the ground-truth checks, one per process.

Run by scripts/bench/run.py in a child process (on the CPU under RLIMIT_DATA, set by the parent
before this interpreter starts, so imports count against the cap as they would in a user's job).
Prints one line ``RESULT {json}`` at the end, also when the finder crashed.

Finders (each trains the same eager PyTorch model as the TorchScript archive of
scripts/export_models.py, with AdamW, cross-entropy and the given precision):
  lightning-binsearch, lightning-power
      PyTorch Lightning ``Tuner.scale_batch_size`` with its defaults (init_val 2, 3 steps per
      trial, max_trials 25, margin 0.05). Reports what it returns and its raw maximum (the largest
      size whose 3 steps all ran).
  accelerate
      HF accelerate ``find_executable_batch_size`` (multiplies by 0.9 after an OOM) around a plain
      3-step training loop, from --start.
  autobatch-python
      The Python package's ``autobatch.find`` (issue 29) on the same eager model, one sample of
      the same batch, the same cross-entropy (``loss_fn``) and AdamW, --steps-per-trial steps per
      trial (3: the peers' trial and the ground truth's), ``margin=0.0`` (its answer is its raw
      maximum, as the CLI rows' ``--margin 0``) and ``memory_limit="1TiB"``: under RLIMIT_DATA the
      budget is clipped to the room the process has (issue 27, row 11), and the real allocator
      decides wherever it refuses first. Reports safe_micro_batch (found) and max_micro_batch
      (raw_max), the trials and steps of its report.
  check-lightning, check-accelerate, check-autobatch-python
      Ground truth in that finder's harness: --batch B trained for --steps steps in a fresh
      process (same imports, same loop; for autobatch-python ``autobatch.check_batch`` with the
      options of its search). Exit 0 when it fits.
  eager
      The eager PyTorch loop at --batch B (autobatch's answer checked as the user trains): fits or
      not, and the CUDA peak allocated / reserved bytes.
  count
      Exact parameter, gradient and AdamW state bytes (after one optimizer step).
  export
      Writes the TorchScript archive of a model that scripts/export_models.py does not have (the
      tiny Llama) to --out with ``autobatch.export``, for the CLI rows. No search.

Models: those of scripts/export_models.py, and ``tiny_llama``: a transformers LlamaForCausalLM
built from a LlamaConfig (nothing downloaded; hidden 256, 4 layers, 4 heads, 2 KV heads, MLP 1024,
vocabulary 8000, untied embeddings, use_cache off: 8.3M parameters); its output's ``logits`` go
into the same cross-entropy as the other language model's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

T0 = time.time()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from export_models import MODELS  # noqa: E402


class Recorder:
    """Counts trials and training steps from inside the training step (no finder exposes them)."""

    def __init__(self, steps_per_trial: int):
        self.steps_per_trial = steps_per_trial
        self.entered: list[int] = []  # batch size of every training step started
        self.done: dict[int, int] = {}  # batch size -> steps completed

    def enter(self, size: int) -> None:
        self.entered.append(size)

    def finish(self, size: int) -> None:
        self.done[size] = self.done.get(size, 0) + 1

    def summary(self) -> dict:
        sizes = [s for i, s in enumerate(self.entered) if i == 0 or self.entered[i - 1] != s]
        fitting = [s for s, n in self.done.items() if n >= self.steps_per_trial]
        return {"trials": len(sizes), "steps": len(self.entered), "trial_sizes": sizes,
                "raw_max": max(fitting) if fitting else None}


TINY_LLAMA_VOCAB = 8000


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=TINY_LLAMA_VOCAB, hidden_size=256, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, use_cache=False)
    return LlamaForCausalLM(config)


def make_model(name: str):
    if name == "tiny_llama":
        return tiny_llama()
    model, _, _, _ = MODELS[name]()
    return model


def make_inputs(args, size: int, device: str) -> torch.Tensor:
    shape = [int(d) for d in args.shape.split("x")]
    if args.int_high:
        return torch.randint(0, args.int_high, (size, *shape), device=device)
    return torch.randn(size, *shape, device=device)


def make_targets(args, size: int, device: str) -> torch.Tensor:
    shape = [int(d) for d in args.shape.split("x")]
    if args.int_high:
        return torch.randint(0, args.int_high, (size, *shape), device=device)
    return torch.randint(0, 1000, (size,), device=device)


def make_batch(args, size: int, device: str):
    return make_inputs(args, size, device), make_targets(args, size, device)


def loss_of(out, y: torch.Tensor) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):  # a transformers ModelOutput
        out = out.logits
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


def autocast(args):
    if args.precision == "amp-bf16":
        return torch.autocast(args.device_type, dtype=torch.bfloat16)
    if args.precision == "amp-fp16":
        return torch.autocast(args.device_type, dtype=torch.float16)
    return torch.autocast(args.device_type, enabled=False)


def plain_steps(args, model, optimizer, size: int, rec: Recorder | None) -> None:
    """The user's loop: --steps optimizer steps at micro-batch `size`."""
    model.train()
    for _ in range(args.steps):
        if rec:
            rec.enter(size)
        x, y = make_batch(args, size, args.device)
        with autocast(args):
            loss = loss_of(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del x, y, loss
        if rec:
            rec.finish(size)


def run_lightning(args, rec: Recorder, mode: str | None, margin: float | None = None) -> dict:
    """Lightning's finder (mode binsearch or power) or, with mode None, its ground truth; margin:
    scale_batch_size's (None: Lightning's default, 0.05; the race passes 0.0)."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):
        def __init__(self):
            x, y = make_batch(args, 1, "cpu")
            self.x, self.y = x[0], y[0]

        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            return self.x, self.y

    class Lit(pl.LightningModule):
        def __init__(self, batch_size: int):
            super().__init__()
            self.net = make_model(args.model)
            self.batch_size = batch_size

        def train_dataloader(self):
            return DataLoader(Synthetic(), batch_size=self.batch_size, num_workers=0)

        def training_step(self, batch, _):
            rec.enter(batch[0].shape[0])
            x, y = batch
            return loss_of(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, _):
            rec.finish(batch[0].shape[0])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    precision = {"fp32": "32-true", "amp-bf16": "bf16-mixed", "amp-fp16": "16-mixed"}[args.precision]
    # Tuner.scale_batch_size saves the model to default_root_dir/.scale_batch_size_<uuid>.ckpt
    # (tens of MB) and removes it only when it returns: a finder killed at its timeout or by the
    # memory cap left it in the working folder (once committed at the repo root). Lightning writes
    # nothing else here (no logger, no checkpointing), but its root is a temporary folder anyway.
    root = tempfile.mkdtemp(prefix="autobatch-peers-lightning-")
    common = dict(accelerator="gpu" if args.device_type == "cuda" else "cpu", devices=1,
                  precision=precision, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, default_root_dir=root)
    try:
        if mode is None:  # ground truth: --steps steps at --batch
            trainer = pl.Trainer(max_steps=args.steps, **common)
            trainer.fit(Lit(args.batch))
            return {"fits": rec.done.get(args.batch, 0) >= args.steps}
        trainer = pl.Trainer(max_epochs=1, **common)
        extra = {} if margin is None else {"margin": margin}
        lit = Lit(2)
        t0 = time.time()  # the finder's call alone (search_s), as the race times every finder
        found = Tuner(trainer).scale_batch_size(lit, mode=mode, steps_per_trial=3, init_val=2,
                                                **extra)
        return {"found": found, "search_s": round(time.time() - t0, 2)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_accelerate(args, rec: Recorder, search: bool) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import find_executable_batch_size

    accelerator = Accelerator(cpu=args.device_type == "cpu")

    def train(batch_size: int) -> int:
        accelerator.free_memory()
        model = make_model(args.model).to(args.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plain_steps(args, model, optimizer, batch_size, rec)
        return batch_size

    if not search:
        train(args.batch)
        return {"fits": True}
    t0 = time.time()
    found = find_executable_batch_size(train, starting_batch_size=args.start)()
    return {"found": found, "search_s": round(time.time() - t0, 2)}


def autobatch_python_options(args) -> dict:
    """find()'s options of the autobatch-python finder and its ground-truth check (one place)."""
    precision = None if args.precision == "fp32" else args.precision

    def loss_fn(output, inputs):
        # The peers' targets (random labels, the same shapes), made here since the example batch
        # is the model's input alone (a tuple would be passed to the model as a second argument).
        return loss_of(output, make_targets(args, inputs.shape[0], inputs.device))

    return dict(optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3), loss_fn=loss_fn,
                precision=precision, device=args.device, memory_limit="1TiB", margin=0.0,
                steps_per_trial=args.steps_per_trial)


def run_autobatch_python(args, search: bool) -> dict:
    import autobatch

    model = make_model(args.model).to(args.device)
    example = make_inputs(args, 1, args.device)
    options = autobatch_python_options(args)
    if not search:
        options["steps_per_trial"] = args.steps
        trial = autobatch.check_batch(model, example, args.batch, **options)
        return {"fits": trial.outcome == "fits", "outcome": trial.outcome,
                "peak_bytes": trial.peak_bytes}
    try:
        result = autobatch.find(model, example, **options)
    except autobatch.DoesNotFit as e:
        result = e.result
    trials = result.trials
    return {"found": result.safe_micro_batch or None, "raw_max": result.max_micro_batch or None,
            "status": result.status, "trials": len(trials),
            "steps": sum(steps_of(t, result.raw) for t in range(len(trials))),
            "trial_sizes": [t.micro_batch_size for t in trials],
            "steps_per_trial": options["steps_per_trial"],
            "memory_limit_bytes": result.memory_limit_bytes,
            "limit_source": (result.raw.get("result") or {}).get("memory_limit_source"),
            "warnings": result.warnings[:3]}


def steps_of(index: int, report: dict) -> int:
    """Training steps a trial started: those completed, plus the one that failed."""
    t = report["trials"][index]
    return t.get("steps_completed", 0) + (t.get("outcome") != "fits")


def run_export(args) -> dict:
    import autobatch

    model = make_model(args.model)
    ids = make_inputs(args, 2, "cpu")
    autobatch.export(model, args.out, {"input_ids": ids, "labels": ids},
                     int_high={0: args.int_high, 1: args.int_high})
    return {"archive": args.out, "bytes": os.path.getsize(args.out)}


def run_eager(args, rec: Recorder) -> dict:
    model = make_model(args.model).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    plain_steps(args, model, optimizer, args.batch, rec)
    out = {"fits": True}
    if args.device_type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return out


def run_count(args) -> dict:
    model = make_model(args.model).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain_steps(argparse.Namespace(**{**vars(args), "steps": 1}), model, optimizer, 2, None)
    params = {p.data_ptr(): p for p in model.parameters()}.values()  # tied weights once
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return {"parameter_count": sum(p.numel() for p in params),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
            "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finder", required=True,
                        choices=["lightning-binsearch", "lightning-power", "accelerate",
                                 "autobatch-python", "check-lightning", "check-accelerate",
                                 "check-autobatch-python", "eager", "count", "export"])
    parser.add_argument("--model", required=True, choices=sorted([*MODELS, "tiny_llama"]))
    parser.add_argument("--shape", required=True, help="one sample, e.g. 3x64x64 or 128")
    parser.add_argument("--int-high", type=int, default=0, help="int64 token ids in [0, N)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16", "amp-fp16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit-bytes", type=int, default=0,
                        help="CUDA: cap the caching allocator at this many bytes "
                             "(torch.cuda.set_per_process_memory_fraction of the card)")
    parser.add_argument("--mkldnn", default="on", choices=["on", "off"])
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--start", type=int, default=512)
    parser.add_argument("--steps-per-trial", type=int, default=3,
                        help="autobatch-python: optimizer steps per trial (the peers run 3)")
    parser.add_argument("--out", default="", help="export: the archive to write")
    args = parser.parse_args()
    args.device_type = torch.device(args.device).type
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    torch.manual_seed(0)
    rec = Recorder(3 if args.finder in ("lightning-binsearch", "lightning-power", "accelerate")
                   else args.steps)
    result: dict = {"finder": args.finder, "import_s": round(time.time() - T0, 2)}
    code = 0
    try:
        if args.device_type == "cuda" and args.memory_limit_bytes > 0:
            device = torch.device(args.device)
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_limit_bytes / total),
                                                       device)
        if args.finder.startswith("lightning-"):
            result.update(run_lightning(args, rec, args.finder.split("-", 1)[1]))
        elif args.finder == "check-lightning":
            result.update(run_lightning(args, rec, None))
        elif args.finder in ("accelerate", "check-accelerate"):
            result.update(run_accelerate(args, rec, args.finder == "accelerate"))
        elif args.finder in ("autobatch-python", "check-autobatch-python"):
            result.update(run_autobatch_python(args, args.finder == "autobatch-python"))
        elif args.finder == "export":
            result.update(run_export(args))
        elif args.finder == "eager":
            result.update(run_eager(args, rec))
        else:
            result.update(run_count(args))
        if "fits" in result and not result["fits"]:
            code = 3
    except Exception as e:  # noqa: BLE001 — reported as the finder's result, whatever it is
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        traceback.print_exc(file=sys.stderr)
        code = 3 if args.finder.startswith("check-") or args.finder == "eager" else 1
    for key, value in rec.summary().items():  # autobatch-python reports its own from its report
        result.setdefault(key, value)
    if args.device_type == "cuda" and torch.cuda.is_available():
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["wall_s"] = round(time.time() - T0, 2)
    print("RESULT " + json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
