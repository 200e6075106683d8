"""The sharded model as one rank sees it: torch's fake process group, the model built on the meta
device and sharded by the user's function, and the shard layout FSDP2 gives each rank (its rows
per parameter, its local bytes, the classes of ranks alike), from which find_sharded picks the
ranks to size (_sharded.py)."""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from typing import Iterator

import torch

from .. import _fsdp
from .._errors import UsageError

# ---- the fake process group ---------------------------------------------------------------


@contextlib.contextmanager
def fake_group(rank: int, world_size: int) -> Iterator[None]:
    """torch's fake process group as rank `rank` of `world_size`, destroyed on leaving."""
    dist = torch.distributed
    if not dist.is_available():
        raise UsageError("find_sharded needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        raise UsageError(
            f"find_sharded sets up its own (fake) process group, and this process is already in "
            f"one (backend {dist.get_backend()!r}, world size {dist.get_world_size()}); destroy "
            "it first (dist.destroy_process_group()). In a running job with a real group, every "
            "rank calls find_sharded with world_size=None instead"
        )
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise UsageError(
            f"find_sharded needs torch's fake process group "
            f"(torch.testing._internal.distributed.fake_pg), which torch "
            f"{torch.__version__} does not import: {e}"
        ) from None
    # torch's init_process_group wraps sys.excepthook with a "[rankN]:" prefix that
    # destroy_process_group never removes (a later error would print "[rank3]: [rank0]:
    # Traceback"); put back with the group. The group is torn down even when
    # init_process_group itself fails (torch sets the default group before some of its errors).
    hook = sys.excepthook
    try:
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        _fsdp.forget_meshes()  # no DTensor op after this may reuse the fake group's mesh
        sys.excepthook = hook


def _build(build, shard, init, device, mesh, materialize=True):
    """The model as this rank of `mesh`'s group: built on the meta device and sharded by the
    user's `shard(model, mesh)`; with `materialize`, moved to `device` with to_empty (only this
    rank's shard is allocated) and initialized by `init`."""
    with torch.device("meta"):
        model = build()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"build: expected a function that returns a torch.nn.Module, but it "
            f"returned {type(model).__name__}"
        )
    where = sorted({str(p.device) for p in model.parameters() if p.device.type != "meta"})
    if where:
        raise UsageError(
            f"build: it is called under torch.device('meta') and must construct the "
            f"model there (nothing allocated, only rank r's shard is materialized), "
            f"but it returned parameters on {where}: construct a fresh model without "
            "device= or a checkpoint (e.g. LlamaForCausalLM(config), not "
            "from_pretrained); load the weights in init= if their values matter"
        )
    shard(model, mesh)
    modules = _fsdp.fsdp_modules(model)
    if not modules:
        raise UsageError(
            "shard: after shard(model, mesh) no module of the model is an FSDP2 "
            "module; call fully_shard(module, mesh=mesh) on each unit and on the "
            "root, e.g. for layer in model.layers: fully_shard(layer, mesh=mesh), "
            "then fully_shard(model, mesh=mesh)"
        )
    group = mesh.get_group().group_name
    other = sorted(
        {
            n
            for n, p in model.named_parameters()
            if getattr(p, "device_mesh", None) is not None
            and p.device_mesh.get_group().group_name != group
        }
    )
    if other:
        raise UsageError(
            f"shard: parameter {other[0]} is sharded on another mesh than the one "
            "shard(model, mesh) was given (fully_shard without mesh= takes the "
            "default group's: inside a job the real one, whose collectives would "
            "wait for ranks that try other batches); pass mesh=mesh to every "
            "fully_shard call"
        )
    missing = _fsdp.check_internals(modules)
    if missing:
        raise UsageError(
            f"find_sharded puts FSDP2 back between trials through names private to "
            f"torch's FSDP2, and torch {torch.__version__} lacks "
            f"{', '.join(missing)}; it was checked on torch 2.11 and 2.15"
        )
    if not materialize:
        return model
    with warnings.catch_warnings():
        # DTensor's random ops warn on a CPU mesh; the values do not change any allocation.
        warnings.filterwarnings("ignore", message="DTensor random operators")
        model.to_empty(device=device)
        with torch.no_grad():
            init(model)
    return model


