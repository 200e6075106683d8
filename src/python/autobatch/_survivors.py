"""Tensors that outlive the trial that made them: the promise that nothing of the trials stays
alive, checked after each trial, and the holder named when it is broken.

A step whose code keeps its tensors past the step (a forward hook that appends `o.detach()` to a
list, `running_loss += loss`, a metric that stores its inputs) holds more after every step, in
the trials as in the user's job: each trial then runs with the earlier ones' tensors alive, and
the search sees sizes that fit after sizes that did not ("non-monotonic"). After each trial the
bytes held are compared with those after the search's setup (one read of the meter); only when
they grew are the live tensors scanned (gc.get_objects, as the baseline's scan in _state.py) for
storages made since, and the objects that refer to them are named in the result's warnings.
"""

import gc
import itertools
import sys
import types

import torch

from . import _core
from ._state import live_storages


class Survivors:
    """The check for one search. `baseline_ptrs`: the storages alive when the trials began (the
    model's, the example's, the process's); `settled_bytes`: the meter's bytes then."""

    def __init__(self, device, baseline_ptrs, settled_bytes):
        self.device, self.baseline = device, set(baseline_ptrs)
        self.settled = settled_bytes
        self.known = {}  # data pointer -> bytes of the survivors seen so far
        self.holders = []  # descriptions of what holds them, first seen first
        self.trials = 0  # trials after which new survivors were found

    def check(self, now_bytes):
        """After a trial, with its tensors let go: True when tensors made by the trials are alive
        that were not before (then `note()` names them)."""
        if now_bytes <= self.settled:
            return False
        self.settled = now_bytes
        rows = [
            (p, n, t)
            for p, n, t in live_storages(self.device, self.baseline)
            if p not in self.known
        ]
        if not rows:
            return False
        self.trials += 1
        for p, n, _ in rows:
            self.known[p] = n
        tensors = [t for _, _, t in rows]
        del rows  # its tuples would be the first referrers found
        for what in _holders(tensors):
            if what not in self.holders:
                self.holders.append(what)
        return True

    def note(self):
        """The result's warning, or None while nothing survived."""
        if not self.known:
            return None
        held = "; ".join(self.holders[:3]) or "objects Python cannot trace (C++ references)"
        return (
            f"tensors made by the trials stay alive after them: {len(self.known)} tensor "
            f"storage(s), {_core.format_bytes(sum(self.known.values()))}, after "
            f"{self.trials} trial(s), held by {held}. The step keeps them past its end, so "
            "every later trial (and every step of your job) runs with more memory held: "
            "answers after the first are measured with them alive, and the job grows until "
            "it runs out of memory. Keep what the step needs as Python numbers (loss.item()) "
            "or drop it after use (a hook that stores activations: store what you need, "
            "clear the list)"
        )


def _holders(tensors, limit=3):
    """Short descriptions of the objects that refer to `tensors`: the container, and what refers
    to that container (a function's closure or globals, an object's attribute)."""
    out = []
    for t in itertools.islice(tensors, 50):  # no slice: a new list would refer to them
        for ref in gc.get_referrers(t):
            if ref is tensors or isinstance(ref, types.FrameType):
                continue
            what = variable_of(ref, t)  # a global, an attribute, a closure's variable
            what = f"the tensor in {what}" if what else _describe(ref)
            if what and what not in out:
                out.append(what)
            if len(out) >= limit:
                return out
    if not out:  # the holders frozen out of the collector (gc.freeze): a module-level one
        index = module_level_tensors()
        for t in itertools.islice(tensors, 50):
            named = index.get(id(t))
            if named and f"the tensor in {named}" not in out:
                out.append(f"the tensor in {named}")
    return out


def module_level_tensors():
    """{id(tensor): 'the global `x` of mod' or 'the attribute `total` of mod.RUNNING'} for the
    tensors modules' globals hold, directly or as an attribute of a global object (torch's and
    autobatch's modules left out): read from sys.modules, for holders gc.get_referrers cannot see
    (objects frozen out of the collector by gc.freeze). The tensors' ids are valid while the
    caller holds the tensors."""
    out = {}
    for name, module in list(sys.modules.items()):
        values = getattr(module, "__dict__", None)
        if not isinstance(values, dict) or name.startswith(("torch", "autobatch")):
            continue
        for key, value in list(values.items()):
            if isinstance(value, torch.Tensor):
                out.setdefault(id(value), f"the global `{key}` of {name}")
                continue
            attrs = getattr(value, "__dict__", None)
            if isinstance(attrs, dict) and not isinstance(value, (type, types.ModuleType)):
                for k, v in list(attrs.items()):
                    if isinstance(v, torch.Tensor):
                        out.setdefault(id(v), f"the attribute `{k}` of {name}.{key}")
    return out


def variable_of(ref, t):
    """'the attribute `total` of a Running', 'the global `total` of train', 'the variable
    `total` in the closure of `step`' when `ref` is an object's __dict__, a module's globals or
    a closure's cell holding `t`; else None."""
    if isinstance(ref, types.CellType):
        for closure in gc.get_referrers(ref):
            for fn in gc.get_referrers(closure) if isinstance(closure, tuple) else ():
                if isinstance(fn, types.FunctionType) and fn.__closure__ is closure:
                    name = fn.__code__.co_freevars[closure.index(ref)]
                    return f"the variable `{name}` in the closure of `{fn.__qualname__}`"
        return None
    if not isinstance(ref, dict):  # an object whose attributes Python keeps inline (3.11+)
        attrs = getattr(ref, "__dict__", None)
        names = [k for k, v in attrs.items() if v is t] if isinstance(attrs, dict) else []
        return f"the attribute `{names[0]}` of a {type(ref).__name__}" if names else None
    names = [k for k, v in ref.items() if v is t]
    if not names:
        return None
    if "__name__" in ref and ref.get("__builtins__") is not None:
        return f"the global `{names[0]}` of {ref['__name__']}"
    owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
    if owners:
        return f"the attribute `{names[0]}` of a {type(owners[0]).__name__}"
    return None


def _describe(container):
    """'a list in the closure of the function `save`' and the like."""
    if isinstance(container, (list, dict, tuple, set)):
        head = f"a {type(container).__name__}"
    elif isinstance(container, torch.Tensor):
        return None  # a view's base: its holder is found from the view
    else:
        return f"an object of type {type(container).__name__}"
    for ref in gc.get_referrers(container):
        if isinstance(ref, types.CellType):  # cell <- the __closure__ tuple <- the function
            for closure in gc.get_referrers(ref):
                for fn in gc.get_referrers(closure) if isinstance(closure, tuple) else ():
                    if isinstance(fn, types.FunctionType) and fn.__closure__ is closure:
                        return f"{head} in the closure of the function `{fn.__qualname__}`"
        if isinstance(ref, dict) and "__name__" in ref and ref.get("__builtins__") is not None:
            names = [k for k, v in ref.items() if v is container]
            return f"{head} in the global `{names[0] if names else '?'}` of {ref['__name__']}"
        if isinstance(ref, dict):  # an object's __dict__: name the object's attribute
            names = [k for k, v in ref.items() if v is container]
            owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
            if names and owners:
                return f"{head} in the attribute `{names[0]}` of a {type(owners[0]).__name__}"
        if isinstance(ref, (types.FunctionType, types.MethodType)):
            return f"{head} held by `{getattr(ref, '__qualname__', '?')}`"
        if hasattr(ref, "__dict__") and any(v is container for v in vars(ref).values()):
            names = [k for k, v in vars(ref).items() if v is container]
            return f"{head} in the attribute `{names[0]}` of a {type(ref).__name__}"
    return head
