"""Checks of find()'s options that need more than their own value (the optimizer it builds, the
call they are given to), and the result's line on memory held outside the model."""

import torch

from . import _core
from ._errors import UsageError


def _check_one_step(make_optimizer, zero_grad):
    """UsageError for steps_per_trial=1 where the second step holds more than the first, as the
    command refuses --steps-per-trial 1 (src/probes/runner_checks.cpp, checkStepsPerTrial): an
    optimizer with state creates it at the first step() (AdamW's two parameter-sized sets), and
    zero_grad="zeros" keeps the gradients alive through the next forward. One step is evidence
    only with no optimizer or SGD without momentum, and gradients set to None: an MLP at 40 MiB
    answered 2098 with AdamW and one step, where its loop fails at 2098 on the second step and
    two steps find 1491. Any other class counts as keeping state: its state cannot be known
    before its first step."""
    optimizer = make_optimizer()
    stateless = optimizer is None or (
        type(optimizer) is torch.optim.SGD
        and all(not g.get("momentum") for g in optimizer.param_groups)
    )
    name = "none" if optimizer is None else type(optimizer).__name__
    del optimizer
    if stateless and zero_grad == "none":
        return
    why = []
    if not stateless:
        why.append(
            f"the optimizer {name} creates its state at the first step(), so only the "
            "second step runs with it"
        )
    if zero_grad == "zeros":
        why.append("zero_grad='zeros' keeps the gradients alive from the second step's forward on")
    raise UsageError(
        f"steps_per_trial: expected at least 2 with optimizer {name} and zero_grad="
        f"{zero_grad!r}, but got 1; {', and '.join(why)}: a batch that fits one step "
        "may fail the next; use steps_per_trial=2 (the default)"
        + (
            ""
            if zero_grad == "zeros"
            else ", or an optimizer without state (torch.optim.SGD without momentum, or 'none')"
        )
    )


# find()'s options that bound or plan a search, with their defaults: one trial at a given size
# has no use for them, and one taken silently would look applied (a time_limit never stops a
# check_batch trial: nothing sets a deadline for it).
_SEARCH_ONLY = {
    "target_batch": None,
    "world_size": 1,
    "time_limit": None,
    "min_batch": 1,
    "max_batch": None,
    "dataset_size": None,
    "max_trials": None,
    "strategy": "guided",
    "plan": "fastest",
}


def _refuse_search_options(options, who):
    """UsageError for a search-only option given to one trial's call."""
    given = sorted(
        k
        for k, default in _SEARCH_ONLY.items()
        if k in options
        and options[k] is not None
        and not (type(options[k]) is type(default) and options[k] == default)
    )
    if given:
        why = " (one trial runs to its end; Ctrl-C stops it)" if "time_limit" in given else ""
        verbs = (
            "bounds or plans a search and has"
            if len(given) == 1
            else "bound or plan a search and have"
        )
        raise UsageError(
            f"{who}: {', '.join(given)} {verbs} no meaning for one trial at a given "
            f"micro-batch{why}; drop {'it' if len(given) == 1 else 'them'}, or call "
            "autobatch.find to search"
        )


def _outside_note(outside, device):
    """The result's line on the memory the process holds outside the model when the search
    starts (a teacher or reference model a step calls, a dataset in memory, an optimizer's
    state): counted in every trial's baseline, as the user's job holds it beside its steps."""
    total, count, largest = outside
    if not total:
        return []
    return [
        f"held outside the model: {_core.format_bytes(total)} of {device.type} memory in "
        f"{count} tensor storage(s) this process holds (the largest {largest}); counted in "
        "every trial's memory as your job will hold them beside its steps; free what the "
        "job does not need before calling autobatch"
    ]
