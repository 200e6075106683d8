"""The fair race (issue 44): every batch finder under the same exact memory budget, one run.

Each finder runs in its own process whose CPU tensors all go through autobatch's budget allocator
(`_budget.backend(limit)`, installed before the model is built, so the model, its
gradients, the optimizer state, the batches and every activation count), and whose refusal the
peers take for out of memory: `_budget.set_refusal_suffix` appends " (DefaultCPUAllocator: can't
allocate memory: ...)" to it, the text both Lightning's `is_oom_error` and accelerate's
`should_reduce_batch_size` match (tests/python/test_race.py calls both on a real refusal).
`autobatch.find` installs the same allocator itself with `memory_limit=` the same bytes (the
model's bytes are its baseline). The limit is exact and deterministic: no glibc heap, no oneDNN
scratch outside the count, no RLIMIT_DATA.

Finders (peers.py's, with margin 0 for all, 3 optimizer steps per trial, AdamW(lr=1e-3),
cross-entropy, fp32):
  lightning-binsearch, lightning-power  Tuner.scale_batch_size(mode=..., steps_per_trial=3,
                                        init_val=2, margin=0.0, max_val=8192)
  accelerate                            find_executable_batch_size(starting_batch_size=8192) around
                                        the plain loop (x 0.9 after each out of memory)
  autobatch                             autobatch.find(model, (x, y), step=<the same loss>,
                                        margin=0.0, steps_per_trial=3, min_batch=2 (as
                                        Lightning's init_val; BatchNorm trains from 2),
                                        max_batch=8192, memory_limit=<the budget>)
  cli                                   the command on the model's TorchScript archive (exported
                                        once into build/bench-race/models/, not timed):
                                        autobatch --model M.pt --device cpu --memory-limit <the
                                        budget>B --margin 0 --min-batch 2 --max-batch 8192
                                        --steps-per-trial 3 --optimizer adamw --keep-output no
                                        (the loop drops its output before backward)
Times: "search s" is the finder's call alone (Lightning's scale_batch_size, accelerate's
decorated function, autobatch.find, the command's whole process), "wall s" the finder's process
from its first import (imports and the model's construction: the same for every finder but the
command, whose wall is its process). autobatch's rows also give its own cost per fitting trial
(the probe's wall less its steps' time: the optimizer built, the weights put back, the glue), as
a share of the step at the answer, and the floor: what its trials at B* (a fit) and B*+1 (out of
memory) took, which no exact finder with the same steps per trial can skip.
B*: the user's own plain loop (peers.plain_steps: 3 steps, batch made per step, AdamW) in a fresh
process under the same budget: B* fits and B*+1 does not, both checked in fresh processes.

Usage: race.py [--models mlp gpt2 ...] [--device cpu|cuda] [--timeout 300] [--md docs/benchmarks.md]
       race.py child --finder F --model M [--device D] [--batch B]   (prints RESULT {json})
On a GPU (--device cuda; scripts/device/race.sh) every finder gets the whole card and meets real
CUDA out of memory: no allocator of ours, no suffix; the models are larger (CUDA_MODELS).
Raw rows: build/bench-race/results.jsonl; the table between the `bench:race` markers of --md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MIB = 1 << 20
SUFFIX = (" (DefaultCPUAllocator: can't allocate memory: the budget allocator refused it; "
          "autobatch's race harness)")

# name: (constructor in this file, one sample's shape, int range of the inputs (0: floats),
#        budget bytes). Budgets chosen so that 150 <= B* < 8192 (Lightning's max_val).
RACE_MODELS = {
    "mlp": ("mlp", "1024", 0, 160 * MIB),
    "gpt2": ("gpt2", "64", 4000, 900 * MIB),
    "llama": ("llama", "64", 4000, 900 * MIB),
    "resnet50": ("resnet50", "3x32x32", 0, 900 * MIB),
    "vit": ("vit", "3x32x32", 0, 1800 * MIB),
}
# On a GPU (--device cuda): the whole card, no harness (every finder meets the caching allocator's
# real CUDA out of memory, which every one of them takes for out of memory), and models large
# enough that 150 <= B* < 8192 on a card of about 139 GiB (an H200): GPT-2 small at 512 tokens,
# ResNet-50 at 128x128, ViT-B/16 at 224x224. Sizes estimated, not yet run (no GPU lent so far).
CUDA_MODELS = {
    "gpt2": ("gpt2_small", "512", 50257, 0),
    "resnet50": ("resnet50", "3x128x128", 0, 0),
    "vit": ("vit", "3x224x224", 0, 0),
}
FINDERS = ["lightning-binsearch", "lightning-power", "accelerate", "autobatch", "cli"]


def models_on(device):
    """The race's models on `device`: name -> (constructor, one sample's shape, int range of the
    inputs (0: floats), budget bytes (0: the whole card))."""
    return CUDA_MODELS if device == "cuda" else RACE_MODELS


def make(name, image_size=32):
    """The race's models, built fresh (nothing downloaded)."""
    import torch
    torch.manual_seed(0)
    if name == "mlp":
        # 5.2M parameters, small activations (1024 wide, 4 layers): AdamW's step (the foreach
        # implementation's temporaries beside the state) sets the peak up to a few hundred samples.
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 1000))
    if name == "gpt2_small":  # the published GPT-2 small's shape (124M parameters)
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(n_positions=512, use_cache=False))
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(vocab_size=4000, n_positions=64, n_embd=128, n_layer=2,
                                          n_head=4, use_cache=False))
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(vocab_size=4000, hidden_size=128,
                                            intermediate_size=384, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=64, use_cache=False))
    import torchvision
    if name == "resnet50":
        return torchvision.models.resnet50(weights=None)
    if name == "vit":
        return torchvision.models.vit_b_16(weights=None, image_size=image_size)
    raise SystemExit(f"race: unknown model {name}")


