"""The fingerprint of a model and its step: what the memory of a training step depends on,
hashed (the result cache's key, docs/python.md)."""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Mapping
from typing import Any

import torch


def _code_digest(fn, seen=None):
    """SHA-1 (hex) of a callable's code and of what it reads that is not an argument: its
    bytecode, names and constants (nested functions included), the values its closure, defaults
    and the globals it names hold (plain values by value, tensors by shape and dtype, functions
    by their own digest, modules by their fingerprint, other objects by type), a
    functools.partial's function and bound arguments, a callable object's __call__ (a module's
    forward: its fingerprint) and plain attributes; or None for a callable without Python code (a
    builtin, a C function). A changed body or a changed value it closes over changes it (a step
    closing over k = 8 or k = 1, a partial's k, a loss module's edited forward: with one digest
    the cache would serve each other's answers); a changed address or weight value does not."""
    if fn is None:
        return None
    h = hashlib.sha1()
    if not _digest_into(h, fn, set() if seen is None else seen):
        return None
    return h.hexdigest()


def _digest_into(h, fn, seen):
    """Adds `fn`'s digest (see _code_digest) to `h`; False when it has no Python code."""
    if id(fn) in seen:
        h.update(b"<seen>")
        return True
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        if not _digest_into(h, fn.func, seen):
            h.update(repr(fn.func).encode())
        h.update(repr([_value(v, seen) for v in fn.args]).encode())
        h.update(repr(sorted((k, _value(v, seen)) for k, v in fn.keywords.items())).encode())
        return True
    if isinstance(fn, torch.nn.Module):
        h.update(_fingerprint(fn, None, {}, seen).encode())
        return True
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    if code is None:
        if isinstance(fn, type) or not callable(fn):
            return False
        call = getattr(type(fn), "__call__", None)  # noqa: B004  the method itself, not a test
        if getattr(call, "__code__", None) is None:
            return False
        _digest_into(h, call, seen)
        h.update(
            repr(
                sorted((k, _value(v, seen)) for k, v in vars(fn).items() if not k.startswith("__"))
            ).encode()
            if hasattr(fn, "__dict__")
            else b""
        )
        return True

    def walk(c):
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                walk(k)
            else:
                h.update(repr(k).encode())

    walk(code)
    for cell in getattr(func, "__closure__", None) or ():
        try:
            h.update(repr(_value(cell.cell_contents, seen)).encode())
        except ValueError:  # an empty cell (a name assigned later)
            h.update(b"<empty>")
    h.update(repr([_value(v, seen) for v in getattr(func, "__defaults__", None) or ()]).encode())
    h.update(
        repr(
            sorted(
                (k, _value(v, seen))
                for k, v in (getattr(func, "__kwdefaults__", None) or {}).items()
            )
        ).encode()
    )
    module_globals = getattr(func, "__globals__", {})
    names = sorted({n for c in _codes(code) for n in c.co_names if n in module_globals})
    h.update(repr([(n, _value(module_globals[n], seen, shallow=True)) for n in names]).encode())
    return True


def _codes(code):
    yield code
    for k in code.co_consts:
        if isinstance(k, types.CodeType):
            yield from _codes(k)


