"""The leak named: one instrumented eager step (autobatch.soak runs it once, after a soak whose
steps left tensors alive), which says which objects keep the step's tensors past its end, the
bytes each keeps, and the user's line that keeps them, with the usual fix.

Where the bytes were allocated is not the answer: activations are allocated in the model's
forward, but the culprit is the line that holds on to them. So the step runs with two recorders:

- a TorchFunctionMode (torch.overrides) notes, for every tensor a torch function returns, the
  first frame of the caller's code outside torch and autobatch: the line that made it
  (`total += loss` makes `total` through Tensor.__iadd__ / __radd__);
- a profile function (sys.setprofile) notes each call of a container's append, extend, insert,
  add, update or setdefault from the user's code: the line that put something into a list or a
  dict (a hook's `kept.append(output)`).

After the step (its batch, outputs, gradients and optimizer let go, gc.collect() run), the
tensors the step made that are still alive are its leak. Each is charged with its storage's
bytes plus the saved tensors its autograd graph still holds (the `_saved_*` attributes of its
grad_fn and the nodes behind it: a metric kept as a tensor keeps every step's activations
through its graph, torch/csrc/autograd/generated/python_functions.cpp), and named by what holds
it: the container it was appended to and that container's owner (a closure, a global, an
object's attribute; _survivors._describe), or, for a tensor held directly, the line that made it.
"""

from __future__ import annotations

import gc
import linecache
import os
import sys
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode

from . import _core
from ._state import live_storages
from ._survivors import _describe, module_level_tensors, variable_of

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB_DIR = os.path.dirname(os.__file__)
# A container's methods that put something into it.
_PUTS = {"append", "extend", "insert", "add", "update", "setdefault", "appendleft", "__setitem__"}


def _user_frame(frame):
    """(file, line, function) of the first frame from `frame` outward in the user's code (torch's
    and the standard library's frames passed over), or None when autobatch's own code comes
    first (what the trial itself makes: the batch, the optimizer's step)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_OWN_DIR):
            return None
        if not (name.startswith((_TORCH_DIR, _STDLIB_DIR)) or name.startswith("<frozen")):
            return name, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


class _Made(TorchFunctionMode):
    """Notes the user's line that made each tensor a torch function returns."""

    def __init__(self):
        super().__init__()
        self.made = {}  # id(tensor) -> (weakref, where)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        where = _user_frame(sys._getframe(1))
        if where is not None:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    try:
                        self.made[id(t)] = (weakref.ref(t), where)
                    except TypeError:
                        pass
        return out