# ---- one process ----------------------------------------------------------------------------

def child(argv) -> int:
    p = argparse.ArgumentParser(prog="race.py child")
    p.add_argument("--finder", required=True, choices=[*FINDERS, "eager"])
    p.add_argument("--model", required=True, choices=sorted(RACE_MODELS))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--budget-mib", type=int, default=0, help="in place of the model's budget")
    a = p.parse_args(argv)
    t0 = time.time()
    import torch
    # The same imports before every finder's call: `import lightning` imports torch._dynamo (1.0 s
    # here), and so does the first torch.optim optimizer built in a process without it, which
    # was then timed inside autobatch.find's call and accelerate's function on the rows whose
    # models do not import it themselves (the MLP, ResNet-50, ViT: setup 0.9 s in find's call on
    # the MLP) but outside Lightning's. A training script builds its optimizer anyway; here the
    # import counts in every finder's process wall, in none of their searches.
    import torch._dynamo  # noqa: F401
    sys.path.insert(0, HERE)
    import peers
    from autobatch import _budget, _core

    ctor, shape, int_high, budget = models_on(a.device)[a.model]
    budget = a.budget_mib * MIB or budget
    args = argparse.Namespace(model=ctor, shape=shape, int_high=int_high, precision="fp32",
                              device=a.device, device_type=a.device, steps=3, batch=a.batch,
                              start=8192, steps_per_trial=3)
    size = int(shape.split("x")[-1])  # the race's images are square; ViT is built for them
    peers.make_model = lambda name: make(name, size)  # peers' finders build the race's models
    torch.manual_seed(0)
    rec = peers.Recorder(3)
    out = {"finder": a.finder, "model": a.model, "budget_bytes": budget,
           "import_s": round(time.time() - t0, 2)}
    backend = None
    code = 0
    try:
        _budget.set_refusal_suffix(SUFFIX)
        # autobatch.find installs the same allocator itself; the command is a process of its own;
        # a GPU needs no harness.
        if a.device == "cpu" and a.finder not in ("autobatch", "cli"):
            backend = _budget.backend(budget, 0)
            backend.finish_setup(0)  # from here every CPU tensor counts: the model's too
        if a.finder == "cli":
            out.update(run_cli(a.model, budget, a.device))
        elif a.finder.startswith("lightning-"):
            if a.device == "cpu":
                host_checkpoint(_core)
            out.update(peers.run_lightning(args, rec, a.finder.split("-", 1)[1], margin=0.0))
        elif a.finder == "accelerate":
            out.update(peers.run_accelerate(args, rec, True))
        elif a.finder == "autobatch":
            out.update(run_autobatch(args, budget))
        else:
            out.update(peers.run_eager(args, rec))
    except torch.OutOfMemoryError as e:
        out.update(fits=False, error=f"OutOfMemoryError: {str(e)[:160]}")
        code = 3
    except Exception as e:  # noqa: BLE001  reported as the finder's row, whatever it is
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        code = 1
    finally:
        if backend is not None:
            backend.remove()
    for k, v in rec.summary().items():
        out.setdefault(k, v)
    out.setdefault("wall_s", round(time.time() - t0, 2))  # the command's: its own process
    print("RESULT " + json.dumps(out), flush=True)
    return code


