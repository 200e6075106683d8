"""The arguments of autobatch.find checked and put in the library's terms: bytes, counts,
seconds, the margin, the target batch, the device and the precision. Each bad value is a
UsageError that names it and the form expected, raised before any trial (docs/python.md)."""

import contextlib

import torch

from . import _core
from ._errors import UsageError

_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1  # the library counts bytes and samples in int64

_PRECISIONS = {
    None: None,
    "fp32": None,
    torch.float32: None,
    "amp-bf16": torch.bfloat16,
    "bf16": torch.bfloat16,
    torch.bfloat16: torch.bfloat16,
    "amp-fp16": torch.float16,
    "fp16": torch.float16,
    torch.float16: torch.float16,
}


def _bytes(value, what, hint=""):
    """An int (bytes) or a string with a unit ("512MiB", "8GB", "1e9"); `hint` ends a message."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(
            f"{what}: expected bytes as an int or a string such as '8GiB', but got {value!r}"
        )
    if isinstance(value, int):
        if value < 0 or value > _INT64_MAX:
            raise UsageError(f"{what}: expected >= 0 bytes and < 2^63, but got {value}")
        return value
    if value != value.strip() or not value:
        raise UsageError(
            f"{what}: expected bytes as a string such as '8GiB', '512MiB' or "
            f"'1.5 GB' (a space may stand between the number and the unit, none "
            f"around it), but got {value!r}"
        )
    try:
        return _core.parse_bytes(value, what)
    except _core.Error as e:
        raise UsageError(f"{e}{hint}") from None


def _limit(value):
    """memory_limit: None (the device's, or the room this process has) or bytes > 0; 0 is refused
    rather than read as "no limit" (a budget computed to 0 is a mistake: issue 40 row 6)."""
    # A negative int gets the words of 0 (">= 0" would name a value also refused).
    negative = isinstance(value, int) and not isinstance(value, bool) and value < 0
    n = 0 if negative else _bytes(value, "memory_limit")
    if value is not None and n == 0:
        raise UsageError(
            f"memory_limit: expected more than 0 bytes, but got {value!r}; pass "
            "None (the default) for the device's own memory"
        )
    return n


def _count(value, what, minimum=1, none_is=0, maximum=_INT64_MAX):
    """An option that counts (samples, ranks, trials): an int in [`minimum`, `maximum`], or None
    (`none_is`). Floats, strings and bools are refused rather than truncated (issue 40 row 13).
    `maximum`: _INT32_MAX for what the library holds in a C++ int (world_size, max_trials,
    steps_per_trial: autobatch/vocabulary/search_options.h, training_spec.h; 2^40 would pass here
    and fail in pybind11's cast, "to C++ type '?'")."""
    if value is None:
        return none_is
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(
            f"{what}: expected an int >= {minimum}, but got {value!r} ({type(value).__name__})"
        )
    if not minimum <= value <= maximum:
        bound = (
            "< 2^63"
            if maximum == _INT64_MAX
            else f"<= {maximum} (2^31 - 1)"
            if maximum == _INT32_MAX
            else f"<= {maximum}"
        )
        raise UsageError(f"{what}: expected an int >= {minimum} and {bound}, but got {value}")
    return value


def _seconds(value):
    """time_limit: None (no limit) or seconds > 0 (an int or a float)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(
            f"time_limit: expected seconds > 0 (an int or a float) or None for no "
            f"limit, but got {value!r}"
        )
    return float(value)


def _margin(margin):
    """(fraction, bytes): a float in [0, 1) or "5%" is a fraction; an int or "256MiB" bytes."""
    if margin is None:
        return 0.05, -1
    if isinstance(margin, bool) or not isinstance(margin, (int, float, str)):
        raise UsageError(
            f"margin: expected a fraction in [0, 1) such as 0.05, a percentage such "
            f"as '5%', or bytes such as 268435456 or '256MiB', but got {margin!r}"
        )
    if isinstance(margin, float):
        if not 0.0 <= margin < 1.0:
            raise UsageError(
                f"margin: expected a fraction in [0, 1) such as 0.05, or bytes, but got {margin}"
            )
        return margin, -1
    if isinstance(margin, str) and margin.strip().endswith("%"):
        try:
            pct = float(margin.strip()[:-1])
        except ValueError:
            pct = -1.0
        if not 0.0 <= pct < 100.0:
            raise UsageError(
                f"margin: expected a percentage in [0, 100) such as '5%', but got {margin!r}"
            )
        return pct / 100.0, -1
    return 0.05, _bytes(
        margin, "margin", "; a margin is also a fraction (0.05) or a percentage ('5%')"
    )


def _target(target_batch):
    """target_batch: None (no plan) or an int >= 1."""
    if target_batch is None:
        return 0
    if (
        isinstance(target_batch, bool)
        or not isinstance(target_batch, int)
        or target_batch < 1
        or target_batch > _INT64_MAX
    ):
        raise UsageError(
            f"target_batch: expected an int >= 1 and < 2^63 (samples per optimizer "
            f"step over all ranks) or None for no plan, but got {target_batch!r}"
        )
    return target_batch


def _checked_device(device):
    """torch.device(device), or a UsageError naming what exists: a device string torch does not
    parse, CUDA without a usable GPU, a CUDA index past the devices there are, anything but
    cpu / cuda (the devices autobatch measures)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UsageError(
            f"device: expected 'cpu', 'cuda' or 'cuda:N', but got {device!r} ({e})"
        ) from None
    if device.type == "cpu":
        if device.index not in (None, 0):
            raise UsageError(
                f"device: expected 'cpu', but got {str(device)!r} (the CPU has no index)"
            )
        return torch.device("cpu")
    if device.type != "cuda":
        raise UsageError(
            f"device: autobatch measures 'cpu' and 'cuda' devices, not {device.type!r}"
        )
    if not torch.cuda.is_available():
        raise UsageError(
            f"device: {str(device)!r} was asked, but torch.cuda.is_available() is "
            "False here (no NVIDIA driver or GPU, or a CPU-only torch); use "
            "device='cpu'"
        )
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise UsageError(
            f"device: cuda:{index} was asked, but this machine has {count} CUDA "
            f"device(s) (cuda:0 to cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def _device_of(model, device):
    params = list(model.parameters())
    if not params:
        raise UsageError("model: it has no parameters, so there is nothing to train")
    lazy = [
        n
        for n, p in model.named_parameters()
        if isinstance(p, torch.nn.parameter.UninitializedParameter)
    ]
    if lazy:
        raise UsageError(
            f"model: {len(lazy)} parameter(s) are not initialized yet ({lazy[0]}: "
            "a lazy module such as nn.LazyLinear learns its shapes from its first "
            "input); run one forward on the example first, e.g. model(example), "
            "then call autobatch"
        )
    where = {p.device for p in params}
    if any(d.type == "meta" for d in where):
        raise UsageError(
            "model: its parameters are on the meta device (shapes without data); "
            "materialize it first (model.to_empty(device=...) and load or "
            "initialize its weights)"
        )
    if device is None:
        if len(where) > 1:
            raise UsageError(
                f"device: the model's parameters are on {sorted(map(str, where))}; "
                "autobatch sizes a model on one device: pass device="
            )
        device = next(iter(where))
    device = _checked_device(device)
    if any(d != device for d in where):
        raise UsageError(
            f"device: the model is on {sorted(map(str, where))} but device={device} "
            f"was asked; move it first (model.to('{device}')): autobatch never moves "
            "the user's model"
        )
    return device


def _autocast(device, precision, cache=True):
    """(a context factory for the trials' forward and loss, the precision's name). `cache`:
    torch.autocast's cache_enabled (PyTorch's default True; Lightning's mixed precision passes
    False, so a weight used twice in one forward is cast twice)."""
    if precision not in _PRECISIONS:
        raise UsageError(
            f"precision: expected None / 'fp32', 'amp-bf16' or 'amp-fp16' (autocast "
            f"around forward and loss), but got {precision!r}"
        )
    if not isinstance(cache, bool):
        raise UsageError(
            f"autocast_cache: expected True (torch.autocast's default cache of the "
            f"weights' casts) or False (cache_enabled=False, as Lightning's mixed "
            f"precision), but got {cache!r}"
        )
    dtype = _PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext, "fp32"
    name = "amp-bf16" if dtype == torch.bfloat16 else "amp-fp16"
    return (lambda: torch.autocast(device.type, dtype=dtype, cache_enabled=cache)), name
