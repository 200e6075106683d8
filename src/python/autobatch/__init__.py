"""autobatch: the largest micro-batch a PyTorch model trains with, measured by real training steps.

    import torch, autobatch
    result = autobatch.find(model, example_batch, optimizer=lambda p: torch.optim.AdamW(p),
                            memory_limit="8GiB", target_batch=512)
    print(result.safe_micro_batch, result.plan)

The trial is the user's own eager step (forward, loss, backward, optimizer step) on the real device;
the search, the planner and the report are the C++ library's (autobatch._core), the same as the
`autobatch` command's. docs/python.md describes every option, the result and the errors.
"""

# torch first: a CUDA build's libraries (the CUDA runtime) must be the ones loaded when the budget
# module or anything else binds to them; _core itself links no torch library.
import torch  # noqa: F401  (imported for its side effect: LibTorch loaded first)


def _load_core():
    """autobatch._core, or an ImportError that says what is missing. _core includes no torch
    header, so it loads with any torch; what can fail is the platform (a shared library the
    system lacks, a wheel built for another Python or C library)."""
    try:
        from . import _core as core
    except ImportError as e:
        raise ImportError(_load_failure(str(e))) from e
    return core


def _load_failure(text):
    """The words for an extension that does not load: a shared library the system lacks is named
    as such (the dynamic loader's "libX.so.N: cannot open shared object file"), not blamed on
    torch; anything else says to reinstall."""
    import re

    missing = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", text)
    if missing:
        return (
            f"autobatch._core needs the shared library {missing.group(1)}, which this system "
            f"does not have ({text}); install the system package that provides it, or "
            "install autobatch from a wheel that carries it (README, Install)"
        )
    return (
        f"autobatch._core does not load ({text}); reinstall autobatch for this Python: "
        "pip install --force-reinstall --no-deps <the wheel or the source folder>"
    )


_core = _load_core()
from ._check_eval import check_eval_batch
from ._distributed import (
    JobResult,
    RankResult,
    ShardedResult,
    ShardedTable,
    find_ddp,
    find_sharded,
)
from ._errors import AutobatchError, Cancelled, DoesNotFit, ModelError, UsageError
from ._export import export, export_pt2
from ._find import check_batch, find, fingerprint
from ._plans import plan
from ._result import EvalCheck, Plan, Result, Trial
from ._soak import SoakResult, SoakStep, soak

__version__ = "0.1.0"


__all__ = [
    "find",
    "find_sharded",
    "find_ddp",
    "JobResult",
    "ShardedResult",
    "ShardedTable",
    "RankResult",
    "check_batch",
    "check_eval_batch",
    "soak",
    "SoakResult",
    "SoakStep",
    "EvalCheck",
    "fingerprint",
    "export",
    "export_pt2",
    "plan",
    "Result",
    "Plan",
    "Trial",
    "AutobatchError",
    "DoesNotFit",
    "UsageError",
    "ModelError",
    "Cancelled",
]