def host_checkpoint(core):
    """Lightning's scale_batch_size saves the model to a checkpoint before its search and
    restores it after (lightning/pytorch/tuner/batch_size_scaling.py, 2.6): host memory on a
    GPU, not the device's. Here every tensor is a CPU tensor, so the checkpoint's save and its
    load run outside the budget (`_core.Untracked`), else Lightning failed at its restore after
    a search that had found its size (measured: raw max 746, then out of memory restoring)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    def host(fn):
        def wrapped(*args, **kwargs):
            with core.Untracked():
                return fn(*args, **kwargs)
        return wrapped
    Trainer.save_checkpoint = host(Trainer.save_checkpoint)
    _CheckpointConnector.restore = host(_CheckpointConnector.restore)


def run_autobatch(args, budget):
    import peers
    import autobatch
    import torch
    from autobatch import _trial
    model = peers.make_model(args.model).to(args.device)
    x, y = peers.make_batch(args, 1, args.device)
    # Our own per-trial cost: each probe call's wall time less its steps' own time (the steps are
    # timed inside the trial; the rest is the trial's setup, the optimizer built, the weights put
    # back, the caches emptied, Python's glue).
    # An out-of-memory trial's own cost is its recovery: from the error leaving the steps to the
    # trial's end (the record, the weights put back, the frames cleared).
    timed, recovery, freeing = [], [], []
    probe, steps = _trial.EagerProbe.stopping_at_model_error, _trial.EagerProbe._steps
    measuring = _trial.EagerProbe.measuring_at_model_error
    raised = {}

    def steps_timed(self, *a, **k):
        try:
            return steps(self, *a, **k)
        except BaseException:
            raised["at"] = time.perf_counter()
            raise

    # Of the recovery, the failed step's tensors freed: clearing the error's frames drops the
    # last references to the step's activations (hundreds of MB returned to the system, 17 to
    # 45 ms on the Llama from run to run), work a completed step does inside its own time.
    clear_frames = traceback.clear_frames

    def clear_frames_timed(tb):
        t = time.perf_counter()
        try:
            return clear_frames(tb)
        finally:
            raised["freeing"] = raised.get("freeing", 0.0) + time.perf_counter() - t

    def timed_with(call):
        def timing(self, size, micro_batches):
            raised.clear()
            t = time.perf_counter()
            record = call(self, size, micro_batches)
            end = time.perf_counter()
            timed.append((size, (end - t) * 1000.0, record))
            if record.get("outcome") == "out-of-memory" and "at" in raised:
                recovery.append(round((end - raised["at"]) * 1000.0, 1))
                freeing.append(round(raised.get("freeing", 0.0) * 1000.0, 1))
            return record
        return timing
    traceback.clear_frames = clear_frames_timed
    _trial.EagerProbe.stopping_at_model_error = timed_with(probe)
    _trial.EagerProbe.measuring_at_model_error = timed_with(measuring)
    _trial.EagerProbe._steps = steps_timed
    t0 = time.time()
    result = autobatch.find(model, (x, y), step=lambda m, b: peers.loss_of(m(b[0]), b[1]),
                            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
                            memory_limit=budget or None, margin=0.0, steps_per_trial=3,
                            min_batch=2,
                            max_batch=8192,
                            progress=False)
    trials = result.raw["trials"]
    # A shortened measuring trial's first step (the optimizer's state made at a small batch) is
    # trial work, not ours: its own cost is read on the full trials.
    overhead = [(size, wall - r.get("step_ms", 0.0) * r.get("steps_completed", 0))
                for size, wall, r in timed
                if r.get("outcome", "fits") == "fits" and not r.get("shortened")]
    at_answer = next((r.get("step_ms", 0.0) for size, _, r in timed
                      if size == result.max_micro_batch and not r.get("shortened")), 0.0)
    # The floor: the fit at the answer and the failure one above it, which every exact finder
    # running the same steps must pay.
    # (the fit at B* a full trial: a measuring trial's fit there is not the answer; the failure
    # at B*+1 whichever trial showed it)
    floor = sum(wall for size, wall, r in timed
                if (size == result.max_micro_batch and not r.get("shortened"))
                or size == result.max_micro_batch + 1)
    search_s = time.time() - t0
    return {"found": result.safe_micro_batch, "raw_max": result.max_micro_batch,
            "overhead_ms": [round(o, 1) for _, o in overhead], "recovery_ms": recovery,
            "freeing_ms": freeing,
            "step_ms_at_answer": round(at_answer, 1),
            "floor_s": round(floor / 1000.0, 2),
            # find()'s own time outside its trials: the snapshot, the checks, the report
            "setup_ms": round(search_s * 1000.0 - sum(wall for _, wall, _ in timed), 1),
            "trials": len(trials), "search_s": round(search_s, 2),
            # a failed trial's step in progress counts; a shortened measuring trial's first step,
            # which makes the optimizer's state, too
            "steps": sum(t.get("steps_completed", 0) + (t.get("outcome") != "fits")
                         + bool(t.get("shortened")) for t in trials),
            "trial_sizes": [t["micro_batch_size"] for t in trials],
            # each probe call's wall, s: where the search's time went
            "trial_s": [[size, round(wall / 1000.0, 2)] + (["measuring"] if r.get("shortened")
                                                          else [])
                        for size, wall, r in timed]}


def archive(model, device):
    """The model's TorchScript archive for the command (exported once per torch version; the
    export is the user's step before the search, not timed)."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from autobatch_export import export
    ctor, shape, int_high, _ = models_on(device)[model]
    folder = os.path.join(ROOT, "build", "bench-race", "models")
    path = os.path.join(folder, f"{ctor}-{shape}-torch{torch.__version__}.pt")
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)
    dims = [int(d) for d in shape.split("x")]
    net = make(ctor, dims[-1])
    if int_high:  # transformers models: keyword input_ids, logits [B, L, V], a target per token
        export(net, path + ".tmp", {"input_ids": torch.randint(0, int_high, (2, *dims))},
               loss="cross-entropy", int_high={0: int_high})
    else:
        export(net, path + ".tmp", (torch.randn(2, *dims),), loss="cross-entropy")
    os.replace(path + ".tmp", path)
    return path


