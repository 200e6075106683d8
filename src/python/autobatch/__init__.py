"""autobatch: the largest micro-batch a PyTorch model trains with, measured by real training steps.

    import torch, autobatch
    result = autobatch.find(model, example_batch, optimizer=lambda p: torch.optim.AdamW(p),
                            memory_limit="8GiB", target_batch=512)
    print(result.safe_micro_batch, result.plan)

The trial is the user's own eager step (forward, loss, backward, optimizer step) on the real device;
the search, the planner and the report are the C++ library's (autobatch._core), the same as the
`autobatch` command's. docs/python.md describes every option, the result and the errors.
"""
# torch first: its libraries (c10, torch_cpu, and the CUDA runtime of a CUDA build) must be the
# ones the extension binds to. Importing the extension first maps a second libcudart when the
# CUDA toolkit is on its RUNPATH (issue 29, measured).
import torch  # noqa: F401  (imported for its side effect: LibTorch loaded first)


def _load_core():
    """autobatch._core, or an ImportError that says which torch it was built for and how to
    rebuild: its CPU budget allocator is compiled against torch's C++ ABI (issue 41), so a _core
    built for another torch fails with an undefined symbol, or worse, loads."""
    try:
        from . import _built
        built = _built.TORCH_VERSION
    except ImportError:  # a source tree without a build: _core's own error says more
        built = None
    fix = ("rebuild it against this torch: pip install --no-build-isolation --force-reinstall "
           "--no-deps <the autobatch source folder> (docs/python.md, 'After a torch upgrade')")
    if built is not None and built != torch.__version__:
        raise ImportError(f"autobatch._core was built against torch {built}, and this environment "
                          f"has torch {torch.__version__}; {fix}")
    try:
        from . import _core as core
    except ImportError as e:
        raise ImportError(_load_failure(str(e), fix)) from e
    return core


def _load_failure(text, fix):
    """The words for an extension that does not load: a shared library the system lacks is named
    as such (the dynamic loader's "libX.so.N: cannot open shared object file"), not blamed on
    torch; anything else (an undefined symbol: another torch's ABI) says to rebuild."""
    import re
    missing = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", text)
    if missing:
        return (f"autobatch._core needs the shared library {missing.group(1)}, which this system "
                f"does not have ({text}); install the system package that provides it, or "
                "install autobatch from a wheel that carries it")
    return f"autobatch._core does not load with torch {torch.__version__} ({text}); {fix}"


_core = _load_core()
from ._errors import AutobatchError, Cancelled, DoesNotFit, ModelError, UsageError
from ._export import export, export_pt2
from ._check_eval import check_eval_batch
from ._find import check_batch, find, fingerprint
from ._result import EvalCheck, Plan, Result, Trial
from ._sharded import RankResult, ShardedResult, ShardedTable, find_sharded
from ._ddp_job import JobResult, find_ddp

__version__ = "0.1.0"


def plan(max_micro_batch: int, target_batch: int, world_size: int = 1, kind: str = "auto") -> Plan:
    """The accumulation plan for `target_batch` samples per optimizer step over `world_size` ranks
    whose micro-batch may be at most `max_micro_batch` (kind "auto", "uniform" or "balanced"; the
    library's planner, docs/search.md "Headroom, plan"). Raises UsageError for an impossible
    target."""
    import json

    from ._options import _INT32_MAX, _count, _target

    if max_micro_batch is None or target_batch is None:
        raise UsageError("plan: expected max_micro_batch and target_batch as ints >= 1, but got "
                         f"{max_micro_batch!r} and {target_batch!r}")
    max_micro_batch = _count(max_micro_batch, "max_micro_batch")
    target_batch = _target(target_batch)
    # C++ ints (a review of stop 55: 2**31 and kind=None left pybind11's TypeError)
    world_size = _count(world_size, "world_size", none_is=1, maximum=_INT32_MAX)
    if kind not in ("auto", "uniform", "balanced"):
        raise UsageError(f"plan: kind: expected 'auto', 'uniform' or 'balanced', but got {kind!r}")
    try:
        plans = json.loads(_core.plan(max_micro_batch, target_batch, world_size, kind))
    except _core.Error as e:
        raise UsageError(str(e)) from None
    return Plan.from_json(plans[plans["primary"]])


__all__ = ["find", "find_sharded", "find_ddp", "JobResult", "ShardedResult", "ShardedTable", "RankResult", "check_batch", "check_eval_batch", "EvalCheck", "fingerprint", "export", "export_pt2", "plan", "Result", "Plan", "Trial", "AutobatchError",
           "DoesNotFit", "UsageError", "ModelError", "Cancelled"]
