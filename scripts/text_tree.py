"""The text files of the checkout that the text checks read (check_history.py, check_doc_refs.py):
sources, scripts, docs and build files, below the given folders, build trees and caches left out.
Standard library only."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUFFIXES = (".cpp", ".h", ".inc", ".py", ".sh", ".md", ".txt", ".cmake", ".toml")
NAMES = ("CMakeLists.txt",)
SKIP_DIRS = {"__pycache__", "node_modules", "build"}


def checkout_files(folders, files=("README.md", "CONTRIBUTING.md"), leave_out=()):
    """The checkout paths (relative to ROOT, sorted) of `files` that exist and of every text file
    below `folders`, less the paths in `leave_out` (a check's own file, whose examples it must not
    find)."""
    out = [name for name in files if os.path.isfile(os.path.join(ROOT, name))]
    for folder in folders:
        for here, dirs, names in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            for name in names:
                if name.endswith(SUFFIXES) or name in NAMES:
                    out.append(os.path.relpath(os.path.join(here, name), ROOT))
    return sorted(p for p in out if p not in leave_out)