def run_cli(model, budget, device):
    from autobatch_export import find_cli
    path = archive(model, device)
    cli = find_cli()
    if cli is None:
        raise RuntimeError("no autobatch executable: build it with scripts/build.sh")
    report = os.path.join(ROOT, "build", "bench-race", f"cli-{model}.json")
    limit = ["--memory-limit", f"{budget}B"] if budget else []
    command = [cli, "--model", path, "--device", device, *limit, "--margin", "0", "--min-batch", "2", "--max-batch", "8192",
               "--steps-per-trial", "3", "--optimizer", "adamw", "--lr", "1e-3",
               "--keep-output", "no", "--quiet", "--json", report]
    t0 = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = round(time.time() - t0, 2)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    with open(report) as f:
        doc = json.load(f)
    trials = doc["trials"]
    return {"found": doc["result"]["safe_micro_batch"], "raw_max": doc["result"]["max_micro_batch"],
            "trials": len(trials), "search_s": wall, "wall_s": wall,
            "steps": sum(t.get("steps_completed", 0) + (t.get("outcome") != "fits")
                         for t in trials),
            "trial_sizes": [t["micro_batch_size"] for t in trials]}


# ---- the run --------------------------------------------------------------------------------

def spawn(argv, timeout):
    t0 = time.time()
    # A session of its own, killed whole at the timeout: the cli finder's command is the child's
    # child, and a timed-out finder must not leave it running into the next finder's time.
    proc = subprocess.Popen([sys.executable, __file__, "child", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout} s (killed)", "wall_s": round(time.time() - t0, 1)}
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit {proc.returncode}: {stderr[-300:]}",
            "wall_s": round(time.time() - t0, 1)}


