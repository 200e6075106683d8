"""Benchmark: autobatch against PyTorch Lightning and HF accelerate on the same model and budget.

For every case (model x input x precision x budget) and finder, one child process; then the
ground truth B* of each harness in fresh processes (B* trains 3 steps, B*+1 does not). Every row is
appended to --jsonl as it finishes and the Markdown report (--md) is rewritten, so a run cut short
still leaves its figures. See docs/benchmarks.md for what is measured and why.

  CPU (--device cpu): each finder's whole process is capped with setrlimit(RLIMIT_DATA) (set in the
  child before exec, so interpreter, imports and LibTorch count against it); a failed allocation
  is a real allocator error in all of them. autobatch runs there with --memory-limit 1TiB so its
  budget allocator never refuses and the real allocator decides. Then autobatch's budget-allocator
  mode, separately, with --memory-limit set to the case's budget and no RLIMIT_DATA.
  GPU (--device cuda): the same byte cap for all (--memory-limit for autobatch,
  torch.cuda.set_per_process_memory_fraction for the peers); the ground truth and the eager-loop
  check for autobatch's answers only.

  The Python package (issue 29) is the peer ``autobatch-python`` (peers.py): autobatch.find on the
  eager model with memory_limit="1TiB", ground truth by autobatch.check_batch in fresh processes
  (harness autobatch-python). A case with ``export`` (the tiny Llama) has no archive in --models:
  its archive is written into --workdir by autobatch.export at the start of the case, and the CLI
  rows run on it with the inputs its metadata describes. --section python writes the tables
  between the ``bench:python`` markers of --md, so the CLI's tables stay as they are.

Usage: scripts/bench/run.sh (CPU table into docs/benchmarks.md), or run.py --help.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MIB = 1 << 20

# name, model, sample shape, int range (0: float input), autobatch --input, precision,
# RLIMIT_DATA cap of the whole process (CPU) or byte cap (GPU), budget-allocator limit (CPU).
CASES = {
    "cpu": [
        dict(name="resnet18-64px", model="resnet18", shape="3x64x64", int_high=0,
             input="3x64x64", precision="fp32", cap=1536 * MIB, budget=640 * MIB),
        dict(name="decoder-lm-small", model="decoder_lm_small", shape="128", int_high=8000,
             input="int64:128:<8000", precision="fp32", cap=1280 * MIB, budget=512 * MIB),
        # transformers LlamaForCausalLM from a config (peers.py tiny_llama); the CLI runs the
        # archive autobatch.export writes from {"input_ids": ids, "labels": ids} (it computes the
        # model's own loss on its labels; the eager finders the cross-entropy of peers.py).
        dict(name="tiny-llama", model="tiny_llama", shape="128", int_high=8000, input="",
             precision="fp32", cap=1408 * MIB, budget=512 * MIB, export=True),
    ],
    "gpu": [
        dict(name="resnet50-bf16", model="resnet50", shape="3x224x224", int_high=0,
             input="3x224x224", precision="amp-bf16", cap=20 << 30, budget=0),
        dict(name="decoder-lm-bf16", model="decoder_lm", shape="256", int_high=32000,
             input="int64:256:<32000", precision="amp-bf16", cap=20 << 30, budget=0),
    ],
}


def failure(res: dict, reported: str | None) -> str:
    """What a failed process row shows: a timeout, else its own error, else its stderr's end."""
    if res["timed_out"]:
        return f"timed out after {res['wall_s']} s (killed)"
    return reported or res["stderr"][-300:] or f"exit {res['rc']}"


