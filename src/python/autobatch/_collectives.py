"""Ranks of a running job that each search on their own: a trial's step must run no collective
(the other ranks would wait in it), checked by a dispatch mode during the warm-up and refused up
front for modules that always run one."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._errors import UsageError


class CollectiveInStep(RuntimeError):
    """A collective (all_reduce, all_gather, barrier, ...) inside the step of a rank that searches
    on its own: the ranks try different batches at different times, so a collective would wait for
    ranks that never join it."""


_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


class CollectiveGuard(TorchDispatchMode):
    """Refuses, before it runs, any collective of torch.distributed dispatched inside the `with`
    block (the ops of the c10d namespaces: `dist.all_reduce` reaches `c10d.allreduce_` through the
    dispatcher since torch 2.1, DDP's reducer and SyncBatchNorm too), naming the module whose
    forward (or whose backward, for hooks) was running. Module names come from global forward
    hooks held only inside the block."""

    def __init__(self, model):
        super().__init__()
        self.names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}
        self.stack, self.last, self.hooks = [], None, []

    def __enter__(self):
        from torch.nn.modules import module as nn_module

        def pre(m, args):
            self.stack.append(self.names.get(id(m), type(m).__name__))

        def post(m, args, output):
            if self.stack:
                self.last = self.stack.pop()

        self.hooks = [
            nn_module.register_module_forward_pre_hook(pre),
            nn_module.register_module_forward_hook(post),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        self.hooks = []
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in _COLLECTIVE_NAMESPACES:
            where = (
                f"in the forward of module '{self.stack[-1]}'"
                if self.stack
                else f"after the forward (in backward or the optimizer step; the last module "
                f"run was '{self.last}')"
                if self.last
                else "in the step"
            )
            raise CollectiveInStep(
                f"the training step runs a collective ({func.name()}) {where}, and this rank "
                "sizes its batch on its own: the ranks try different batches at different times, "
                "so the collective would wait for ranks that never join it (a hang until the "
                "process group's timeout). Size the model without its collectives (the plain "
                "module, not one wrapped in DistributedDataParallel; BatchNorm in place of "
                "SyncBatchNorm, which has the same memory on one rank) and keep world_size= for "
                "the plan"
            )
        return func(*args, **(kwargs or {}))


def refuse_collective_modules(model):
    """UsageError naming a module that always runs a collective in training (SyncBatchNorm, a
    DistributedDataParallel wrapper): refused before any trial, as CollectiveGuard would refuse
    its first step."""
    for name, m in model.named_modules():
        kind = type(m).__name__
        if isinstance(m, torch.nn.SyncBatchNorm) or kind == "DistributedDataParallel":
            raise UsageError(
                f"model: module '{name or kind}' ({kind}) runs collectives in every training step, "
                "and under a world size above 1 each rank sizes its batch on its own, so the "
                "ranks' collectives would not match (a hang until the process group's timeout); "
                "pass the model without it (BatchNorm for SyncBatchNorm: the same memory on one "
                "rank; the module inside DistributedDataParallel, with ddp=True for its buckets)"
            )
