"""The trials' optimizer: a fresh one per trial from the user's factory, class or instance
(rebuilt from its param groups and its constructor's options), never the user's own object
stepped; the classes whose step a trial cannot run refused by name (docs/python.md)."""

import inspect
import weakref

import torch

from . import _core
from ._errors import UsageError


def _constructor_options(cls, defaults):
    """The options of `defaults` that cls's constructor takes (torch 2.11's AdamW.defaults holds
    "decoupled_weight_decay", which AdamW.__init__ does not take: issue 40 row 1); every option
    when the constructor takes **kwargs."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return dict(defaults)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in params and k != "params"}


def _rebuilder(optimizer, params):
    """A function that builds a fresh optimizer of the instance's class over the model's
    trainable parameters, with its param groups' options as they are (learning rates, weight
    decay, betas, foreach / fused, a scheduler's initial_lr) and the constructor's options from its
    defaults. The instance itself is never touched."""
    cls = type(optimizer)
    index = {id(p): p for p in params}
    groups = []
    for g in optimizer.param_groups:
        options = {k: v for k, v in g.items() if k != "params"}
        mine = [index[id(p)] for p in g["params"] if id(p) in index]
        if mine:
            groups.append({**options, "params": mine})
    if not groups:
        raise UsageError(
            "optimizer: none of its parameters is a trainable parameter of the "
            "model; pass the optimizer built over model.parameters()"
        )
    defaults = _constructor_options(cls, optimizer.defaults)
    return lambda: cls([dict(g) for g in groups], **defaults)


def _stepped(opt):
    """True when the optimizer has stepped: state with a step count above 0, or state without a
    step count (SGD's momentum buffers). Adagrad's fresh state (step 0 and its sums, made by its
    constructor) is not."""
    for per_param in opt.state.values():
        step = per_param.get("step") if isinstance(per_param, dict) else None
        if step is None or float(step) > 0:
            return True
    return False


def _checked_build(build, what):
    """`build` made safe to call once per trial: it must return a torch.optim.Optimizer, and a
    new one each time, with no state (a factory that returns the user's existing optimizer would
    let the trials step it and leave its state uncounted: issue 40 row 4). Called twice here,
    before any trial, so that such a factory is refused before it is ever stepped."""
    last = [None]  # a weak reference to the last optimizer returned (never kept alive by us)

    def checked():
        try:
            opt = build()
        except (UsageError, torch.OutOfMemoryError, MemoryError):
            raise  # out of memory building it inside a trial is the trial's
        except Exception as e:  # a factory that takes no parameters, a bad lr, its own error
            if _core.trial_interrupted():  # the deadline or Ctrl-C refused its allocation
                raise
            # Any type: RuntimeError, KeyError and AttributeError as much as TypeError and
            # ValueError (else they leave find() raw).
            raise UsageError(
                f"optimizer: {what} failed when called with the model's trainable "
                f"parameters: {type(e).__name__}: {e}; expected a factory such as "
                "lambda params: torch.optim.AdamW(params, lr=1e-3)"
            ) from e
        if not isinstance(opt, torch.optim.Optimizer):
            raise UsageError(
                f"optimizer: the factory returned {type(opt).__name__}; expected "
                "a torch.optim.Optimizer, e.g. lambda p: torch.optim.AdamW(p)"
            )
        # What the factory builds is refused as an instance of its class is (else LBFGS from a
        # factory, or Lightning's configure_optimizers, fails in its step with TypeError as the
        # model's error).
        _refuse_step_kind(type(opt), [p for g in opt.param_groups for p in g["params"]])
        previous = last[0]() if last[0] is not None else None
        if _stepped(opt) or previous is opt:
            raise UsageError(
                f"optimizer: {what} returned an optimizer that already exists (it has state, or "
                "it was returned before): the trials would step your optimizer and its state "
                "would not be counted; return a new one from the parameters it is given, e.g. "
                "lambda p: torch.optim.AdamW(p, lr=1e-3), or pass the optimizer itself "
                "(optimizer=opt: a fresh copy of its class and options is built per trial)"
            )
        last[0] = weakref.ref(opt)
        return opt

    first = checked()
    checked()
    del first
    return checked


def _optimizer_factory(optimizer, params):
    """A function that builds a fresh optimizer over `params` for each trial: the user's factory,
    or one rebuilt from an optimizer instance (its class, param groups' options and constructor
    options; foreach/fused as set), or AdamW with PyTorch's defaults for None; "none": no
    optimizer step. Classes that cannot run the trial's step are refused by name: LBFGS (its
    step needs a closure that re-runs forward), Muon over parameters that are not 2-D; SparseAdam
    over dense gradients fails in its own step with its own message (ModelError)."""
    if isinstance(optimizer, str) and optimizer == "none":
        return lambda: None, "none"
    if optimizer is None:
        return (lambda: torch.optim.AdamW(params)), "torch.optim.AdamW (default)"
    if isinstance(optimizer, torch.optim.Optimizer):
        cls = type(optimizer)
        index = {id(p) for p in params}
        _refuse_step_kind(
            cls, [p for g in optimizer.param_groups for p in g["params"] if id(p) in index]
        )
        return (
            _checked_build(_rebuilder(optimizer, params), "the rebuild"),
            f"{cls.__module__}.{cls.__qualname__}",
        )
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        _refuse_step_kind(optimizer, params)
        return (
            _checked_build(lambda: optimizer(params), "the class"),
            f"{optimizer.__module__}.{optimizer.__qualname__}",
        )
    if callable(optimizer):
        name = getattr(optimizer, "__qualname__", type(optimizer).__name__)
        checked = _checked_build(lambda: optimizer(params), f"the factory {name}")
        # A factory that hands the optimizer to someone else (a drop-in sets it on Lightning's
        # strategy for the step) says how to take it back after each trial.
        release = getattr(optimizer, "release_trial", None)
        if release is not None:
            checked.release_trial = release
        return checked, name
    raise UsageError(
        f"optimizer: expected a torch.optim.Optimizer, a factory such as "
        f"lambda params: torch.optim.AdamW(params), 'none' or None, but got "
        f"{type(optimizer).__name__}"
    )


def _refuse_step_kind(cls, params):
    """UsageError for the torch.optim classes whose step the trial cannot run as the user's loop
    does (named with the reason)."""
    name = cls.__name__
    if issubclass(cls, torch.optim.LBFGS):
        raise UsageError(
            "optimizer: LBFGS steps with a closure that re-runs forward and backward "
            "several times per step (and keeps a history of past gradients), which "
            "a trial's step (one forward, backward and step per micro-batch) does "
            "not model, so its answer would not hold: autobatch does not size LBFGS "
            "jobs"
        )
    muon = getattr(torch.optim, "Muon", None)
    if muon is not None and issubclass(cls, muon) and any(p.dim() != 2 for p in params):
        raise UsageError(
            f"optimizer: {name} takes 2-D parameters only, but "
            f"{sum(p.dim() != 2 for p in params)} of the parameters it would get are "
            "not 2-D (biases, norms); build it over the 2-D weights only (the "
            "others then need an optimizer of their own, which one trial cannot "
            "hold: size with the optimizer of the larger state)"
        )


def _impl(opt, device):
    """The optimizer implementation that runs: "fused", "foreach" or "loop" ("" for none)."""
    if opt is None:
        return ""
    d = opt.defaults
    if d.get("fused"):
        return "fused"
    if d.get("foreach") or (d.get("foreach") is None and device.type == "cuda"):
        return "foreach"
    return "loop"
