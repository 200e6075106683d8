#!/usr/bin/env python3
"""autobatch's peak against the user's own job: an eager PyTorch loop with PyTorch's defaults.

For each case (model, batch, optimizer, implementation, output kept or dropped, zero_grad mode,
precision) it measures, on the CPU:
- eager: a plain loop (zero_grad, inputs and targets made, forward, loss, backward, step) for 2
  steps under torch.profiler with profile_memory=True; its CPU allocation events (kineto events
  named "[memory]", signed byte counts) summed in time order, the maximum taken, plus the bytes of
  the model's parameters and buffers alive before the profile;
- autobatch: `autobatch --check-batch B --memory-limit 4GiB --json`, trials[0].peak_allocated_bytes
  (with --memory-limit given, the process guard's whole-process figure does not enter).
and prints the difference in %. Targets (the fidelity issue): every row within 1%, and autobatch
never below the eager peak by more than 0.5% (an under-count is an OOM in the job).

  fidelity.py --set test  --check          # the ctest subset (tests/CMakeLists.txt), about a minute
  fidelity.py --set full  --md docs/fidelity.md   # the table of docs/fidelity.md
  fidelity.py --set pt2   --md docs/fidelity-pt2.md  # packages (docs/formats.md) against eager
  fidelity.py --set wide  --md FILE  # the wider set of issue 26, the same way (docs/formats.md)

With --set pt2 (and wide) the autobatch column runs the model's torch.export + AOTInductor package
(scripts/pt2_packages.py builds it, cached) and a second column the TorchScript archive, both
against the same eager loop (fp32, AdamW, loop implementation, output dropped).

The eager models are the nn.Modules of scripts/export_models.py (the same code the archives were
exported from); the archives are read from --models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import export_models  # noqa: E402
from autobatch_export import profiled_peak  # noqa: E402

class TwoDtypes(torch.nn.Module):
    """Parameters in two dtypes (float32 then float64): PyTorch's foreach and fused steps run one
    group per (device, dtype), and Python keeps a group's temporaries alive into the next one."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(1024, 1024)
        self.b = torch.nn.Linear(1024, 1024).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)).double())


# Models made here (exported into --workdir), beside the archives of scripts/export_models.py.
EXTRA_MODELS = {
    "two_dtypes": lambda: (TwoDtypes(), (torch.randn(2, 1024),), "mean", None),
    "decoder_lm_small_1024": lambda: export_models.decoder_lm_small(1024),
}


def build(name: str):
    if name in EXTRA_MODELS:
        return EXTRA_MODELS[name]()
    if name in export_models.MODELS:
        return export_models.MODELS[name]()
    import pt2_packages  # the wider set's models (issue 26) are defined there, with their packages

    return pt2_packages.MODELS[name]()


TOLERANCE_PCT = 1.0
UNDER_PCT = 0.5


@dataclass
class Case:
    model: str  # a name of export_models.MODELS
    batch: int
    optimizer: str = "adamw"  # sgd, sgd-momentum, adam, adamw
    impl: str = "loop"  # loop, foreach, fused
    keep_output: bool = False
    zero_grad: str = "none"  # none, zeros
    precision: str = "fp32"  # fp32, amp-bf16
    input: str | None = None  # --input for the vision models (e.g. 3x64x64)
    package: str | None = None  # a scripts/pt2_packages.py name: run that pt2 package instead
    micro_batches: int = 1  # --accumulation-steps (2: the eager loop accumulates 2 micro-batches)

    def label(self) -> str:
        parts = [self.model, f"B={self.batch}", self.optimizer, self.impl,
                 "output kept" if self.keep_output else "output dropped"]
        if self.zero_grad != "none":
            parts.append(f"zero_grad {self.zero_grad}")
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.input:
            parts.append(self.input)
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches")
        return ", ".join(parts)


def make_optimizer(case: Case, params):
    kwargs = {"foreach": case.impl == "foreach", "fused": case.impl == "fused"}
    lr = 1e-3
    if case.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, **kwargs)
    if case.optimizer == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **kwargs)
    if case.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, **kwargs)
    if case.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kwargs)
    raise ValueError(case.optimizer)