def log(*parts) -> None:
    print("[bench]", *parts, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, args):
        self.args = args
        self.rows: list[dict] = []
        self.truth_cache: dict[tuple, bool] = {}
        self.exported: set[str] = set()
        os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
        open(args.jsonl, "w").close()

    # ---- processes -------------------------------------------------------------------------------
    def spawn(self, argv: list[str], cap: int, timeout: float, cwd: str | None = None) -> dict:
        """Runs argv, on the CPU under RLIMIT_DATA = cap: wall time, its own peak RSS, exit, output."""

        left = self.args.deadline - time.time()
        if left < 15:
            log(f"  skipped (deadline): {shlex.join(argv)[:120]}")
            return {"rc": None, "wall_s": 0.0, "stdout": "", "stderr": "skipped: deadline",
                    "timed_out": False, "max_rss_bytes": 0}
        timeout = min(timeout, left)

        def limit():
            if cap:
                resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            t0 = time.time()
            proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, cwd=cwd,
                                    preexec_fn=limit if cap else None)
            fired = threading.Event()
            timer = threading.Timer(timeout, lambda: (fired.set(), proc.kill()))
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
            timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.time() - t0
            out.seek(0)
            err.seek(0)
            return {"rc": proc.returncode, "wall_s": round(wall, 2), "stdout": out.read(),
                    "stderr": err.read(), "timed_out": fired.is_set(),
                    "max_rss_bytes": usage.ru_maxrss * 1024}

    def archive(self, case: dict) -> str:
        """The model's TorchScript archive: --models/<model>.pt, or for a case with ``export``
        the one exported into --workdir (once per run, by peers.py --finder export, no cap)."""
        if not case.get("export"):
            return os.path.join(self.args.models, case["model"] + ".pt")
        path = os.path.abspath(os.path.join(self.args.workdir, case["model"] + ".pt"))
        if path not in self.exported:
            r = self.peer(case, "export", ["--out", path], 0, self.args.check_timeout)
            if r["rc"] != 0:
                raise RuntimeError(f"export of {case['model']} failed: {failure(r, None)}")
            self.exported.add(path)
            log(f"  exported {path} ({r['wall_s']} s)")
        return path

    def autobatch(self, case: dict, extra: list[str], cap: int, timeout: float, tag: str) -> dict:
        path = os.path.join(self.args.workdir, f"{case['name']}-{tag}.json")
        inputs = ["--input", case["input"]] if case["input"] else []  # else the archive's own
        argv = [self.args.autobatch, "--model", self.archive(case),
                *inputs, "--optimizer", "adamw", "--precision", case["precision"],
                "--device", self.args.device, "--margin", "0", "--json", path, "-q",
                # The peers' loops (Lightning's training_step, accelerate's, peers.py's eager
                # check) drop the model's output before backward; --optimizer-impl auto is
                # PyTorch's default, as theirs.
                "--keep-output", "no", *extra]
        res = self.spawn(argv, cap, timeout)
        try:
            with open(path) as f:
                res["report"] = json.load(f)
        except (OSError, ValueError):
            res["report"] = None
        res["argv"] = argv
        return res

    def peer(self, case: dict, finder: str, extra: list[str], cap: int, timeout: float) -> dict:
        argv = [sys.executable, os.path.join(HERE, "peers.py"), "--finder", finder,
                "--model", case["model"], "--shape", case["shape"],
                "--int-high", str(case["int_high"]), "--precision", case["precision"],
                "--device", self.args.device, *extra]
        if self.args.device != "cpu":
            argv += ["--memory-limit-bytes", str(case["cap"])]
        # In --workdir, so whatever a peer leaves behind when it is killed (Lightning's
        # .scale_batch_size_*.ckpt, logs) never lands in the caller's folder (the repo root).
        res = self.spawn(argv, cap, timeout, cwd=os.path.abspath(self.args.workdir))
        res["result"] = None
        for line in res["stdout"].splitlines():
            if line.startswith("RESULT "):
                res["result"] = json.loads(line[7:])
        res["argv"] = argv
        return res

    # ---- ground truth ----------------------------------------------------------------------------
    class Skipped(Exception):
        """A check the deadline skipped: neither fits nor does not fit."""

    def fits(self, case: dict, harness: str, batch: int, mkldnn: str) -> bool:
        key = (case["name"], harness, batch, mkldnn)
        if key in self.truth_cache:
            return self.truth_cache[key]
        t = self.args.check_timeout
        if harness == "autobatch":
            r = self.autobatch(case, ["--check-batch", str(batch), "--steps-per-trial", "3",
                                      "--memory-limit", self.check_limit(case)], self.cap(case), t,
                               f"check-{batch}")
            ok = r["rc"] == 0
        elif harness == "autobatch-budget":
            r = self.autobatch(case, ["--check-batch", str(batch), "--steps-per-trial", "3",
                                      "--memory-limit", f"{case['budget']}B"], 0, t,
                               f"budget-check-{batch}")
            ok = r["rc"] == 0
        else:
            r = self.peer(case, f"check-{harness}", ["--batch", str(batch), "--mkldnn", mkldnn],
                          self.cap(case), t)
            ok = r["rc"] == 0 and bool(r["result"] and r["result"].get("fits"))
        if r["rc"] is None:  # skipped at the deadline: B* stays unknown, never a wrong value
            raise Runner.Skipped(f"B={batch} not checked (deadline)")
        log(f"  truth {harness} B={batch}: {'fits' if ok else 'does not fit'} ({r['wall_s']} s)")
        self.truth_cache[key] = ok
        return ok

    def ground_truth(self, case: dict, harness: str, start: int, mkldnn: str = "on") -> int | None:
        """B* near `start`: the largest B that fits in a fresh process with B+1 not fitting."""
        start = max(1, start)
        if self.fits(case, harness, start, mkldnn):
            lo, hi, step = start, None, 1
            while hi is None:
                probe = lo + step
                if self.fits(case, harness, probe, mkldnn):
                    lo, step = probe, step * 4
                else:
                    hi = probe
        else:
            hi, lo, step = start, None, 1
            while lo is None:
                probe = hi - step
                if probe < 1:
                    return None
                if self.fits(case, harness, probe, mkldnn):
                    lo = probe
                else:
                    hi, step = probe, step * 4
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(case, harness, mid, mkldnn):
                lo = mid
            else:
                hi = mid
        return lo

    # ---- helpers ---------------------------------------------------------------------------------
    def cap(self, case: dict) -> int:
        return case["cap"] if self.args.device == "cpu" else 0

    def check_limit(self, case: dict) -> str:
        """Ground truth in autobatch's harness: the real allocator decides (CPU), or the cap (GPU)."""
        return "1TiB" if self.args.device == "cpu" else f"{case['cap']}B"

    def add(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.args.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        render(self.rows, self.args)
        log(f"{row['case']} {row['finder']}: found {row.get('found')} raw {row.get('raw_max')} "
            f"B* {row.get('b_star')} trials {row.get('trials')} {row.get('wall_s')} s "
            f"{row.get('error') or ''}")

    # ---- the finders -----------------------------------------------------------------------------
    def autobatch_row(self, case: dict, label: str, extra: list[str], cap: int, truth: str) -> dict:
        r = self.autobatch(case, extra, cap, self.args.timeout, label)
        rep = r["report"] or {}
        res = rep.get("result") or {}
        trials = rep.get("trials") or []
        row = dict(case=case["name"], finder=label, harness=truth, wall_s=r["wall_s"],
                   found=res.get("max_micro_batch"), raw_max=res.get("max_micro_batch"),
                   trials=res.get("trial_count"),
                   steps=sum(t.get("steps_completed", 0) + (t.get("outcome") != "fits")
                             for t in trials) or None,
                   max_rss_bytes=r["max_rss_bytes"],
                   exit=r["rc"], error=None if r["rc"] == 0 else failure(r, rep.get("error")),
                   # at the batch found (the eager check compares with it); reserved: the search
                   peak_bytes=next((t.get("peak_allocated_bytes") for t in trials
                                    if t.get("micro_batch_size") == res.get("max_micro_batch")
                                    and t.get("outcome") == "fits"), None),
                   peak_reserved_bytes=max((t.get("peak_reserved_bytes", 0) for t in trials),
                                           default=None),
                   command=shlex.join(r["argv"]))
        row["fit"], row["model"] = rep.get("fit"), rep.get("model")
        return row

    def peer_row(self, case: dict, finder: str, mkldnn: str) -> dict:
        extra = ["--mkldnn", mkldnn, "--start", str(self.args.accelerate_start)]
        r = self.peer(case, finder, extra, self.cap(case), self.args.timeout)
        res = r["result"] or {}
        label = finder if mkldnn == "on" else f"{finder} (oneDNN off)"
        harness = finder if finder == "autobatch-python" else finder.split("-")[0]
        return dict(case=case["name"], finder=label, harness=harness, mkldnn=mkldnn,
                    wall_s=r["wall_s"], found=res.get("found"), raw_max=res.get("raw_max"),
                    trials=res.get("trials"), steps=res.get("steps"),
                    trial_sizes=res.get("trial_sizes"), exit=r["rc"],
                    max_rss_bytes=r["max_rss_bytes"],
                    peak_reserved_bytes=res.get("peak_reserved_bytes"),
                    error=res.get("error") or (None if r["rc"] == 0 else failure(r, None)),
                    command=shlex.join(r["argv"]))

    def run_case(self, case: dict) -> None:
        a = self.args
        log(f"case {case['name']}: {case['model']} {case['input']} {case['precision']} "
            f"cap {case['cap'] // MIB} MiB")
        cap = self.cap(case)
        # CPU: autobatch's own limit is RLIMIT_DATA less what the process holds at start (its
        # default); the "real allocator" row lifts the budget so the real allocator decides.
        # GPU: the cap is --memory-limit.
        limit = [] if a.device == "cpu" else ["--memory-limit", f"{case['cap']}B"]
        mine = []
        for label, extra in (("autobatch guided", limit),
                             ("autobatch guided, 3 steps", limit + ["--steps-per-trial", "3"]),
                             ("autobatch guided, real allocator", ["--memory-limit", "1TiB"]),
                             # the CLI with the options of the autobatch-python peer (3 steps)
                             ("autobatch guided, real allocator, 3 steps",
                              ["--memory-limit", "1TiB", "--steps-per-trial", "3"]),
                             ("autobatch binsearch", limit + ["--strategy", "binsearch"])):
            if label not in a.finders_autobatch or (a.device != "cpu" and "real" in label):
                continue
            row = self.autobatch_row(case, label, extra, cap, "autobatch")
            mine.append(row)
            self.add(row)
        peers = []
        for finder in a.peers:
            row = self.peer_row(case, finder, "on")
            peers.append(row)
            self.add(row)
            if a.device == "cpu" and row["error"] and "primitive" in row["error"]:
                row2 = self.peer_row(case, finder, "off")
                peers.append(row2)
                self.add(row2)
        # Ground truth per harness, from each finder's own answer.
        for row in mine + peers:
            start = row["raw_max"] or row["found"]
            if not start or row["harness"] not in ("autobatch", "autobatch-python", "lightning",
                                                   "accelerate"):
                continue
            if a.device != "cpu" and not row["harness"].startswith("autobatch"):
                continue
            try:
                row["b_star"] = self.ground_truth(case, row["harness"], start,
                                                  row.get("mkldnn", "on"))
            except Runner.Skipped as e:
                row["b_star"], row["error"] = None, (row.get("error") or "") + f"B* unknown: {e}"
            row["offset"] = None if row["b_star"] is None else start - row["b_star"]
            self.rewrite()
        if a.device != "cpu":
            for row in mine:
                if row["found"]:
                    e = self.peer(case, "eager", ["--batch", str(row["found"])], 0,
                                  a.check_timeout)
                    row["eager"] = e["result"]
                    self.rewrite()
                    break
        if a.device == "cpu" and case["budget"] and "budget" in a.modes:
            for label, extra in (("autobatch guided (budget)", []),
                                 ("autobatch binsearch (budget)", ["--strategy", "binsearch"])):
                row = self.autobatch_row(case, label, ["--memory-limit", f"{case['budget']}B"] + extra,
                                         0, "autobatch-budget")
                if row["found"]:
                    try:
                        row["b_star"] = self.ground_truth(case, "autobatch-budget", row["found"])
                        row["offset"] = row["found"] - row["b_star"]
                    except Runner.Skipped as e:
                        row["error"] = f"B* unknown: {e}"
                self.add(row)
        if "count" in a.modes:
            c = self.peer(case, "count", [], 0, a.check_timeout)
            self.add(dict(case=case["name"], finder="exact counts (PyTorch)", harness="count",
                          counts=c["result"], wall_s=c["wall_s"]))

    def rewrite(self) -> None:
        with open(self.args.jsonl, "w") as f:
            for row in self.rows:
                f.write(json.dumps(row) + "\n")
        render(self.rows, self.args)


# ---- report ----------------------------------------------------------------------------------------
def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def mib(v):
    return "-" if not v else f"{v / MIB:.0f}"


def render(rows: list[dict], args) -> None:
    if not args.md:
        return
    out = [f"<!-- generated by scripts/bench/run.py; do not edit by hand -->",
           f"Machine: {machine()}; device {args.device}. Command: `{args.command_line}`"
           + {"cpu": " (from `bash scripts/bench/run.sh`).",
              "python": " (from `bash scripts/bench/python_bench.sh`)."}.get(args.section, "."), ""]
    cpu = args.device == "cpu"
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        out += [f"### {case}", "",
                "| finder | returns | raw max | B* (own harness) | offset | trials | steps | "
                f"wall s | {'peak RSS' if cpu else 'peak reserved'} MiB | exit / error |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            if r["harness"] == "count":
                continue
            err = fmt(r.get("exit"))
            if r.get("error"):
                err += ": " + r["error"].replace("|", "/").replace("\n", " ")[:120]
            out.append(f"| {r['finder']} | {fmt(r.get('found'))} | {fmt(r.get('raw_max'))} | "
                       f"{fmt(r.get('b_star'))} | {fmt(r.get('offset'))} | {fmt(r.get('trials'))} |"
                       f" {fmt(r.get('steps'))} | {fmt(r.get('wall_s'))} | {mib(r.get('max_rss_bytes') if cpu else r.get('peak_reserved_bytes'))} | {err} |")
        out.append("")
        ratio_lines = []
        for label in ("autobatch guided", "autobatch guided (budget)", "autobatch-python"):
            ours = next((r for r in rs if r["finder"] == label), None)
            for r in rs:
                if not (ours and r["harness"] in ("lightning", "accelerate") and r.get("trials")
                        and ours.get("trials")):
                    continue
                ratio_lines.append(
                    f"- {label} / {r['finder']}: trials {ours['trials']}/{r['trials']} = "
                    f"{ours['trials'] / r['trials']:.2f}, wall time {ours['wall_s']}/{r['wall_s']} s"
                    f" = {ours['wall_s'] / r['wall_s']:.2f}")
        eager = next((r for r in rs if r["finder"] == "autobatch-python"), None)
        for r in rs:
            if eager and r["finder"].startswith("autobatch guided, real allocator"):
                ratio_lines.append(
                    f"- eager probe (autobatch-python) against the CLI on the archive "
                    f"({r['finder']}): found {fmt(eager.get('found'))} (B* {fmt(eager.get('b_star'))}) against "
                    f"{fmt(r.get('found'))} (B* {fmt(r.get('b_star'))}); trials "
                    f"{fmt(eager.get('trials'))} against {fmt(r.get('trials'))}, wall time "
                    f"{fmt(eager.get('wall_s'))} against {fmt(r.get('wall_s'))} s")
        out += ratio_lines + ([""] if ratio_lines else [])
        budget = next((r for r in rs if r["finder"] == "autobatch guided (budget)"), None)
        count = next((r for r in rs if r["harness"] == "count"), None)
        if budget and budget.get("fit"):
            fit = budget["fit"]
            err = (fit["predicted_peak_bytes"] - fit["measured_peak_bytes"]) / \
                fit["measured_peak_bytes"] * 100
            out.append(f"- memory model (budget mode, at B={budget['found']}): predicted "
                       f"{fit['predicted_peak_bytes'] / MIB:.2f} MiB, measured "
                       f"{fit['measured_peak_bytes'] / MIB:.2f} MiB ({err:+.2f}%); fit "
                       f"{fit['fixed_bytes'] / MIB:.2f} MiB + {fit['per_sample_bytes'] / MIB:.3f} "
                       f"MiB per sample, {fit['points']} points")
        if budget and budget.get("model") and count and count.get("counts"):
            m, c = budget["model"], count["counts"]
            for key in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
                out.append(f"- {key.replace('_', ' ')}: autobatch {m[key]}, exact (PyTorch) "
                           f"{c[key]} ({m[key] - c[key]:+d})")
        for r in rs:
            if r.get("eager"):
                e = r["eager"]
                peak = (r.get("peak_bytes") or 0)
                line = (f"- eager PyTorch loop at B={r['found']} under the same cap: "
                        f"{'fits' if e.get('fits') else 'does not fit: ' + str(e.get('error'))}")
                if e.get("peak_allocated_bytes") and peak:
                    line += (f"; peak allocated eager {e['peak_allocated_bytes'] / MIB:.0f} MiB vs "
                             f"autobatch {peak / MIB:.0f} MiB "
                             f"({(peak - e['peak_allocated_bytes']) / e['peak_allocated_bytes'] * 100:+.1f}%)")
                out.append(line)
        out.append("")
    text = "\n".join(out)
    # Only the section between this device kind's markers is replaced; the text around it is kept.
    begin, end = f"<!-- bench:{args.section}:begin -->", f"<!-- bench:{args.section}:end -->"
    try:
        with open(args.md) as f:
            old = f.read()
    except OSError:
        old = ""
    if begin in old and end in old:
        text = old[: old.index(begin) + len(begin)] + "\n" + text + "\n" + old[old.index(end):]
    with open(args.md, "w") as f:
        f.write(text)


def machine() -> str:
    cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    try:
        import torch  # noqa: F401 — versions only
        tv = torch.__version__
    except ImportError:
        tv = "?"
    return f"{platform.system()} {platform.machine()}, {cores} cores, {mem:.0f} GiB, torch {tv}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N")
    p.add_argument("--cases", nargs="*", help="case names (default: all of the device's)")
    p.add_argument("--autobatch", default=os.path.join(ROOT, "build", "bin", "autobatch"))
    p.add_argument("--models", default=os.path.join(ROOT, "models"))
    p.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench"))
    p.add_argument("--jsonl", default=os.path.join(ROOT, "build", "bench", "results.jsonl"))
    p.add_argument("--md", default="", help="write the Markdown tables here")
    p.add_argument("--peers", nargs="*",
                   default=["lightning-binsearch", "lightning-power", "accelerate",
                            "autobatch-python"])
    p.add_argument("--finders-autobatch", nargs="*",
                   default=["autobatch guided", "autobatch guided, 3 steps",
                            "autobatch guided, real allocator"])
    p.add_argument("--modes", nargs="*", default=["budget", "count"])
    p.add_argument("--accelerate-start", type=int, default=512)
    p.add_argument("--timeout", type=float, default=900, help="seconds per finder")
    p.add_argument("--check-timeout", type=float, default=300, help="seconds per ground-truth check")
    p.add_argument("--deadline-s", type=float, default=0,
                   help="stop starting processes this many seconds after the start (0: none)")
    p.add_argument("--cap-mib", type=int, default=0, help="override every case's cap (MiB)")
    p.add_argument("--budget-mib", type=int, default=0, help="override every case's budget")
    p.add_argument("--section", default="",
                   help="the markers of --md to write between (default: cpu or gpu by --device; "
                        "python for the Python package's tables)")
    args = p.parse_args()
    args.deadline = time.time() + (args.deadline_s or 1e9)
    args.command_line = shlex.join(["scripts/bench/run.py", *sys.argv[1:]])
    os.makedirs(args.workdir, exist_ok=True)
    kind = "cpu" if args.device == "cpu" else "gpu"
    args.section = args.section or kind
    cases = [c for c in CASES[kind] if not args.cases or c["name"] in args.cases]
    if not cases:
        p.error(f"no case named {args.cases}; valid: {[c['name'] for c in CASES[kind]]}")
    runner = Runner(args)
    t0 = time.time()
    for case in cases:
        case = dict(case)
        if args.cap_mib:
            case["cap"] = args.cap_mib * MIB
        if args.budget_mib:
            case["budget"] = args.budget_mib * MIB
        runner.run_case(case)
    log(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