def fits_on(model, batch, cache, device):
    if batch not in cache:
        r = spawn(["--finder", "eager", "--model", model, "--batch", str(batch), "--device",
                   device], 600)
        if "fits" not in r:
            # Another error than out of memory (on a GPU, cuDNN or cuBLAS failing to get its
            # workspace near the limit): taken as not fitting, and said under the table, so one
            # check does not lose the finders' rows.
            CHECK_ERRORS.append(f"{model} at {batch}: {r.get('error', r)}"[:300])
            print(f"[race] {model}: eager loop at {batch}: error, taken as not fitting: {r}",
                  file=sys.stderr, flush=True)
            r["fits"] = False
        cache[batch] = r["fits"]
        print(f"[race] {model}: eager loop at {batch}: {'fits' if r['fits'] else 'out of memory'}"
              f" ({r['wall_s']} s)", file=sys.stderr, flush=True)
    return cache[batch]


CHECK_ERRORS = []  # B* checks that ended in another error than out of memory


def exact_b_star(model, guesses, device):
    """B*: the largest micro-batch whose plain loop fits (B* fits, B*+1 does not), from the
    finders' answers as first guesses, each check a fresh process."""
    cache = {}

    def fits(batch):
        return fits_on(model, batch, cache, device)
    lo, hi = 0, None  # lo fits (0: nothing known), hi does not
    for g in sorted({g for g in guesses if g}):
        if fits(g):
            lo = max(lo, g)
        else:
            hi = g if hi is None else min(hi, g)
            break
    if lo and not fits(lo + 1):
        return lo, cache
    lo = lo + 1 if lo else 1
    while hi is None:  # above every answer: double
        if fits(lo * 2):
            lo *= 2
        else:
            hi = lo * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, cache


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(RACE_MODELS),
                   help="default: every model of the device (cuda: gpt2 resnet50 vit)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: the whole card, no harness, larger models (CUDA_MODELS)")
    p.add_argument("--finders", nargs="+", default=FINDERS, choices=FINDERS)
    p.add_argument("--timeout", type=int, default=300, help="seconds per finder")
    p.add_argument("--md", default="", help="write the table between the bench:race markers")
    p.add_argument("--jsonl", default=os.path.join(ROOT, "build", "bench-race", "results.jsonl"))
    a = p.parse_args()
    a.models = a.models or list(models_on(a.device))
    missing = [m for m in a.models if m not in models_on(a.device)]
    if missing:
        p.error(f"no {a.device} configuration for {' '.join(missing)}: "
                f"choose from {' '.join(models_on(a.device))}")
    os.makedirs(os.path.dirname(a.jsonl), exist_ok=True)
    t0 = time.time()
    load0 = os.getloadavg()[0]
    tables = []
    for model in a.models:
        rows = []
        for finder in a.finders:
            print(f"[race] {model}: {finder} ...", file=sys.stderr, flush=True)
            r = spawn(["--finder", finder, "--model", model, "--device", a.device], a.timeout)
            r.update(finder=finder, model=model)
            rows.append(r)
            print(f"[race] {model}: {finder}: {json.dumps(r)[:400]}", file=sys.stderr, flush=True)
        b_star, checks = exact_b_star(model, [r.get("found") for r in rows] +
                                      [r.get("raw_max") for r in rows], a.device)
        for r in rows:
            r["b_star"] = b_star
            r["b_star_checks"] = {str(k): v for k, v in sorted(checks.items())}
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(r) + "\n")
        tables.append((model, b_star, rows))
    text = render(tables, a, load0, os.getloadavg()[0], time.time() - t0)
    print(text)
    if a.md:
        write_md(a.md, text)
    return 0


