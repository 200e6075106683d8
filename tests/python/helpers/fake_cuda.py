"""A fake of the torch.cuda functions the package's CudaApi calls (autobatch/_cuda_api.py), with
the behaviour of tests/support/fake_cuda.h (the C++ tests' fake CudaApi) written once more in torch.cuda's
terms: the caching allocator's fraction is of totalGlobalMem and refuses a segment that would take
reserved bytes past it; cuBLAS keeps a 32 MiB workspace inside the allocator until it is cleared;
the outside part grows at the first kernel of each kind; expandable segments map 20 MiB pages; a
configured per_process_memory_fraction is the allocator's fraction from the start; a sticky device
error makes every later call raise it again. Counts the calls a test asks about (synchronize,
set_per_process_memory_fraction)."""
import types

# The allocator configuration is read as the package reads it (LibTorch's parsing is not what the
# tests check: the scenarios give the configuration the backend then sees).
from autobatch._cuda_api import _conf_value

MiB = 1 << 20
GiB = 1 << 30
PAGE = 20 * MiB
WORKSPACE = 32 * MiB
STICKY = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
          "reported at some other API call, so the stacktrace below might be incorrect.\n"
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


class FakeOutOfMemory(RuntimeError):
    pass


class FakeCuda:
    """One device (index 0) and its caching allocator, in bytes."""

    def __init__(self, total_global=150 * GiB, meminfo_total=None, context_at_init=500 * MiB,
                 preset_fraction=1.0, env=None, allocator_backend="native"):
        self.total_global = total_global
        self.meminfo_total = meminfo_total if meminfo_total is not None else total_global - 768 * MiB
        self.context_at_init = context_at_init
        self.env = dict(env or {})
        self.allocator_backend = allocator_backend
        self.context = self.allocated = self.cached = self.workspace = 0
        self.allocated_peak = self.reserved_peak = 0
        # Of `cached`, the free remainders of split blocks (inactive split), their peak, and the
        # allocator's retries after a refusal (tests/support/fake_cuda.h, the same rules).
        self.inactive_split = self.inactive_split_peak = self.retries = 0
        self.fraction = preset_fraction
        generic = self.env.get("PYTORCH_ALLOC_CONF", self.env.get("PYTORCH_CUDA_ALLOC_CONF"))
        cuda = self.env.get("PYTORCH_CUDA_ALLOC_CONF", self.env.get("PYTORCH_ALLOC_CONF"))
        self.expandable = (_conf_value(generic, "expandable_segments") or "").lower() == "true"
        configured = _conf_value(cuda, "per_process_memory_fraction")
        if configured is not None and float(configured) < 1.0:
            self.fraction = float(configured)  # LibTorch applies it when the allocator starts
        self.initialised = self.sticky = False
        self.kernels = set()
        self.calls = {"synchronize": 0, "set_per_process_memory_fraction": 0}

    # ---- the device, as a trial drives it ----
    def reserved(self):
        return self.allocated + self.workspace + self.cached

    def used(self):
        return self.context + self.reserved()

    def _peaks(self):
        self.allocated_peak = max(self.allocated_peak, self.allocated + self.workspace)
        self.reserved_peak = max(self.reserved_peak, self.reserved())
        self.inactive_split_peak = max(self.inactive_split_peak, self.inactive_split)

    def allocate(self, n):
        """Split remainders serve no request; refused, the allocator frees its unsplit cached
        blocks and tries again (a retry), as c10's caching allocator does."""
        assert self.initialised, "allocator used before init"
        usable = self.cached - self.inactive_split
        if usable >= n:
            self.cached -= n
        else:
            need = n - usable
            cap = int(self.fraction * self.total_global)
            if self.fraction < 1.0 and self.reserved() + need > cap and usable > 0:
                self.retries += 1
                self.cached -= usable
                usable, need = 0, n
            if self.fraction < 1.0 and self.reserved() + need > cap:
                raise FakeOutOfMemory(f"CUDA out of memory. Tried to allocate {n} bytes")
            mapped = -(-need // PAGE) * PAGE if self.expandable else need
            self.cached = max(self.cached + mapped - need - usable, self.inactive_split)
        self.allocated += n
        self._peaks()

    def split(self, n, block):
        """A request of n served by splitting a cached block: the rest stays cached, split."""
        assert self.cached - self.inactive_split >= block >= n, "no such block"
        self.cached -= n
        self.allocated += n
        self.inactive_split += block - n
        self._peaks()

    def release_split(self, n, block):
        self.allocated -= n
        self.cached += n
        self.inactive_split -= block - n

    def release(self, n):
        self.allocated -= n
        self.cached += n

    def fill(self, request):
        """Allocates `request` bytes at a time until refused, frees them; the largest usage."""
        held, worst = 0, self.used()
        try:
            while True:
                self.allocate(request)
                held += request
                worst = max(worst, self.used())
        except FakeOutOfMemory:
            pass
        self.release(held)
        return worst

    def kernel(self, kind, module_bytes):
        if kind not in self.kernels:
            self.kernels.add(kind)
            self.context += module_bytes
        if kind == "matmul" and self.workspace == 0:
            self.workspace = WORKSPACE
            self._peaks()

    def _touch(self):
        if self.sticky:
            raise RuntimeError(STICKY)

    # ---- torch.cuda's functions ----
    def device_count(self):
        return 1

    def get_device_properties(self, index):
        return types.SimpleNamespace(total_memory=self.total_global, name="Fake GPU", major=9,
                                     minor=0)

    def mem_get_info(self, index):
        self._touch()
        return self.meminfo_total - self.used(), self.meminfo_total

    def init(self, index):
        if not self.initialised:
            self.context += self.context_at_init
        self.initialised = True

    def get_allocator_backend(self):
        return self.allocator_backend

    def memory_stats(self, index):
        assert self.initialised, "did you call init?"
        return {"allocated_bytes.all.current": self.allocated + self.workspace,
                "allocated_bytes.all.peak": self.allocated_peak,
                "reserved_bytes.all.current": self.reserved(),
                "reserved_bytes.all.peak": self.reserved_peak,
                "num_alloc_retries": self.retries,
                "inactive_split_bytes.all.current": self.inactive_split,
                "inactive_split_bytes.all.peak": self.inactive_split_peak}

    def reset_peak_memory_stats(self, index):
        self.allocated_peak = self.allocated + self.workspace
        self.reserved_peak = self.reserved()
        self.inactive_split_peak = self.inactive_split

    def get_per_process_memory_fraction(self, index):
        return self.fraction

    def set_per_process_memory_fraction(self, fraction, index):
        self._touch()
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.fraction = fraction
        self.calls["set_per_process_memory_fraction"] += 1

    def empty_cache(self):  # split blocks stay: only whole cached blocks are released
        self._touch()
        self.cached = self.inactive_split

    def clear_workspaces(self):
        self._touch()
        self.workspace = 0

    def synchronize(self, index=None):
        self._touch()
        self.calls["synchronize"] += 1


def api_over(fake, clear_workspaces=True):
    """The package's CudaApi over `fake`."""
    from autobatch._cuda_api import TorchCudaApi
    return TorchCudaApi(cuda=fake, environ=fake.env, init=fake.init,
                        clear_workspaces=fake.clear_workspaces if clear_workspaces else None)
