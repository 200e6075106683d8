"""The meter of a search: one of the C++ library's memory backends (CPU budget allocator, CUDA),
installed for the search and read by every trial (_trial.py)."""

from . import _budget, _core
from ._cuda_api import TorchCudaApi


class Meter:
    """One of the C++ library's memory backends (src/memory/memory_backend.h) for one search, the
    same
    as the `autobatch` command's: on the CPU the budget allocator, installed in this process (every
    CPU tensor allocated while it is in place is counted, and an allocation above the limit raises
    torch.OutOfMemoryError; storages allocated before it enter as baseline bytes); on CUDA the
    caching allocator's backend (src/memory/cuda_backend.cpp) over torch.cuda (TorchCudaApi): the
    limit
    emulated with the memory fraction, the outside part read after a warm-up step and re-read after
    every trial, the cuBLAS workspaces cleared with the cache, the process's own fraction kept as a
    cap and restored, unsupported allocator settings refused (docs/trial_runner.md)."""

    def __init__(self, backend, reserve_bytes, api=None):
        self.backend = backend
        self.name = backend.name()  # "cpu-budget" or "cuda-caching"
        self.notes = []  # the search's own lines for the result's warnings
        self.reserve_bytes = reserve_bytes
        self.api = api

    @classmethod
    def cpu(cls, limit_bytes, reserve_bytes):
        return cls(_budget.backend(limit_bytes, reserve_bytes), reserve_bytes)

    @classmethod
    def cuda(cls, index, limit_bytes, reserve_bytes, api=None):
        """api: the CUDA calls (default TorchCudaApi over torch.cuda; a fake in tests)."""
        api = api if api is not None else TorchCudaApi()
        return cls(_core.Backend.cuda(api, index, limit_bytes, reserve_bytes), reserve_bytes, api)

    def needs_warm_up(self):
        """True (CUDA) when one step must run before finish_setup: the first kernels load modules
        and create library handles outside the allocator."""
        return self.backend.needs_warm_up()

    def finish_setup(self, untracked_bytes):
        self.backend.finish_setup(untracked_bytes)

    def limit_bytes(self):
        return self.backend.limit_bytes() - self.reserve_bytes

    def limit_source(self):
        return self.backend.limit_source()

    def current_bytes(self):
        """Bytes held by tensors now (CPU: the baseline included; CUDA: allocated)."""
        return self.backend.current_bytes()

    def begin(self):
        self.backend.begin_trial()

    def phase(self, name, size=0, micro=0, step=0):
        """The trial enters phase `name` (host-side: no device synchronize)."""
        self.backend.set_point(name, size, micro, step)

    def end(self):
        self.backend.set_point("idle")
        return self.backend.end_trial()

    def release(self):
        self.backend.release_caches()

    def synchronize(self):
        """Waits for the device's queued work (once per step, for the step time)."""
        self.backend.synchronize()

    def process_limit_near(self, peak_bytes, request_bytes):
        return self.backend.process_limit_near(peak_bytes, request_bytes)

    def mark_poisoned(self):
        """A fatal device error: no device call from here on (the backend's rule)."""
        self.backend.mark_poisoned()

    def poisoned(self):
        return self.backend.installed() and self.backend.poisoned()

    def warnings(self):
        out = list(self.backend.limit_warnings()) + self.notes
        if self.api is not None and not self.api.clears_workspaces:
            out.append(
                "this torch has no torch._C._cuda_clearCublasWorkspaces: the cuBLAS "
                "workspaces stay in the caching allocator after the search"
            )
        return out

    def context(self):
        """The report's RunContext fields that come from the backend (after the trials: the
        warnings and the fraction change with them)."""
        out = {
            "backend": self.name,
            "memory_limit_bytes": self.limit_bytes(),
            "memory_limit_source": self.limit_source(),
            "warnings": self.warnings(),
        }
        if self.name == "cuda-caching":
            out["allocator"] = dict(self.backend.allocator_info())
        return out

    def remove(self):
        """Restores what the backend changed (the CPU allocator; the memory fraction as the
        process had it); makes no device call after a fatal error."""
        self.backend.remove()