def render(tables, a, load0, load1, seconds):
    command = "python scripts/bench/race.py " + " ".join(sys.argv[1:])
    out = ["<!-- generated by scripts/bench/race.py; do not edit by hand -->",
           f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores; "
           f"1-minute load {load0:.2f} at the start, {load1:.2f} at the end; {seconds:.0f} s in "
           f"all. Command: `{command}`.", ""]
    totals = {}
    ours = []  # autobatch's own cost per model
    for model, b_star, rows in tables:
        ctor, shape, _, budget = models_on(a.device)[model]
        where = f"budget {budget // MIB} MiB" if budget else f"{a.device}, the whole card"
        out += [f"### {model} ({ctor}, {shape}; {where}; B* {b_star})", "",
                "| finder | answer | offset from B* | trials | steps | search s | wall s | error |",
                "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            found = r.get("found")
            offset = f"{found - b_star:+d}" if isinstance(found, int) and found else "-"
            out.append(f"| {r['finder']} | {found if found else '-'} | {offset} | "
                       f"{r.get('trials', '-')} | {r.get('steps', '-')} | "
                       f"{r.get('search_s', '-')} | {r.get('wall_s', '-')} "
                       f"| {r.get('error', '')[:120]} |")
            t = totals.setdefault(r["finder"], [0, 0.0, 0.0, 0])
            t[0] += r.get("trials") or 0
            t[1] += r.get("search_s") or 0.0
            t[2] += r.get("wall_s") or 0.0
            t[3] += int(found == b_star)
            if r["finder"] == "autobatch" and r.get("step_ms_at_answer"):
                ours.append((model, r))
        out.append("")
    base = totals.get("lightning-binsearch")
    out += ["Summed over the table (exact: answers equal to B*):", "",
            "| finder | exact rows | trials | search s | wall s | trials / binsearch "
            "| search / binsearch | wall / binsearch |", "|---|---|---|---|---|---|---|---|"]

    def ratio(value, of):
        return f"{value / of:.2f}" if of else "-"
    for finder, (trials, search, wall, exact) in totals.items():
        ratios = (" | ".join(ratio(v, b) for v, b in zip((trials, search, wall), base[:3]))
                  if base else "- | - | -")
        out.append(f"| {finder} | {exact} of {len(tables)} | {trials} | {search:.1f} | "
                   f"{wall:.1f} | {ratios} |")
    if ours:
        out += ["", "autobatch's own cost (a fitting trial's wall less its steps' time; an "
                "out-of-memory trial's recovery, from the error leaving the steps to the trial's "
                "end, and of it the failed step's tensors freed when the error's frames are "
                "cleared, which a completed step does inside its own time; own: the recovery "
                "less that; setup: find()'s time outside its trials) and its floor (its trials "
                "at B* and B*+1):", "",
                "| model | step ms at the answer | own ms per fitting trial (largest) | recovery "
                "ms (largest) | of it freeing the step's tensors ms | own recovery ms (largest) "
                "| largest own share of the step | largest share, freeing counted | setup ms "
                "| floor s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        floor = 0.0
        least = 0.0  # the floor plus the row's process outside its search
        for model, r in ours:
            worst = max(r.get("overhead_ms") or [0.0])
            recoveries = r.get("recovery_ms") or [0.0]
            freed = r.get("freeing_ms") or [0.0] * len(recoveries)
            worst_recovery = max(recoveries)
            at = recoveries.index(worst_recovery)
            own_recovery = max(round(a - b, 1) for a, b in zip(recoveries, freed))
            step = r["step_ms_at_answer"]
            share = 100.0 * max(worst, own_recovery) / step
            gross = 100.0 * max(worst, worst_recovery) / step
            floor += r.get("floor_s", 0.0)
            least += r.get("floor_s", 0.0) + r.get("wall_s", 0.0) - r.get("search_s", 0.0)
            out.append(f"| {model} | {step} | {worst} | {worst_recovery} | {freed[at]} | "
                       f"{own_recovery} | {share:.1f}% | {gross:.1f}% | "
                       f"{r.get('setup_ms', '-')} | {r.get('floor_s', '-')} |")
        if base and base[1]:
            out += ["", f"The floor summed: {floor:.1f} s, {floor / base[1]:.2f} of Lightning "
                    "binsearch's search time."]
        if base and base[2]:
            # What an exact finder that ran nothing but the floor's two trials would take, with
            # the same process around them (the imports and the model, which no finder's call
            # can shorten): the least process wall the table allows such a finder.
            out += ["", f"The floor plus each row's process outside its search (imports, the "
                    f"model): {least:.1f} s, {least / base[2]:.2f} of Lightning binsearch's "
                    "wall: the least process wall of an exact finder that paid nothing but the "
                    "floor."]
    if CHECK_ERRORS:
        out += ["", "B* checks that ended in another error than out of memory (taken as not "
                "fitting):", *[f"- {e}" for e in CHECK_ERRORS]]
    return "\n".join(out) + "\n"


def write_md(path, text):
    if not os.path.exists(path):  # a file of its own (the device call's $OUT/race.md)
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        doc = f.read()
    begin, end = "<!-- bench:race:begin -->", "<!-- bench:race:end -->"
    if begin not in doc:
        raise SystemExit(f"race: {path} has no {begin} marker")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


if __name__ == "__main__":
    sys.exit(main())
