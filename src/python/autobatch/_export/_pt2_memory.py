"""The pt2 export's memory check (issue 26): the compiled package's peak, as autobatch measures it,
against the user's eager step's, measured by torch.profiler, at the example batch and a larger
one. A package under the eager step by more than MEMORY_UNDER_PCT is never written."""

from __future__ import annotations

import json
from typing import Dict, Optional, Sequence

import torch

from ._step import _WithLoss

# A package whose peak is under the eager step's by more than MEMORY_UNDER_PCT is not written (an
# under-count is an out-of-memory error in the user's job at the batch called safe); over by more
# than MEMORY_OVER_PCT it is written with a warning (a cautious answer). Differences of
# MEMORY_FLOOR_BYTES or less are within both: a tiny model's peak is a few KB, where one
# bookkeeping tensor is a percent, and no GPU job fails on 64 KiB.
MEMORY_UNDER_PCT = 0.5
MEMORY_OVER_PCT = 1.0
MEMORY_FLOOR_BYTES = 64 * 1024


def _batch_of(
    example_inputs: Sequence[torch.Tensor], batch: int, int_high: Optional[Dict[int, int]]
) -> tuple:
    """Random inputs like the examples at another batch: float as randn, integers below the
    bound the metadata gives them (input_spec), as the runner makes them."""
    int_high = int_high or {}
    made = []
    for i, t in enumerate(example_inputs):
        shape = (batch, *t.shape[1:])
        if t.dtype in (torch.int64, torch.int32):
            high = int_high.get(i)
            if high is None:
                high = int(t.max().item()) + 1 if t.numel() else 1
            made.append(torch.randint(0, high, shape, dtype=t.dtype))
        elif t.dtype == torch.bool:
            made.append(torch.randint(0, 2, shape).bool())
        else:
            made.append(torch.randn(shape, dtype=t.dtype))
    return tuple(made)


def _target_maker(model: torch.nn.Module, example_inputs, loss: str):
    """A function batch -> the loss's random targets at that batch (as _example_targets makes
    them at the example batch), from one no-grad forward on the examples."""
    if loss not in ("cross-entropy", "mse"):
        return lambda batch: ()
    with torch.no_grad():
        out = model(*example_inputs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    tail = tuple(out.shape[1:])
    if loss == "cross-entropy":
        classes = int(out.shape[-1])
        return lambda batch: (torch.randint(0, classes, (batch, *tail[:-1])),)
    return lambda batch: (torch.randn((batch, *tail)),)


def eager_step_peak(
    model: torch.nn.Module,
    loss: str,
    example_inputs: Sequence[torch.Tensor],
    batch: int,
    int_high: Optional[Dict[int, int]] = None,
    steps: int = 2,
) -> int:
    """The peak bytes of the user's job at ``batch``: an eager loop with PyTorch's defaults, as the
    runner replays it (CPU, fp32, AdamW in its per-parameter loop, PyTorch's CPU default;
    ``zero_grad(set_to_none=True)``; the output dropped before backward; ``steps`` steps, so the
    optimizer state is there in the second). Measured as scripts/bench/fidelity.py measures the
    eager column: torch.profiler's CPU allocation events ("[memory]", signed byte counts) summed
    in time order, the maximum taken, plus the parameters and buffers alive before.

    Trains ``model`` in place (its weights change): pass a copy. Raises what the step raises."""
    from torch.profiler import ProfilerActivity, profile

    n_inputs = len(example_inputs)
    wrapped = _WithLoss(model, loss, n_inputs).train()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=False
    )
    before = sum(
        t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())
    )
    make_targets = _target_maker(model, example_inputs, loss)  # its forward before the profile
    x = None  # the loop's variables: alive until rebound, as in a user's script
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            x = _batch_of(example_inputs, batch, int_high)
            targets = make_targets(batch)
            (value,) = wrapped(*x, *targets)
            value.backward()
            del value, targets
            optimizer.step()
    del x
    return before + profiled_peak(prof)


