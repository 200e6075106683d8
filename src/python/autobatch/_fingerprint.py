"""The fingerprint of a model and its step: what the memory of a training step depends on,
hashed (the result cache's key, docs/python.md)."""
import hashlib
import types
from collections.abc import Mapping

import torch

def _code_digest(fn):
    """SHA-1 (hex) of a Python function's code (bytecode, names and constants, nested functions
    included), or None for a callable without Python code (a builtin, a C function): a changed
    body changes it, a changed address or weight value does not."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None and fn is not None and not isinstance(fn, type):
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
    if code is None:
        return None
    h = hashlib.sha1()

    def walk(c):
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                walk(k)
            else:
                h.update(repr(k).encode())
    walk(code)
    return h.hexdigest()


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
            digest = _code_digest(v) if isinstance(
                v, (types.FunctionType, staticmethod, classmethod)) else None
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


def _settings(obj, configs):
    """A module's plain attributes (Dropout's p, a transformers layer's gradient_checkpointing,
    ...; not `training`, which the search sets) and those of a configuration object it holds (an
    attribute with to_dict(), such as a transformers PretrainedConfig: attention implementation,
    use_cache, ...), each configuration once (`configs`: ids already hashed)."""
    out = []
    for k, v in sorted(vars(obj).items()):
        if k in ("training", "_parameters", "_buffers", "_modules") or callable(v):
            continue
        p = _plain(v)
        if p is not None or v is None:
            out.append((k, p))
        elif hasattr(v, "to_dict") and not isinstance(v, (torch.Tensor, torch.nn.Module)):
            if id(v) not in configs:
                configs.add(id(v))
                out.append((k, tuple((a, _plain(b)) for a, b in sorted(vars(v).items())
                                     if _plain(b) is not None)))
    return tuple(out)


def fingerprint(model, example_batch=None, **options):
    """SHA-1 (hex) of what the memory of the model's training step depends on: its structure
    (module types and names; parameter and buffer names, shapes, dtypes, requires_grad), each
    module's plain settings (Dropout's p, gradient checkpointing flags, a transformers config's
    values such as the attention implementation), the code of each module class's methods
    (forward, training_step, ...; not torch's own classes), the example batch's shapes and dtypes, torch's version and the options: two models with equal
    fingerprints train with the same memory under the same options (the result cache's key holds
    it, docs/python.md). Values of weights are not hashed."""
    h = hashlib.sha1()

    def put(*items):
        h.update(repr(items).encode())
        h.update(b"\n")

    put("autobatch-python-2", torch.__version__)
    configs, classes = set(), {}
    for name, m in model.named_modules():
        put("module", name, type(m).__module__, type(m).__qualname__, _settings(m, configs))
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
        return repr(type(x))
    put("example", shapes(example_batch))
    put("options", sorted((k, repr(v)) for k, v in options.items()))
    return h.hexdigest()