class Recorder:
    """The two recorders around one step: `with Recorder() as r: step()`; then r.leaks(...)."""

    def __init__(self):
        self.mode = _Made()
        self.puts = {}  # id(container) -> (weakref or the container's id only, where)
        self._previous = None

    def _profile(self, frame, event, arg):
        if event != "c_call" or getattr(arg, "__name__", None) not in _PUTS:
            return
        container = getattr(arg, "__self__", None)
        if not isinstance(container, (list, dict, set)) and not hasattr(container, "append"):
            return
        where = _user_frame(frame)
        if where is not None:
            self.puts[id(container)] = where

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        sys.setprofile(self._previous)
        return False

    def leaks(self, baseline_ptrs):
        """The findings: the step's tensors alive now (their storages not in `baseline_ptrs`),
        grouped by what holds them, the most bytes first: dicts {"holder", "where" (file:line),
        "source" (that line's text), "tensors", "bytes", "fix"}."""
        gc.collect()
        alive = []
        for ref, where in self.mode.made.values():
            t = ref()
            # (a running total updated in place keeps its storage: its graph is what is new)
            if t is not None and (_ptr(t) not in baseline_ptrs or t.grad_fn is not None):
                alive.append((t, where))
        # What a graph holds is charged to its root (the running total, not the activation or
        # the term its graph holds): a tensor whose own graph node, or whose storage as a saved
        # tensor, lies inside another alive tensor's graph is part of that root's leak.
        # (the nodes' Python wrappers are held, in `graphs`, while their ids are compared: a
        # wrapper let go is made anew at the next access, and its id may then be another's)
        graphs = [_graph(t.grad_fn) for t, _ in alive]  # (nodes, saved tensors), once each
        inner_nodes, inner_ptrs = set(), set()
        for nodes, saved in graphs:
            inner_nodes.update(id(n) for n in nodes[1:])  # nodes[0] is the tensor's own
            inner_ptrs.update(_ptr(x) for x in saved)
        rows = [
            (t, w, saved)
            for (t, w), (_, saved) in zip(alive, graphs)
            if not (t.grad_fn is not None and id(t.grad_fn) in inner_nodes)
        ]
        rows.sort(key=lambda row: (_ptr(row[0]) in inner_ptrs, row[0].grad_fn is None))
        seen, groups = set(baseline_ptrs), {}
        module_level = module_level_tensors()
        for t, where, saved in rows:
            kept = _kept_bytes([t, *saved], seen)
            if kept == 0:
                continue
            holder, line, fix = self._holder(t, where, module_level)
            g = groups.setdefault((holder, line), {"tensors": 0, "bytes": 0, "fix": fix})
            g["tensors"] += 1
            g["bytes"] += kept
        del rows, graphs
        del alive
        out = []
        for (holder, line), g in sorted(groups.items(), key=lambda kv: -kv[1]["bytes"]):
            file, lineno = line if line else ("?", 0)
            out.append(
                {
                    "holder": holder,
                    "where": f"{_shown(file)}:{lineno}" if line else "",
                    "source": linecache.getline(file, lineno).strip() if line else "",
                    "tensors": g["tensors"],
                    "bytes": g["bytes"],
                    "fix": g["fix"],
                }
            )
        return out

    def _holder(self, t, made_at, module_level):
        """(holder, (file, line) of the user's line that keeps it, fix) of a live tensor: the
        module-level global or attribute that holds it (`module_level`:
        _survivors.module_level_tensors, read once), the container it was put in and the line
        that put it there, or the variable or attribute that holds it directly; for a tensor
        held directly, the line that made it."""
        direct = (
            "keep a Python number (`total += loss.item()`) or a tensor without its graph "
            "(`total += loss.detach()`)"
            if t.grad_fn is not None
            else "drop the reference after the step, or keep a Python number"
        )
        graph = " with its autograd graph" if t.grad_fn is not None else ""
        if id(t) in module_level:
            return f"a tensor{graph} in {module_level[id(t)]}", made_at[:2], direct
        for ref in gc.get_referrers(t):
            if isinstance(ref, (types.FrameType, tuple)) or ref is self.mode.made:
                continue
            named = variable_of(ref, t)
            if named:
                return f"a tensor{graph} in {named}", made_at[:2], direct
            if isinstance(ref, (list, dict, set)) or hasattr(ref, "append"):
                put = self.puts.get(id(ref))
                return (
                    _describe(ref),
                    put[:2] if put else None,
                    "store what you need of it (loss.item(), output.detach().cpu(), a running "
                    "sum as a Python number) and clear the container after use",
                )
        return f"a tensor{graph}", made_at[:2], direct


def _shown(path):
    """The path relative to the working directory when it is inside it, else as it is."""
    here = os.getcwd()
    return os.path.relpath(path, here) if path.startswith(here + os.sep) else path


def baseline_ptrs(device):
    """The storages alive before the instrumented step: every tensor Python tracks
    (_state.live_storages) and the saved tensors of their autograd graphs (which only C++
    holds: a running total's graph from the steps before)."""
    rows = live_storages(device)
    ptrs = {p for p, _, _ in rows}
    for _, _, t in rows:
        ptrs.update(_ptr(x) for x in _graph(t.grad_fn)[1])
    return ptrs


def _ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _kept_bytes(tensors, seen):
    """Bytes of the storages of `tensors` (a tensor and its graph's saved tensors) not in
    `seen` (updated)."""
    total = 0
    for x in tensors:
        p = _ptr(x)
        if p is None or p in seen:
            continue
        seen.add(p)
        total += x.untyped_storage().nbytes()
    return total


def _graph(root, limit=100_000):
    """([nodes], [saved tensors]) of the autograd graph from `root` (a tensor's grad_fn, None for
    none: ([], [])): every node reachable from it, `root` first, held as Python objects (their
    ids stay theirs while the caller holds the list), and the tensors those nodes still save
    (freed ones, after a backward without retain_graph, skipped)."""
    nodes, saved, seen, stack = [], [], set(), [root]
    while stack and len(nodes) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed by a backward without retain_graph
                continue
            saved += [
                v
                for v in (value if isinstance(value, (tuple, list)) else (value,))
                if isinstance(v, torch.Tensor)
            ]
        stack.extend(n for n, _ in getattr(node, "next_functions", ()))
    return nodes, saved


def finding_lines(leaks, limit=3):
    """The soak's report lines of the leaks found by the instrumented step."""
    fmt = _core.format_bytes
    lines = []
    for leak in leaks[:limit]:
        where = f" at {leak['where']}" if leak["where"] else ""
        source = f" (`{leak['source']}`)" if leak["source"] else ""
        lines.append(
            f"leak: {leak['holder']}{where}{source} keeps {leak['tensors']} tensor(s), "
            f"{fmt(leak['bytes'])} made by one step: {leak['fix']}"
        )
    return lines