def profiled_peak(prof) -> int:
    """The largest sum of CPU bytes alive at once over a torch.profiler run with
    profile_memory=True: its "[memory]" events (allocations +, frees -) summed in time order.
    Bytes allocated before the profile started are not in it (the caller adds them)."""
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    ]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def find_cli(cli: Optional[str] = None) -> Optional[str]:
    """The autobatch executable the memory check runs: ``cli`` when given, else $AUTOBATCH_CLI,
    else this checkout's build (build/bin/autobatch) when this file is in a checkout, or the
    executable installed beside this Python when it is the installed package, else ``autobatch``
    on PATH;
    None when there is none. Raises ValueError when ``cli`` or $AUTOBATCH_CLI names no
    executable file (a wrong path is a mistake, not a reason to skip the check)."""
    import os
    import shutil

    for given, what in (
        (cli, "the autobatch executable given"),
        (os.environ.get("AUTOBATCH_CLI"), "$AUTOBATCH_CLI"),
    ):
        if given:
            if not (os.path.isfile(given) and os.access(given, os.X_OK)):
                raise ValueError(
                    f"{what} ({given}) is not an executable file; build it with "
                    f"scripts/build.sh or give the path of bin/autobatch"
                )
            return given
    import sys

    # In a checkout (this file is src/python/autobatch/_export/_pt2_memory.py there, loaded by the
    # shim in scripts/): the checkout's own build, never an executable installed elsewhere. In the
    # installed package: the executable installed with it, beside this Python. Then PATH.
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
    if os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        build_dir = os.environ.get("AUTOBATCH_BUILD_DIR", os.path.join(root, "build"))
        built = os.path.join(build_dir, "bin", "autobatch")
    else:
        built = os.path.join(os.path.dirname(sys.executable), "autobatch")
    if os.path.isfile(built) and os.access(built, os.X_OK):
        return built
    return shutil.which("autobatch")


def package_step_peak(cli: str, package: str, batch: int, limit_bytes: int) -> int:
    """The package's peak at ``batch`` as autobatch measures it: ``--check-batch`` with the
    defaults eager_step_peak replays (AdamW loop, zero_grad none, output dropped, margin 0),
    trials[0].peak_allocated_bytes of its JSON report. Raises ValueError when the run fails
    (with its exit code and the end of its error output)."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="autobatch-export-check-") as folder:
        report = os.path.join(folder, "check.json")
        command = [
            cli,
            "--model",
            package,
            "--device",
            "cpu",
            "--check-batch",
            str(batch),
            "--margin",
            "0",
            "--memory-limit",
            f"{limit_bytes}B",
            "--optimizer",
            "adamw",
            "--optimizer-impl",
            "loop",
            "--zero-grad",
            "none",
            "--keep-output",
            "no",
            "--json",
            report,
            "-q",
        ]
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        if run.returncode != 0 or not os.path.exists(report):
            tail = "\n".join(run.stderr.strip().splitlines()[-5:])
            raise ValueError(
                f"the memory check could not run the package at batch {batch} "
                f"({' '.join(command)}: exit {run.returncode}): {tail}"
            )
        with open(report) as f:
            return int(json.load(f)["trials"][0]["peak_allocated_bytes"])


def memory_check(
    model: torch.nn.Module,
    package: str,
    loss: str,
    example_inputs: Sequence[torch.Tensor],
    int_high: Optional[Dict[int, int]],
    batches: Sequence[int],
    cli: Optional[str],
) -> dict:
    """Measures the eager step (eager_step_peak, on a copy of ``model``) and the finished package
    (package_step_peak) at each of ``batches``; returns the document stored as PT2_MEMORY_CHECK.
    Status "passed" (every batch within the bounds above), "over" (some batch over by more than
    MEMORY_OVER_PCT: written, with a warning), "not-run" (no autobatch executable: ``reason`` says
    so and a run on the package warns). Raises ValueError naming both peaks when the package is
    under the eager step's by more than MEMORY_UNDER_PCT at any batch."""
    import copy

    found = find_cli(cli)
    if found is None:
        return {
            "status": "not-run",
            "rows": [],
            "reason": "no autobatch executable was found to run the package (give "
            "--autobatch PATH or set AUTOBATCH_CLI)",
        }
    rows, status = [], "passed"
    for batch in batches:
        torch.manual_seed(0)
        eager = eager_step_peak(copy.deepcopy(model), loss, example_inputs, batch, int_high)
        package_peak = package_step_peak(found, package, batch, max(4 << 30, 4 * eager))
        difference = package_peak - eager
        pct = 100.0 * difference / eager
        rows.append({"batch": batch, "eager_peak_bytes": eager, "package_peak_bytes": package_peak})
        if abs(difference) <= MEMORY_FLOOR_BYTES:
            continue
        if pct < -MEMORY_UNDER_PCT:
            raise ValueError(
                f"the compiled package's peak at batch {batch} is {package_peak:,} bytes, "
                f"{-pct:.2f}% under the eager step's {eager:,} (more than the "
                f"{MEMORY_UNDER_PCT}% allowed): sized with it, your job would run out of memory "
                f"at the batch called safe. No package was written; export the model in the "
                f"TorchScript format (--format torchscript), and please report the model"
            )
        if pct > MEMORY_OVER_PCT:
            status = "over"
    return {"status": status, "rows": rows, "reason": None}
