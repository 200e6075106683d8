"""The CPU budget allocator, compiled on first use against the torch of this environment.

autobatch._core includes no torch header, so one wheel serves every torch. The budget allocator
is the one part that needs torch's C++ ABI (it implements c10's allocator interface): its sources
are installed with the package (autobatch/_csrc) and compiled here through
torch.utils.cpp_extension the first time a search runs on the CPU, as DeepSpeed builds its ops.
A GPU search never compiles anything.

The build is kept in a cache folder named by what the binary depends on: the module name carries a
hash of the sources, the torch version, torch's C++ ABI flag and the Python version, so an
upgrade of any of them builds afresh and never loads a stale binary. The folder is
$AUTOBATCH_EXTENSIONS_DIR, else $XDG_CACHE_HOME/autobatch/extensions, else
~/.cache/autobatch/extensions. Ranks that start together wait for one another:
torch.utils.cpp_extension holds a lock file in the build folder while one of them compiles.

Until the module is loaded, the queries below answer as an allocator that counted nothing (no
refusals, nothing tracked), so code that asks them on CUDA needs no compiler.
"""

import hashlib
import logging
import os
import shutil
import sys
import threading

import torch

from . import _core

# The sources and include folders under autobatch/_csrc (src/python/CMakeLists.txt installs them).
SOURCES = (
    "src/python/budget_module.cpp",
    "src/memory/cpu_budget.cpp",
    "src/memory/process_memory.cpp",
    "src/memory/cgroup_memory.cpp",
    "src/vocabulary/units.cpp",
    "src/vocabulary/trial.cpp",
)
INCLUDES = ("src", "include")

_lock = threading.Lock()
_module = None


def source_root():
    """The folder holding the budget module's sources: the installed package's _csrc, else (a run
    from the source tree, PYTHONPATH=src/python) the repository."""
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "_csrc")
    if os.path.isdir(installed):
        return installed
    return os.path.abspath(os.path.join(here, "..", "..", ".."))


def cache_root():
    """Where compiled budget modules are kept (see the module's docstring)."""
    explicit = os.environ.get("AUTOBATCH_EXTENSIONS_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autobatch", "extensions")


def module_name(root):
    """autobatch_budget_<hash>: the hash of every .cpp and .h below the include folders (INCLUDES:
    the sources and every header they can reach), the torch version, torch's C++ ABI flag and the
    Python version (sys.implementation's cache tag)."""
    digest = hashlib.sha256()
    walked = (w for d in INCLUDES for w in os.walk(os.path.join(root, d)))
    for folder, _, files in sorted(walked):
        for name in sorted(files):
            if name.endswith((".cpp", ".h")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    digest.update(f"{torch.__version__}|abi{abi}|{sys.implementation.cache_tag}".encode())
    return "autobatch_budget_" + digest.hexdigest()[:16]


_NEEDS = (
    "a search on the CPU: autobatch's CPU budget allocator (which counts every CPU tensor "
    "against the limit) is compiled once for this torch ({torch}) and needs a C++ compiler "
    "(C++20: g++ 11 or clang 14 or newer)"
)
_FIX = (
    "set CXX to one, or install g++: apt-get install g++, or conda install gxx_linux-64. A "
    "search on a GPU needs none"
)


def _compiler():
    """The C++ compiler torch.utils.cpp_extension will run ($CXX, else c++), or an error that says
    what is missing and that only a search on the CPU needs it: a compiler not found, or one that
    does not run (`--version` fails), is named with the fix."""
    import subprocess

    cxx = os.environ.get("CXX", "c++")
    needs = _NEEDS.format(torch=torch.__version__)
    if shutil.which(cxx) is None:
        raise _core.Error(f"{needs}, and {cxx!r} was not found ({_FIX}).")
    try:
        subprocess.run([cxx, "--version"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise _core.Error(f"{needs}, and {cxx!r} does not run ({e}) ({_FIX}).") from None
    return cxx


def _ninja_on_path():
    """torch.utils.cpp_extension runs `ninja` from PATH; the PyPI package ninja (a dependency of
    autobatch) puts it in its BIN_DIR, which is on PATH only inside an activated environment."""
    try:
        import ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + (os.pathsep + path if path else "")


def _import_cpp_extension():
    """torch.utils.cpp_extension without its import-time warning about a missing CUDA runtime
    ("No CUDA runtime is found, using CUDA_HOME=..."): this module is built for the CPU only."""
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


def _import_built(name, build):
    """The module built earlier into `build`, or None (not built, or a file that does not load: an
    interrupted link, which the build then redoes). No compiler and no ninja are needed here."""
    import importlib.util

    path = os.path.join(build, name + ".so")
    if not os.path.isfile(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


def load(verbose=None):
    """The compiled budget module: built on first use (about 15 s on 2 cores; a C++ compiler and
    ninja are needed then), then imported from the cache in a fraction of a second.

    Raises autobatch._core.Error (a UsageError from find) without a working C++ compiler, or when
    the build fails (the compiler's output is printed above the error)."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        root = source_root()
        name = module_name(root)
        build = os.path.join(cache_root(), name)
        _module = _import_built(name, build)
        if _module is not None:
            return _module
        _compiler()
        logging.getLogger("autobatch").warning(
            "autobatch: compiling the CPU budget allocator for torch %s, once (about 15 s; kept "
            "in %s)",
            torch.__version__,
            build,
        )
        cpp_extension = _import_cpp_extension()
        _ninja_on_path()
        os.makedirs(build, exist_ok=True)
        if verbose is None:
            verbose = os.environ.get("AUTOBATCH_VERBOSE_BUILD") == "1"
        try:
            _module = cpp_extension.load(
                name=name,
                sources=[os.path.join(root, s) for s in SOURCES],
                extra_include_paths=[os.path.join(root, d) for d in INCLUDES],
                # C++20 (the sources use it); hidden symbols, so that this module's copies of the
                # library's helpers never bind to _core's.
                extra_cflags=["-O2", "-std=c++20", "-fvisibility=hidden"],
                build_directory=build,
                verbose=verbose,
                with_cuda=False,
            )
        except RuntimeError as e:  # torch's "Error building extension ...": the compiler's words
            raise _core.Error(
                f"{_NEEDS.format(torch=torch.__version__)}, and the build with "
                f"{os.environ.get('CXX', 'c++')!r} failed in {build} (the compiler's output is "
                f"above; AUTOBATCH_VERBOSE_BUILD=1 shows every command): {e}"
            ) from None
        return _module


def loaded():
    """The budget module if this process has loaded it, else None."""
    return _module


def backend(limit_bytes, reserve_bytes):
    """The CPU budget allocator's backend (installed in this process until remove())."""
    return load().Backend.cpu_budget(limit_bytes, reserve_bytes)


# The allocator's queries: as a budget that counted nothing until the module is loaded.
def is_tracked(data_ptr):
    return _module is not None and _module.is_tracked(data_ptr)


def watch_external(weak_storage, nbytes):
    load().watch_external(weak_storage, nbytes)


def refusals():
    return 0 if _module is None else _module.refusals()


def foreign_allocations():
    return (0, 0) if _module is None else _module.foreign_allocations()


def own_peak():
    return (0, 0) if _module is None else _module.own_peak()


def start_allocation_log():
    return 0 if _module is None else _module.start_allocation_log()


def stop_allocation_log():
    return (0, 0, 0) if _module is None else _module.stop_allocation_log()


def stop_allocation_log_events():
    return ([], []) if _module is None else _module.stop_allocation_log_events()


def set_refusal_suffix(suffix):
    load().set_refusal_suffix(suffix)
