#!/usr/bin/env python3
"""The layers' dependency direction (docs/architecture.md): a file of a lower layer never includes
a header of a higher one, and a module of the Python package never imports one of a higher layer
(PY_LAYERS). Run by scripts/lint.sh; exits 1 naming each violation, each
source file outside the layers' folders, and each include that names no file of the checkout.

A layer is a folder: src/<layer>/ for the sources and private headers, include/autobatch/<layer>/
for the public headers, and the includes name it ("search/search_driver.h",
<autobatch/search/planner.h>), so a file's layer and each include's layer are read from paths.
LAYERS lists them from the bottom up; src/cli/ and src/python/ are the front doors. The public
entry header include/autobatch/autobatch.h sits at the top of include/autobatch/ and belongs to the
layer that implements it (FILE_LAYERS); a few includes are allowed across (ALLOWED), each with its
reason.

Usage: scripts/check_layers.py [--self-test]   (from the checkout; --self-test checks the checker)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

LAYERS = ["vocabulary", "search", "memory", "probes", "run", "reports", "workflows", "front"]
FRONT_FOLDERS = ("cli", "python")
FILE_LAYERS = {
    # the entry header (findMaxBatch, SearchOutcome); src/run/autobatch.cpp implements it
    "include/autobatch/autobatch.h": "run",
}
ALLOWED = {
    # defines autobatch::removeScratchFiles(), which the public entry header declares for
    # launchers (a signal handler's cleanup)
    ("src/memory/scratch_files.cpp", "include/autobatch/autobatch.h"):
        "defines a function autobatch.h declares",
}
# The Python package's layers (src/python/autobatch, docs/architecture.md "The Python package"),
# bottom to top: a module imports only from its own layer or lower ones. `autobatch._core` (the
# compiled extension) is the bottom.
PY_LAYERS = ["types", "measuring", "session", "workflows", "package"]
PY_MODULE_LAYERS = {
    # option checks, errors, result types, the fingerprint, the binding
    "_core": "types", "_errors": "types", "_options": "types", "_option_checks": "types",
    "_result": "types", "_fingerprint": "types", "_step_errors": "types", "_vocabulary": "types",
    # the meters and the trial: one real step under the budget, its state put back
    "_budget": "measuring", "_cuda_api": "measuring", "_meter": "measuring",
    "_batches": "measuring", "_loader": "measuring", "_residue": "measuring", "_replay": "measuring", "_measuring": "measuring",
    "_survivors": "measuring", "_leaks": "measuring", "_state": "measuring", "_fsdp": "measuring",
    "_collectives": "measuring", "_optimizers": "measuring", "_step_output": "measuring",
    "_trial": "measuring", "_eval": "measuring",
    # the search session: find, check_batch, the planner, the ranks' agreement
    "_session": "session", "_find": "session", "_soak": "session", "_check_eval": "session", "_plans": "session",
    "_ranks": "session",
    # the jobs and drop-ins built on a session, and the exports: subpackages _export/
    # and _distributed/ (the sharded and DDP jobs)
    "_distributed": "workflows", "lightning": "workflows", "transformers": "workflows",
    "_export": "workflows",
    # what `import autobatch` gives
    "__init__": "package",
}
PY_PACKAGE = "src/python/autobatch"

# the project's headers only: "layer/name.h" (src/) and <autobatch/...> (include/), not <fmt/...>
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+\.(?:h|inc))[>"]', re.M)


def layer_of(path: str):
    """The layer of a checkout path (src/..., include/autobatch/...), None outside the layers."""
    if path in FILE_LAYERS:
        return FILE_LAYERS[path]
    parts = path.split("/")
    if parts[0] == "include" and len(parts) == 4 and parts[1] == "autobatch":
        folder = parts[2]
    elif parts[0] == "src" and len(parts) >= 3:
        folder = parts[1]
    else:
        return None
    if folder in FRONT_FOLDERS:
        return "front"
    return folder if folder in LAYERS else None


def included_path(path: str, name: str, sources: dict):
    """The checkout path an include names, as the compiler resolves it (beside the including
    file, then src/, then include/), or None when it is no project file (<fmt/...>, tests')."""
    for candidate in (os.path.join(os.path.dirname(path), name), f"src/{name}", f"include/{name}"):
        candidate = os.path.normpath(candidate)
        if candidate in sources:
            return candidate
    return None


def violations(sources: dict) -> list:
    """The problems in ``sources`` (path -> text), one text per misplaced file or upward include."""
    found = []
    for path, text in sorted(sources.items()):
        layer = layer_of(path)
        if layer is None:
            found.append(f"{path}: in no layer's folder; move it into src/<layer>/ (or "
                         f"include/autobatch/<layer>/), docs/architecture.md says which")
            continue
        for name in INCLUDE.findall(text):
            target_path = included_path(path, name, sources)
            if target_path is None:
                if name.startswith("autobatch/") or "/" in name and name.split("/")[0] in LAYERS:
                    found.append(f"{path} includes {name}, which is no file of the checkout")
                continue
            target = layer_of(target_path)
            if (path, target_path) in ALLOWED or target is None:
                continue
            if LAYERS.index(target) > LAYERS.index(layer):
                found.append(f"{path} ({layer}) includes {name} ({target}): a lower layer "
                             f"includes a higher one; move the shared part down, or the file up")
    return found


def python_imports(text: str, module: str = "") -> list:
    """The package modules a module's source imports, as dotted names inside the package:
    `from . import x` and `from .x import y` (resolved from ``module``'s own package: "_export.x"
    inside the subpackage _export, "x" at the top), `from .. import x`, `from autobatch.x import
    y`, `import autobatch.x`, and the package itself (`import autobatch`, `from autobatch import
    y`) as "__init__"."""
    import ast

    package = module.split(".")[:-1]  # "_export._pt2" is in ["_export"]; "_find" in []
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = package[: len(package) - (node.level - 1)] if node.level - 1 <= len(package) \
                else []
            if node.module:
                found.append(".".join(base + node.module.split(".")))
            else:
                found += [".".join(base + [a.name]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "autobatch":
            parts = node.module.split(".")
            found.append(".".join(parts[1:]) if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "autobatch":
                    found.append(".".join(parts[1:]) if len(parts) > 1 else "__init__")
    return found


def python_violations(modules: dict) -> list:
    """The problems in ``modules`` (dotted module name inside the package -> source; a
    subpackage's modules as "_export._pt2", its front door as "_export.__init__"): a module in no
    layer, an import of a package module in no layer, an import of a higher layer, and an import
    of a subpackage's private module from outside it (what a subpackage offers the rest is what its
    __init__ exposes). A subpackage is in one layer, PY_MODULE_LAYERS' entry of its name."""
    found = []
    for module, text in sorted(modules.items()):
        top = module.split(".")[0]
        path = f"{PY_PACKAGE}/{module.replace('.', '/')}.py"
        layer = PY_MODULE_LAYERS.get(top)
        if layer is None:
            found.append(f"{path}: in no layer; add it to PY_MODULE_LAYERS "
                         f"(scripts/check_layers.py) and docs/architecture.md")
            continue
        for name in python_imports(text, module):
            parts = name.split(".")
            target = PY_MODULE_LAYERS.get(parts[0])
            if target is None:
                if any(m.split(".")[0] == parts[0] for m in modules):  # reported above
                    continue
                found.append(f"{path} imports autobatch.{name}, which is no module of the package")
            elif PY_LAYERS.index(target) > PY_LAYERS.index(layer):
                found.append(f"{path} ({layer}) imports {parts[0]} ({target}): a lower layer "
                             f"imports a higher one; move the shared part down")
            elif len(parts) > 1 and parts[0] != top and f"{parts[0]}.__init__" in modules:
                found.append(f"{path} imports {name}, a private module of the subpackage "
                             f"{parts[0]}: import what {parts[0]}/__init__.py exposes")
    return found


def self_test() -> None:
    """Catches a checker that never fails: an upward include, a file outside the folders, an
    include of a missing header and an allowed include must give exactly the first three."""
    found = violations({
        "src/search/planner.cpp": '#include "autobatch/reports/report.h"\n'
                                  '#include "autobatch/vocabulary/units.h"\n',
        "src/brand_new.cpp": '#include "autobatch/vocabulary/units.h"\n',
        "src/memory/scratch_files.cpp": '#include "autobatch/autobatch.h"\n'
                                        '#include "memory/gone.h"\n',
        "src/cli/cli_main.cpp": '#include "autobatch/workflows/cached_search.h"\n',
        "include/autobatch/autobatch.h": "", "include/autobatch/reports/report.h": "",
        "include/autobatch/vocabulary/units.h": "",
        "include/autobatch/workflows/cached_search.h": "",
    })
    assert len(found) == 3, found
    assert found[0].startswith("src/brand_new.cpp: in no layer's folder"), found
    assert found[1].startswith("src/memory/scratch_files.cpp includes memory/gone.h, which is no"), \
        found
    assert found[2].startswith("src/search/planner.cpp (search) includes "
                               "autobatch/reports/report.h (reports)"), found
    py = python_violations({
        "_trial": "from . import _core\nfrom ._find import find\n",
        "_find": "from ._trial import EagerProbe\nimport autobatch._gone\n",
        "_brand_new": "import torch\n",
        "lightning": "import autobatch\nfrom ._export._pt2 import export_pt2\n",
        "_export.__init__": "from ._pt2 import export_pt2\n",
        "_export._pt2": "from .. import _core\nfrom ._step import LOSSES\n",
        "_export._step": "from .._find import find\nfrom autobatch._export import _pt2\n",
    })
    assert len(py) == 5, py
    assert py[0].startswith(f"{PY_PACKAGE}/_brand_new.py: in no layer"), py
    assert py[1].startswith(f"{PY_PACKAGE}/_find.py imports autobatch._gone, which is no"), py
    assert py[2].startswith(f"{PY_PACKAGE}/_trial.py (measuring) imports _find (session)"), py
    assert py[3].startswith(f"{PY_PACKAGE}/lightning.py (workflows) imports __init__ (package)"), \
        py
    assert py[4].startswith(f"{PY_PACKAGE}/lightning.py imports _export._pt2, a private module"), \
        py


def main() -> int:
    self_test()
    if sys.argv[1:] == ["--self-test"]:
        print("check_layers: self-test passed")
        return 0
    paths = subprocess.check_output(["git", "ls-files", "src/*.cpp", "src/*.h", "src/*.inc",
                                     "include/*.h"], text=True).split()
    sources = {p: open(p, encoding="utf-8").read() for p in paths}
    found = violations(sources)
    py_paths = subprocess.check_output(["git", "ls-files", f"{PY_PACKAGE}/*.py"],
                                       text=True).split()
    modules = {p[len(PY_PACKAGE) + 1:-3].replace("/", "."): open(p, encoding="utf-8").read()
               for p in py_paths}
    found += python_violations(modules)
    for text in found:
        print(f"check_layers: {text}")
    if found:
        return 1
    print(f"check_layers: {len(paths)} files in {len(LAYERS)} layers, no include upward "
          f"({' < '.join(LAYERS)}); {len(modules)} Python modules in {len(PY_LAYERS)} layers, "
          f"no import upward ({' < '.join(PY_LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
