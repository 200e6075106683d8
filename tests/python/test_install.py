"""The package as pip installs it: _core free of torch, the CPU budget allocator compiled on first
use for the torch at hand (autobatch/_budget.py). Each test names the wrong implementation it
catches. Each compile runs in a fresh extension folder of its own (about 15 s on 2 cores)."""
import os
import subprocess
import sys

import pytest
import torch

from autobatch import _budget

FIND = ("import torch, autobatch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))\n"
        "r = autobatch.find(m, torch.randn(1, 64), memory_limit='16MiB', max_batch=64)\n"
        "print('max', r.max_micro_batch)\n")


def run(code, tmp_path, **env):
    full = dict(os.environ, AUTOBATCH_EXTENSIONS_DIR=str(tmp_path / "extensions"), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=full, cwd=tmp_path)


# Catches: a machine without a C++ compiler (or with one that does not run) meeting torch's ninja
# traceback or a CalledProcessError instead of a message that names the compiler, how to get one and that a GPU search needs none; and a cached
# module that still needs a compiler to load (every CPU search of a user who built it once, in a
# container without g++, would fail).
def test_the_budget_module_is_built_once_and_then_needs_no_compiler(tmp_path):
    missing = run(FIND, tmp_path, CXX=str(tmp_path / "no-such-c++"))
    assert missing.returncode != 0
    assert "needs a C++ compiler" in missing.stderr and "no-such-c++" in missing.stderr, \
        missing.stderr
    assert "A search on a GPU needs none" in missing.stderr

    # A compiler that does not run: named, not a CalledProcessError from torch's own check.
    broken = run(FIND, tmp_path, CXX="/bin/false")
    assert broken.returncode != 0
    assert "'/bin/false' does not run" in broken.stderr, broken.stderr

    built = run(FIND, tmp_path)
    assert built.returncode == 0, built.stderr
    assert "compiling the CPU budget allocator for torch" in built.stderr
    first = built.stdout.split()[-1]

    cached = run(FIND, tmp_path, CXX=str(tmp_path / "no-such-c++"), PATH="/nonexistent")
    assert cached.returncode == 0, cached.stderr
    assert "compiling" not in cached.stderr
    assert cached.stdout.split()[-1] == first  # the same search, the same answer


# Catches: a cache key that ignores the torch version, torch's C++ ABI or the sources, so that a
# module built for another torch (an undefined symbol at best, a wrong allocator at worst) or from
# older sources is loaded after an upgrade.
def test_the_cache_key_follows_torch_and_the_sources(tmp_path, monkeypatch):
    root = tmp_path / "csrc"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.cpp").write_text("int a;\n")
    name = _budget.module_name(str(root))
    assert name.startswith("autobatch_budget_")
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    assert _budget.module_name(str(root)) != name
    monkeypatch.undo()
    assert _budget.module_name(str(root)) == name
    monkeypatch.setattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", not torch._C._GLIBCXX_USE_CXX11_ABI)
    assert _budget.module_name(str(root)) != name
    monkeypatch.undo()
    (root / "src" / "a.cpp").write_text("int b;\n")
    assert _budget.module_name(str(root)) != name


# Catches: the installed package without the budget module's sources (a wheel whose install rules
# forgot one: every CPU search fails on a missing file), checked against the list it compiles.
def test_the_installed_package_carries_the_budget_sources():
    root = _budget.source_root()
    for path in _budget.SOURCES:
        assert os.path.isfile(os.path.join(root, path)), path
    for folder in _budget.INCLUDES:
        assert os.path.isdir(os.path.join(root, folder)), folder


# Catches: the queries answered by compiling the module on a machine that never searched on the
# CPU (a GPU user would meet a compile, or a compiler error, for asking "is this tracked?").
def test_the_queries_need_no_module_until_one_is_built(tmp_path):
    code = ("from autobatch import _budget\n"
            "print(_budget.is_tracked(1), _budget.refusals(), _budget.own_peak(),\n"
            "      _budget.stop_allocation_log_events(), _budget.loaded())\n")
    done = run(code, tmp_path, CXX=str(tmp_path / "no-such-c++"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False 0 (0, 0) ([], []) None"