def _mesh(device, world_size):
    """The 1-D mesh of the fake default group, named so that it never stands for another mesh
    over the same ranks (_distributed._in_job.mesh_names)."""
    from torch.distributed.device_mesh import init_device_mesh

    from ._in_job import mesh_names

    return init_device_mesh(device.type, (world_size,), mesh_dim_names=mesh_names("fake"))


def reset_parameters(model):
    """find_sharded's default init: reset_parameters() of every module that has one (what
    torch's FSDP2 examples call after to_empty). Buffers computed in a constructor keep whatever
    to_empty left: rotary frequencies change no allocation, but an index buffer (position ids)
    can then index out of range; pass init= that fills such buffers."""
    for m in model.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()


# ---- the shard layout ---------------------------------------------------------------------


def shard_rows(d, world_size, rank):
    """Rows of a dimension of size `d` that rank `rank` owns when FSDP2 shards it over
    `world_size` ranks: chunks of ceil(d/N) as torch.chunk makes them, the last ones shorter or
    empty (FSDP2 pads every rank's storage to the first chunk)."""
    chunk = math.ceil(d / world_size)
    return max(0, min(chunk, d - rank * chunk))


def layout(model, world_size):
    """The model's sharded parameters as [(global shape, shard dim or None, itemsize)], and the
    padded shard bytes every rank allocates."""
    params, padded = [], 0
    for p in model.parameters():
        placements = getattr(p, "placements", None)
        if placements is None:  # not sharded: every rank holds it whole
            params.append((tuple(p.shape), None, p.element_size()))
            padded += p.numel() * p.element_size()
            continue
        if len(placements) != 1 or not (placements[0].is_shard() or placements[0].is_replicate()):
            raise UsageError(
                f"find_sharded sizes FSDP2 on a 1-D mesh (fully_shard's Shard "
                f"placements), and a parameter has placements {placements}; pass "
                "shard() that calls fully_shard with a 1-D mesh"
            )
        dim = placements[0].dim if placements[0].is_shard() else None
        shape = tuple(p.shape)
        rows = math.ceil(shape[dim] / world_size) if dim is not None else 1
        per_row = p.numel() // shape[dim] if dim is not None and shape[dim] else p.numel()
        params.append((shape, dim, p.element_size()))
        padded += (rows * per_row if dim is not None else p.numel()) * p.element_size()
    return params, padded


def local_bytes(params, world_size, rank):
    """Bytes of the rows rank `rank` owns, per parameter (a tuple: the rank's shard signature)."""
    out = []
    for shape, dim, itemsize in params:
        numel = math.prod(shape)
        if dim is None or not shape[dim]:
            out.append(numel * itemsize)
        else:
            out.append(shard_rows(shape[dim], world_size, rank) * (numel // shape[dim]) * itemsize)
    return tuple(out)


def rank_classes(params, world_size):
    """Ranks grouped by their shard signature, largest total first: [(signature, [ranks])].
    The signature changes at most at the few ranks where chunks run short, so this walks runs."""
    classes = {}
    for r in range(world_size):
        classes.setdefault(local_bytes(params, world_size, r), []).append(r)
    return sorted(classes.items(), key=lambda kv: (-sum(kv[0]), kv[1][0]))


def ranks_to_size(classes, limit=3):
    """The representative (first) rank of each class no other class covers (a class covers
    another when each of its parameters' local bytes is at least the other's), largest first, at
    most `limit`."""
    chosen = []
    for signature, ranks in classes:
        if any(all(a >= b for a, b in zip(s, signature)) for s, _ in chosen):
            continue
        chosen.append((signature, ranks))
    return chosen[:limit]
