#!/usr/bin/env python3
"""The layers' dependency direction (issue 42, docs/architecture.md): a file of a lower layer never
includes a header of a higher one. Run by scripts/lint.sh; exits 1 naming each violation, and each
source file the table below does not place.

A module is a stem (search for src/search.cpp, include/autobatch/search.h); LAYERS lists them
from the bottom up. src/cli/ and src/python/ are the front doors whatever their names. A few
files sit apart from their stem (FILE_LAYERS) and a few includes are allowed across (ALLOWED),
each with its reason.

Usage: scripts/check_layers.py [--self-test]   (from the checkout; --self-test checks the checker)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

LAYERS = [
    ("vocabulary", "units error input_spec training_spec search_options trial failure "
                   "model_metadata name_table os_text version version_text "
                   "zip_members"),
    ("search", "search search_driver search_strategy search_doubling search_guided search_plan "
               "search_finish planner replan"),
    ("memory", "memory_backend cpu_budget cuda_api cuda_backend cuda_runtime cuda_backend_stub "
               "cuda_device cgroup_memory process_memory storage_bytes scratch_files "
               "stderr_capture"),
    ("probes", "model_format trial_runner step_program torchscript_step pt2_step pt2_package "
               "pt2_archive pt2_metadata optimizers trial_inputs trial_plan trial_classification "
               "failure_torch runner_checks weight_snapshot rng_state_guard step_progress "
               "trained_parameters eval_lifetimes"),
    ("run", "autobatch eval_options result_cache bucket_mix ranks rank_group rank_agreement "
            "workflow_budget"),
    ("reports", "report report_internal report_json report_text report_env report_file"),
    ("workflows", "cached_search cached_search_runner length_sweep fleet fleet_sizes fleet_gpus"),
    ("front", ""),
]
FOLDER_LAYERS = {"src/cli/": "front", "src/python/": "front"}
FILE_LAYERS = {
    # fills the public BuildInfo from LibTorch and the CUDA runtime (cuda_device.h); the
    # vocabulary's half of it, with no LibTorch, is version_text.cpp
    "src/version.cpp": "memory",
}
ALLOWED = {
    # defines autobatch::removeScratchFiles(), which the public entry header declares for
    # launchers (a signal handler's cleanup)
    ("src/scratch_files.cpp", "autobatch"): "defines a function autobatch.h declares",
}
ORDER = [name for name, _ in LAYERS]
MODULE_LAYER = {stem: name for name, stems in LAYERS for stem in stems.split()}
# the project's headers only: "name.h" (src/) and <autobatch/name.h> (include/), not <fmt/...>
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]((?:autobatch/)?[A-Za-z0-9_]+)\.(?:h|inc)[>"]', re.M)


def stem(path: str) -> str:
    return re.sub(r"\.(cpp|h|inc)$", "", os.path.basename(path))


def layer_of(path: str):
    if path in FILE_LAYERS:
        return FILE_LAYERS[path]
    for folder, layer in FOLDER_LAYERS.items():
        if path.startswith(folder):
            return layer
    return MODULE_LAYER.get(stem(path))


def violations(sources: dict) -> list:
    """The problems in ``sources`` (path -> text), one text per unplaced file or upward include."""
    found = []
    for path, text in sorted(sources.items()):
        layer = layer_of(path)
        if layer is None:
            found.append(f"{path}: in no layer; add its stem to LAYERS in scripts/check_layers.py "
                         f"(docs/architecture.md says which)")
            continue
        for included in INCLUDE.findall(text):
            target = MODULE_LAYER.get(os.path.basename(included))
            if target is None or (path, os.path.basename(included)) in ALLOWED:
                continue
            if ORDER.index(target) > ORDER.index(layer):
                found.append(f"{path} ({layer}) includes {included} ({target}): a lower layer "
                             f"includes a higher one; move the shared part down, or the file up")
    return found


def self_test() -> None:
    """Catches a checker that never fails: an upward include, an unplaced file and an allowed
    include must give exactly the first two."""
    found = violations({
        "src/planner.cpp": '#include "autobatch/report.h"\n#include "autobatch/units.h"\n',
        "src/brand_new.cpp": '#include "autobatch/units.h"\n',
        "src/scratch_files.cpp": '#include "autobatch/autobatch.h"\n',
        "src/cli/main.cpp": '#include "autobatch/cached_search.h"\n',
    })
    assert len(found) == 2, found
    assert found[0].startswith("src/brand_new.cpp: in no layer"), found
    assert found[1].startswith("src/planner.cpp (search) includes autobatch/report (reports)"), \
        found


def main() -> int:
    self_test()
    if sys.argv[1:] == ["--self-test"]:
        print("check_layers: self-test passed")
        return 0
    paths = subprocess.check_output(["git", "ls-files", "src/*.cpp", "src/*.h", "src/*.inc",
                                     "include/*.h"], text=True).split()
    sources = {p: open(p, encoding="utf-8").read() for p in paths}
    found = violations(sources)
    for text in found:
        print(f"check_layers: {text}")
    if found:
        return 1
    print(f"check_layers: {len(paths)} files in {len(ORDER)} layers, no include upward "
          f"({' < '.join(ORDER)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
