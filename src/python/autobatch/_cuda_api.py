"""The CUDA calls of the C++ memory backend (src/memory/cuda_api.h, `CudaApi`), written over
torch.cuda.

The package measures CUDA memory with the same backend as the `autobatch` command
(src/memory/cuda_backend.cpp: the limit, the warm-up before the outside part is read, the re-read
after
every trial, the workspaces cleared, the user's fraction kept and restored, unsupported allocator
settings refused). That backend reaches CUDA only through these calls; here they are torch.cuda's,
so the extension needs neither LibTorch's CUDA headers nor a CUDA toolkit. `_core.Backend.cuda`
calls each method by name, with the GIL held, from the thread that runs the trials.

Every method is a thin call, no decision (the decisions are the backend's). Sources (torch 2.11):
torch/cuda/memory.py (memory_stats' keys, get/set_per_process_memory_fraction, mem_get_info,
get_allocator_backend), c10/util/env.cpp (check_env: "1" is on), c10/cuda/CUDAAllocatorConfig.h
(which variable each key is read from).
"""

import ctypes
import os

import torch

# torch._C._cuda_clearCublasWorkspaces is private (torch 2.11 has no public name for
# at::cuda::clearCublasWorkspaces): used when it exists. Without it the cuBLAS / cuBLASLt
# workspaces (32 MiB per handle and stream on sm_90) stay in the caching allocator after a trial,
# and the backend's "memory back after the search" cannot hold; a torch without it is said so in
# the backend's warnings by the caller (Meter.warnings).
_CLEAR_WORKSPACES = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)


def _conf_value(conf, key):
    """The value of `key` in an allocator configuration "k1:v1,k2:v2" (None when absent)."""
    for item in (conf or "").split(","):
        name, _, value = item.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


class TorchCudaApi:
    """detail::CudaApi over torch.cuda (or over a fake with the same functions, in tests).

    cuda: the module whose functions are called (default torch.cuda).
    environ: the environment the allocator settings are read from (default os.environ).
    init: init(index) creates the caching allocator's state on `index` (default: a one-element
      tensor there, then synchronize).
    clear_workspaces: clears the cuBLAS workspaces (default torch._C._cuda_clearCublasWorkspaces,
      None when this torch has no such function).
    """

    def __init__(self, cuda=None, environ=None, init=None, clear_workspaces=_CLEAR_WORKSPACES):
        self.cuda = cuda if cuda is not None else torch.cuda
        self.environ = environ if environ is not None else os.environ
        self._init = init or self._init_with_a_tensor
        self._clear = clear_workspaces
        self.clears_workspaces = clear_workspaces is not None

    def _init_with_a_tensor(self, index):
        torch.ones(1, device=torch.device("cuda", index))
        self.cuda.synchronize(index)

    def device_count(self):
        try:
            return int(self.cuda.device_count())
        except Exception:  # noqa: BLE001  cudaGetDeviceCount's failure is "no device" (never raises)
            return 0

    def total_global_mem_bytes(self, index):
        return int(self.cuda.get_device_properties(index).total_memory)

    def mem_info(self, index):
        free, total = self.cuda.mem_get_info(index)
        return int(free), int(total)

    def init_allocator(self, index):
        self._init(index)

    def allocator_facts(self):
        env = self.environ
        generic = env.get("PYTORCH_ALLOC_CONF")
        cuda_conf = env.get("PYTORCH_CUDA_ALLOC_CONF")
        # CUDAAllocatorConfig (2.11): generic keys from PYTORCH_ALLOC_CONF first, backend and
        # per_process_memory_fraction from PYTORCH_CUDA_ALLOC_CONF first.
        first_generic = generic if generic is not None else cuda_conf
        first_cuda = cuda_conf if cuda_conf is not None else generic
        expandable = _conf_value(first_generic, "expandable_segments")
        fraction = _conf_value(first_cuda, "per_process_memory_fraction")
        try:
            fraction = float(fraction) if fraction is not None else 1.0
        except ValueError:
            fraction = 1.0  # LibTorch refuses such a value at its first allocation, before us
        return {
            "caching_disabled": env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
            "backend": str(self.cuda.get_allocator_backend()),
            "expandable_segments": (expandable or "").lower() == "true",
            "config_fraction": fraction,
            "pytorch_alloc_conf": generic,
            "pytorch_cuda_alloc_conf": cuda_conf,
        }

    def stats(self, index):
        s = self.cuda.memory_stats(index)
        return {
            "allocated_current_bytes": int(s.get("allocated_bytes.all.current", 0)),
            "allocated_peak_bytes": int(s.get("allocated_bytes.all.peak", 0)),
            "reserved_current_bytes": int(s.get("reserved_bytes.all.current", 0)),
            "reserved_peak_bytes": int(s.get("reserved_bytes.all.peak", 0)),
            "num_alloc_retries": int(s.get("num_alloc_retries", 0)),
            "inactive_split_current_bytes": int(s.get("inactive_split_bytes.all.current", 0)),
            "inactive_split_peak_bytes": int(s.get("inactive_split_bytes.all.peak", 0)),
        }

    def reset_peak_stats(self, index):
        self.cuda.reset_peak_memory_stats(index)

    def memory_fraction(self, index):
        return float(self.cuda.get_per_process_memory_fraction(index))

    def set_memory_fraction(self, fraction, index):
        self.cuda.set_per_process_memory_fraction(float(fraction), index)

    def empty_cache(self):
        self.cuda.empty_cache()

    def clear_cublas_workspaces(self):
        if self._clear is not None:
            self._clear()

    def synchronize(self, index):
        self.cuda.synchronize(index)


def driver_version(load=ctypes.CDLL):
    """The CUDA driver's version as cuDriverGetVersion gives it (e.g. 13000 for 13.0), read from
    the driver library libcuda.so.1 (the CUDA driver API; it needs no cuInit); 0 where there is
    none. torch 2.11 has no Python call for it (torch._C._cuda_getDriverVersion, which the report
    read before, does not exist, so the report's figure was always 0).
    `load`: the library loader (a test's fake)."""
    try:
        library = load("libcuda.so.1")
        version = ctypes.c_int(0)
        status = library.cuDriverGetVersion(ctypes.byref(version))
    except (OSError, AttributeError):
        return 0
    return int(version.value) if status == 0 else 0
