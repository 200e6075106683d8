"""FSDP2 (`torch.distributed.fsdp.fully_shard`) between trials (issue 43).

A trial that runs out of memory inside a sharded model's forward or backward leaves FSDP2 midway:
parameters unsharded (the all-gather outputs registered on the modules), param groups in their
FORWARD or PRE_BACKWARD state, a post-backward callback counted as queued. The next forward then
skips its all-gather ("got mixed torch.Tensor and DTensor") and the search fails on an error that
is not the model's. `reset` puts every FSDP2 state of the model back as after a finished backward
(torch's FSDPState._root_post_backward_final_callback and FSDPParamGroup.finalize_backward do the
same at the end of every backward): idle, sharded, the unsharded storage freed, no collective
result held (nor the all-gather output a stopped forward kept for overlap). It reads names private
to torch's FSDP2 (checked on torch 2.11 and 2.15);
CLASS_NAMES and INSTANCE_NAMES list them, checked by `check_internals()` before a sharded model
is sized (a torch whose FSDP2 differs is refused, with the name that differs, rather than sized
wrong).
"""

from __future__ import annotations

# What reset() reads and writes. Methods and enum members, checked on the classes:
CLASS_NAMES = [
    ("torch.distributed.fsdp", "FSDPModule", "_get_fsdp_state"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup", "_to_sharded"),
    ("torch.distributed.fsdp._fully_shard._fsdp_common", "TrainingState", "IDLE"),
]
# Attributes the constructors set, checked on the sharded model's own states (instances):
# (which object, attribute).
INSTANCE_NAMES = [
    ("state", "_fsdp_param_group"),
    ("state", "_training_state"),
    ("state", "_state_ctx"),
    ("state", "_comm_ctx"),
    ("state._state_ctx", "post_backward_final_callback_queued"),
    ("state._state_ctx", "iter_forward_root"),
    ("group", "_training_state"),
    ("group", "_all_gather_result"),
    ("group", "_post_forward_indices"),
    ("group", "fsdp_params"),
]


def check_internals(modules=()):
    """The names reset() needs that this torch lacks, as text (empty: all there): CLASS_NAMES
    on torch's classes, INSTANCE_NAMES on the FSDP2 states of `modules` (fully_shard's)."""
    import importlib

    missing = []
    for module, cls, name in CLASS_NAMES:
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{cls}")
            continue
        if not hasattr(owner, name):
            missing.append(f"{module}.{cls}.{name}")
    if missing:
        return missing
    for m in modules:
        state = m._get_fsdp_state()
        group = state._fsdp_param_group if hasattr(state, "_fsdp_param_group") else None
        objects = {"state": state, "group": group}
        for where, name in INSTANCE_NAMES:
            head, _, rest = where.partition(".")
            obj = objects[head]
            if obj is not None and rest:
                obj = getattr(obj, rest, None)
            if obj is not None and not hasattr(obj, name):
                missing.append(f"FSDP2's {where}.{name} (on {type(obj).__name__})")
    return sorted(set(missing))


def fsdp_modules(model):
    """The modules of `model` that fully_shard made FSDPModules (empty without FSDP2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reset(modules):
    """Every FSDP2 state of `modules` back as after a finished backward (see the module's doc)."""
    if not modules:  # no FSDP2: nothing to import (torch 2.5 keeps FSDP2 elsewhere)
        return
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    for m in modules:
        state = m._get_fsdp_state()
        group = state._fsdp_param_group
        if group is not None:
            group._training_state = TrainingState.IDLE
            group._all_gather_result = None
            group._post_forward_indices.clear()
            group._to_sharded()
            for p in group.fsdp_params:
                # gradients a backward stopped by out of memory left unreduced: torch 2.11 keeps
                # them in an attribute of FSDPParam, 2.15 on the unsharded parameter only (its
                # unsharded_accumulated_grad is a property over it)
                if "unsharded_accumulated_grad" in vars(p):
                    p.unsharded_accumulated_grad = None
                unsharded = vars(p).get("_unsharded_param")
                if unsharded is not None:
                    unsharded.grad = None
        state._training_state = TrainingState.IDLE
        ctx = state._state_ctx
        ctx.post_backward_final_callback_queued = False
        ctx.iter_forward_root = None
        comm = state._comm_ctx  # its lists exist after the first forward's lazy init
        if hasattr(comm, "post_forward_order"):
            comm.post_forward_order.clear()
        if hasattr(comm, "reduce_scatter_state"):
            comm.reduce_scatter_state = None
        # the last unit's all-gather output, kept through the forward for overlap and freed by
        # the next unit's wait or the root's final callback: a forward stopped by out of memory
        # left it held (2.1 MB for a ShardedMlp block at world 4) into the next trial
        if hasattr(comm, "all_gather_state"):
            comm.all_gather_state = None


def forget_meshes():
    """Clears DTensor's sharding-propagation caches (torch 2.11 and 2.15: the
    ShardingPropagator's propagate_op_sharding and _propagate_tensor_meta_cached), whose keys
    hold meshes: two DeviceMeshes over the same ranks with the same dimension names compare and
    hash equal whatever their process groups, so a result cached on the fake group's mesh could
    stand for a later mesh of the user's (our meshes are named apart: mesh_names in
    _distributed/_in_job.py; this drops what the fake group's ops left). Called whenever one of
    our groups is torn down. Returns the names cleared (empty when this torch has none of them)."""
    try:
        from torch.distributed.tensor import DTensor

        propagator = DTensor._op_dispatcher.sharding_propagator
    except (ImportError, AttributeError):
        return []
    cleared = []
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        cache = getattr(propagator, name, None)
        if callable(getattr(cache, "cache_clear", None)):
            cache.cache_clear()
            cleared.append(name)
    return cleared