def _value(v, seen, shallow=False):
    """A value a function reads, as data for its digest: plain values and containers of them by
    value, tensors by shape and dtype, functions by their digest, modules by their fingerprint
    (`shallow`: a module-level global, by its type: a module or class the function names is
    hashed as code where it is the model's), anything else by its type."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    if isinstance(v, (tuple, list)) and len(v) <= 64:
        return tuple(_value(x, seen, shallow) for x in v)
    if isinstance(v, Mapping) and len(v) <= 64:
        return tuple(
            (repr(k), _value(x, seen, shallow))
            for k, x in sorted(v.items(), key=lambda i: repr(i[0]))
        )
    if shallow or isinstance(v, (type, types.ModuleType)):
        return repr(type(v))
    if isinstance(v, torch.nn.Module):
        if id(v) in seen:  # a module whose own attribute closes over it (model.forward = ...)
            return ("module", repr(type(v)))
        return ("module", _fingerprint(v, None, {}, seen))
    if callable(v):
        sub = hashlib.sha1()
        return ("code", sub.hexdigest() if _digest_into(sub, v, seen) else repr(type(v)))
    return repr(type(v))


def _class_digest(cls):
    """SHA-1 (hex) of the code of a module class's methods (forward, a LightningModule's
    training_step, helpers, properties), its own and its bases' up to torch.nn.Module; classes of
    torch itself are left out (torch's version is hashed beside)."""
    h = hashlib.sha1()
    for k in cls.__mro__:
        if k is torch.nn.Module or k is object:
            break
        if k.__module__.split(".")[0] == "torch":
            continue
        for name, v in sorted(vars(k).items()):
            v = v.fget if isinstance(v, property) else v
            digest = (
                _code_digest(v)
                if isinstance(v, (types.FunctionType, staticmethod, classmethod))
                else None
            )
            if digest is not None:
                h.update(f"{k.__qualname__}.{name} {digest}\n".encode())
    return h.hexdigest()


_PLAIN = (bool, int, float, str, type(None))


def _plain(value):
    """A module setting as plain data (numbers, strings, None, tuples of them), else None."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
        return tuple(value)
    return None


_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)
_BOOKKEEPING = (
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
    "_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_non_persistent_buffers_set",
)


def _settings(obj, configs, seen):
    """A module's plain attributes (Dropout's p, a transformers layer's gradient_checkpointing,
    ...; not `training`, which the search sets), dicts of plain values (`self.cfg = {"views":
    8}`), tensors it holds outside its parameters and buffers (by shape and dtype: every trial
    holds them), an instance's own callables (a `forward` patched on the instance) and its forward
    and backward hooks (by their code), and those of a configuration object it holds (an
    attribute with to_dict(), such as a transformers PretrainedConfig: attention implementation,
    use_cache, ...), each configuration once (`configs`: ids already hashed). Each of these
    changes the step's memory (a hook, a dict setting, a held tensor, a patched forward), so each
    is in the key."""
    out = []
    for k, v in sorted(vars(obj).items()):
        if k in ("training", "_parameters", "_buffers", "_modules"):
            continue
        if k in _HOOKS:
            out.append((k, tuple(_code_digest(f, seen) for f in v.values())))
            continue
        if k in _BOOKKEEPING:
            continue  # keyed by the hooks' handle ids, which differ from process to process
        p = _plain(v)
        if p is not None or v is None:
            out.append((k, p))
        elif isinstance(v, torch.Tensor):
            out.append((k, ("tensor", tuple(v.shape), str(v.dtype))))
        elif callable(v) and not isinstance(v, (torch.nn.Module, type)):
            out.append((k, ("code", _code_digest(v, seen))))
        elif isinstance(v, Mapping) and all(_plain(x) is not None or x is None for x in v.values()):
            out.append(
                (
                    k,
                    tuple(
                        (repr(a), _plain(b)) for a, b in sorted(v.items(), key=lambda i: repr(i[0]))
                    ),
                )
            )
        elif hasattr(v, "to_dict") and not isinstance(v, (torch.Tensor, torch.nn.Module)):
            if id(v) not in configs:
                configs.add(id(v))
                out.append(
                    (
                        k,
                        tuple(
                            (a, _plain(b))
                            for a, b in sorted(vars(v).items())
                            if _plain(b) is not None
                        ),
                    )
                )
    return tuple(out)


def fingerprint(model: torch.nn.Module, example_batch: Any = None, **options: Any) -> str:
    """SHA-1 (hex) of what the memory of the model's training step depends on.

    Hashed: the model's structure (module types and names; parameter and buffer names, shapes,
    dtypes, requires_grad), each module's plain settings (Dropout's p, gradient checkpointing
    flags, dicts of plain values, a transformers config's values such as the attention
    implementation), tensors it holds outside its parameters and buffers (shapes and dtypes),
    its hooks and an instance-level forward (their code), the code of each module class's
    methods (forward, training_step, ...; not torch's own classes), the example batch's shapes,
    dtypes and plain values, torch's version and the options (by their repr). Two models with
    equal fingerprints train with the same memory under the same options; find()'s
    Result.fingerprint and the result cache's key hold it (docs/python.md). The values of the
    weights are not hashed, so loading a checkpoint keeps the fingerprint.

    Args:
        model (torch.nn.Module): the model (not run, not changed).
        example_batch (Any): the example batch as find() takes it, or None (default).
        **options (Any): any further values to hash, by name (find() passes its resolved
            options).

    Returns:
        str: 40 hexadecimal digits.

    Examples:
        >>> a = autobatch.fingerprint(torch.nn.Linear(4, 2), torch.randn(1, 4))
        >>> a == autobatch.fingerprint(torch.nn.Linear(4, 2), torch.randn(8, 4))
        False
        >>> a == autobatch.fingerprint(torch.nn.Linear(4, 2), torch.randn(1, 4))
        True
    """
    return _fingerprint(model, example_batch, options, set())


def _fingerprint(model, example_batch, options, seen):
    """fingerprint(); `seen`: ids of the objects already being hashed (a module that a function
    of its own closes over is hashed once)."""
    seen.add(id(model))
    h = hashlib.sha1()

    def put(*items):
        h.update(repr(items).encode())
        h.update(b"\n")

    put("autobatch-python-3", torch.__version__)
    configs, classes = set(), {}
    for name, m in model.named_modules():
        put("module", name, type(m).__module__, type(m).__qualname__, _settings(m, configs, seen))
        classes.setdefault(type(m), None)
    for cls in classes:
        put("code", cls.__module__, cls.__qualname__, _class_digest(cls))
    for name, p in model.named_parameters():
        put("parameter", name, tuple(p.shape), str(p.dtype), p.requires_grad)
    for name, b in model.named_buffers():
        put("buffer", name, tuple(b.shape), str(b.dtype))

    def shapes(x):
        if isinstance(x, torch.Tensor):
            return ("tensor", tuple(x.shape), str(x.dtype))
        if isinstance(x, Mapping):
            # Sorted by the keys' repr: keys of mixed types do not compare with each other.
            return tuple((k, shapes(v)) for k, v in sorted(x.items(), key=lambda i: repr(i[0])))
        if isinstance(x, (list, tuple)):
            return tuple(shapes(v) for v in x)
        # a plain value by value (a count of views the forward takes changes its memory)
        return ("value", x) if isinstance(x, _PLAIN) else repr(type(x))

    put("example", shapes(example_batch))
    put("options", sorted((k, repr(v)) for k, v in options.items()))
    return h.hexdigest()