def eager_peak(case: Case, steps: int = 2) -> int:
    torch.manual_seed(0)
    model, example, loss_kind, int_high = build(case.model)
    model.train()
    opt = make_optimizer(case, [p for p in model.parameters() if p.requires_grad])
    sample = tuple(example[0].shape[1:])
    if case.input:
        sample = tuple(int(d) for d in case.input.split("x"))
    high = int_high.get(0) if int_high else None
    before = sum(t.numel() * t.element_size()
                 for t in list(model.parameters()) + list(model.buffers()))
    amp = case.precision == "amp-bf16"
    x = y = out = None  # the loop's variables: alive until rebound, as in a user's script
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps * case.micro_batches):
            if _ % case.micro_batches == 0:
                opt.zero_grad(set_to_none=case.zero_grad == "none")
            if high is not None:
                x = torch.randint(0, high, (case.batch, *sample))
            else:
                x = torch.randn(case.batch, *sample)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                if case.keep_output:
                    out = model(x)
                    logits = out
                else:
                    logits = model(x)
                if loss_kind == "cross-entropy":
                    classes = logits.shape[-1]
                    y = torch.randint(0, classes, (logits.numel() // classes,))
                    loss = F.cross_entropy(logits.reshape(-1, classes), y)
                elif loss_kind == "mse":
                    y = torch.randn_like(logits)
                    loss = F.mse_loss(logits, y)
                else:
                    loss = logits.mean()
                del logits
            loss.backward()
            del loss
            if _ % case.micro_batches == case.micro_batches - 1:
                opt.step()
    del x, y, out
    return before + profiled_peak(prof)  # the export's memory check sums its profile the same way


def pt2_path(name: str) -> str:
    """The package (or, for NAME.ts, the TorchScript archive) scripts/pt2_packages.py built."""
    run = subprocess.run([sys.executable, os.path.join(HERE, "..", "pt2_packages.py"), name],
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"pt2_packages.py {name}: exit {run.returncode}\n{run.stderr[-2000:]}")
    return run.stdout.split()[-1]


def autobatch_peak(case: Case, cli: str, models: str, workdir: str,
                   archive_override: str | None = None) -> tuple[int, dict]:
    os.makedirs(workdir, exist_ok=True)
    report = os.path.join(workdir, "fidelity.json")
    archive = archive_override or os.path.join(models, f"{case.model}.pt")
    if archive_override is None and case.model in EXTRA_MODELS:
        archive = os.path.join(workdir, f"{case.model}.pt")
        if not os.path.exists(archive):
            torch.manual_seed(0)
            model, example, loss, int_high = build(case.model)
            export_models.export(model, archive, example, loss=loss, int_high=int_high)
    cmd = [cli, "--model", archive, "--device", "cpu",
           "--memory-limit", "4GiB", "--check-batch", str(case.batch), "-q",
           "--optimizer", case.optimizer, "--optimizer-impl", case.impl,
           "--keep-output", "yes" if case.keep_output else "no", "--zero-grad", case.zero_grad,
           "--precision", case.precision, "--json", report,
           "--accumulation-steps", str(case.micro_batches)]
    if case.input:
        cmd += ["--input", case.input]
    doc = cli_report(cmd, report)
    return int(doc["trials"][0]["peak_allocated_bytes"]), doc


def cli_report(cmd: list[str], report: str) -> dict:
    """Runs the autobatch command `cmd` (which writes its JSON to `report`) and returns that
    report; RuntimeError with the command and its stderr when it fails (also eval_fidelity.py's)."""
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0 or not os.path.exists(report):
        raise RuntimeError(f"{' '.join(cmd)}: exit {run.returncode}\n{run.stderr[-2000:]}")
    with open(report) as f:
        return json.load(f)


def test_cases() -> list[Case]:
    """The ctest subset: every implementation of every optimizer on the parameter-heavy MLP (a
    foreach or fused step that silently ran the loop is off by 17.6% / 5.9% there), and the
    output's lifetime and zero_grad on the small decoder LM."""
    cases = [Case("mlp_8x2048", 16, opt, impl)
             for opt in ("sgd-momentum", "adam", "adamw") for impl in ("loop", "foreach", "fused")]
    # Two dtypes: two groups; Python's foreach keeps the first group's sqrt temporaries alive while
    # it makes the second's (a C++ step that freed them was 6.7% under the eager loop).
    cases += [Case("two_dtypes", 8, "adamw", impl) for impl in ("loop", "foreach", "fused")]
    cases += [Case("decoder_lm_small", 4, keep_output=True),
              Case("decoder_lm_small", 4, keep_output=False),
              Case("decoder_lm_small", 4, keep_output=False, zero_grad="zeros")]
    return cases


def pt2_cases() -> list[Case]:
    """Packages against eager (issue 19): fp32, AdamW, loop, output dropped."""
    cases = []
    for b in (16, 64):
        cases.append(Case("resnet18", b, input="3x64x64", package="resnet18_64"))
        cases.append(Case("mobilenet_v3_large", b, input="3x64x64",
                          package="mobilenet_v3_large_64"))
        cases.append(Case("mlp_8x2048", b, package="mlp_8x2048"))
    for b in (4, 16):
        cases.append(Case("decoder_lm_small", b, package="decoder_lm_small"))
    # 1024 tokens: where the attention matrix (B x 4 heads x T x T) and the logits dominate;
    # packages once materialised the first and fused the loss over the second (issue 19,
    # docs/formats.md)
    for b in (2, 4):
        cases.append(Case("decoder_lm_small_1024", b, package="decoder_lm_small_1024"))
    cases.append(Case("resnet18", 16, input="3x64x64", package="resnet18_64", micro_batches=2))
    cases.append(Case("mlp_8x2048", 16, package="mlp_8x2048", micro_batches=2))
    return cases


# The wider set (issue 26, item 4): each model of scripts/pt2_packages.py WIDE_MODELS at two
# batches. The package and the TorchScript archive are the model's own (NAME, NAME.ts).
WIDE_BATCHES = {"convnext_tiny_64": (16, 32), "efficientnet_b0_64": (16, 32),
                "regnet_y_400mf_64": (16, 32), "swin_t_64": (8, 16), "vit_small_64": (16, 32),
                "densenet121_64": (8, 16), "shufflenet_v2_64": (16, 32), "unet_96": (4, 8),
                "gpt2_lm_small": (4, 8), "llama_lm_small": (4, 8)}


def wide_cases() -> list[Case]:
    return [Case(name, b, package=name) for name, batches in WIDE_BATCHES.items()
            for b in batches]


def full_cases() -> list[Case]:
    cases = []
    for opt in ("sgd", "adamw"):
        for impl in ("loop", "foreach", "fused"):
            for b in (16, 64):
                cases.append(Case("resnet18", b, opt, impl, input="3x64x64"))
                cases.append(Case("mobilenet_v3_large", b, opt, impl, input="3x64x64"))
                cases.append(Case("mlp_8x2048", b, opt, impl))
            for b in (4, 16):
                for keep in (True, False):
                    cases.append(Case("decoder_lm_small", b, opt, impl, keep_output=keep))
    cases += [Case("two_dtypes", 8, "adamw", impl) for impl in ("loop", "foreach", "fused")]
    for opt in ("sgd", "adamw"):
        cases.append(Case("resnet18", 16, opt, "loop", precision="amp-bf16", input="3x64x64"))
        cases.append(Case("mlp_8x2048", 16, opt, "loop", precision="amp-bf16"))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", choices=("test", "full", "pt2", "wide"), default="test")
    parser.add_argument("--autobatch", default=os.path.join(HERE, "..", "..", "build", "bin",
                                                            "autobatch"))
    parser.add_argument("--models", default=os.path.join(HERE, "..", "..", "models"))
    parser.add_argument("--workdir", default="/tmp/autobatch-fidelity")
    parser.add_argument("--md", help="write the table as markdown to this file")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when a row is off by more than {TOLERANCE_PCT}%% or autobatch "
                             f"is below eager by more than {UNDER_PCT}%%")
    parser.add_argument("--only", nargs="+", metavar="MODEL",
                        help="only the set's cases of these models (in the order given)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cases = {"test": test_cases, "full": full_cases, "pt2": pt2_cases,
             "wide": wide_cases}[args.set]()
    if args.only:
        known = {c.model for c in cases}
        unknown = [m for m in args.only if m not in known]
        if unknown:
            parser.error(f"--only: {', '.join(unknown)} not in --set {args.set} "
                         f"(its models: {', '.join(sorted(known))})")
        cases = [c for m in args.only for c in cases if c.model == m]
    if args.set in ("pt2", "wide"):
        return pt2_main(cases, args)
    rows = []
    failed = 0
    t0 = time.time()
    for case in cases:
        t = time.time()
        eager = eager_peak(case)
        ours, doc = autobatch_peak(case, args.autobatch, args.models, args.workdir)
        diff = 100.0 * (ours - eager) / eager
        ok = abs(diff) <= TOLERANCE_PCT and diff >= -UNDER_PCT
        ran = doc.get("model", {}).get("optimizer_impl", "")
        if ran != case.impl:
            ok = False
        failed += 0 if ok else 1
        rows.append((case, eager, ours, diff, ran, ok))
        print(f"{'ok  ' if ok else 'FAIL'} {case.label():<70} eager {eager:>13,} autobatch "
              f"{ours:>13,} {diff:+7.3f}% (ran {ran}) {time.time() - t:.1f} s", flush=True)
    elapsed = time.time() - t0
    print(f"fidelity: {len(rows) - failed} passed, {failed} failed ({elapsed:.0f} s)")
    if args.md:
        with open(args.md, "w") as f:
            f.write(md_table(rows, elapsed, args))
    return 1 if args.check and failed else 0


def pt2_main(cases: list[Case], args) -> int:
    """Eager against the package and the TorchScript archive of the same model and inputs."""
    rows = []
    failed = 0
    t0 = time.time()
    for case in cases:
        t = time.time()
        eager = eager_peak(case)
        try:
            script, _ = autobatch_peak(case, args.autobatch, args.models, args.workdir,
                                       pt2_path(case.package + ".ts"))
            diff_ts = 100.0 * (script - eager) / eager
        except RuntimeError as error:  # the model does not script or trace: said in its row
            script, diff_ts = why(error), None
        try:
            package, doc = autobatch_peak(case, args.autobatch, args.models, args.workdir,
                                          pt2_path(case.package))
        except RuntimeError as error:  # not exported, or refused by the export's memory check
            failed += 1
            rows.append((case, eager, why(error), None, script, diff_ts, False))
            print(f"no   {case.label():<60} eager {eager:>13,} pt2: {why(error)}", flush=True)
            continue
        # The package's column must have run the package (an early version ran the archive).
        ran = doc.get("model", {}).get("format")
        if ran != "pt2":
            raise RuntimeError(f"{case.label()}: the pt2 column ran a '{ran}' model")
        diff = 100.0 * (package - eager) / eager
        ok = abs(diff) <= TOLERANCE_PCT and diff >= -UNDER_PCT
        failed += 0 if ok else 1
        rows.append((case, eager, package, diff, script, diff_ts, ok))
        shown_ts = f"{script:>13,} {diff_ts:+7.3f}%" if diff_ts is not None else script
        print(f"{'ok  ' if ok else 'off '} {case.label():<60} eager {eager:>13,} pt2 {package:>13,} "
              f"{diff:+7.3f}%  torchscript {shown_ts}  {time.time() - t:.1f} s", flush=True)
    elapsed = time.time() - t0
    print(f"fidelity pt2: {len(rows) - failed} within {TOLERANCE_PCT}%, {failed} not ({elapsed:.0f} s)")
    if args.md:
        lines = ["| case | eager peak (bytes) | pt2 package | vs eager | TorchScript | vs eager |",
                 "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for case, eager, package, diff, script, diff_ts, _ok in rows:
            pt2_cells = f"{package:,} | {diff:+.3f}%" if diff is not None else f"{package} | -"
            ts_cells = f"{script:,} | {diff_ts:+.3f}%" if diff_ts is not None else f"{script} | -"
            lines.append(f"| {case.label()} | {eager:,} | {pt2_cells} | {ts_cells} |")
        with open(args.md, "w") as f:
            f.write(f"<!-- written by scripts/bench/fidelity.py --set {args.set} in "
                    f"{elapsed:.0f} s -->\n" + "\n".join(lines) + "\n")
    return 1 if args.check and failed else 0


def why(error: Exception) -> str:
    """The reason a file was not built, for a table cell: the last line of the builder's error
    output that says something (the export's own message), cut at 200 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = next((line for line in reversed(lines) if "Error" in line or "error:" in line),
                lines[-1] if lines else "failed")
    text = text.replace("|", "/")
    return text if len(text) <= 200 else text[:197] + "..."


def md_table(rows, elapsed: float, args) -> str:
    lines = ["| case | eager peak (bytes) | autobatch peak (bytes) | difference | within target |",
             "| --- | ---: | ---: | ---: | --- |"]
    for case, eager, ours, diff, _ran, ok in rows:
        lines.append(f"| {case.label()} | {eager:,} | {ours:,} | {diff:+.3f}% | "
                     f"{'yes' if ok else 'NO'} |")
    return ("<!-- written by scripts/bench/fidelity.py --set {} in {:.0f} s -->\n".format(
        args.set, elapsed) + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
