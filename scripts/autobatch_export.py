"""The export helpers, for scripts and for checkouts where the package is not installed.

They live in the Python package (src/python/autobatch/_export.py; `autobatch.export` and
`autobatch.export_pt2` once `pip install --no-build-isolation .` installed it). This shim loads
that file by its path and stands in for it, so `import autobatch_export` (with scripts/ on
sys.path) and `python scripts/autobatch_export.py ...` keep working before the package is built
(scripts/bootstrap.sh exports the real models that way). Module attributes set through this name
are the module's own (the shim replaces itself in sys.modules).
"""
import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "python",
                     "autobatch", "_export.py")
_spec = importlib.util.spec_from_file_location("autobatch_export", _PATH)
_module = importlib.util.module_from_spec(_spec)
sys.modules["autobatch_export"] = _module
_spec.loader.exec_module(_module)

if __name__ == "__main__":
    _module.main()
else:
    sys.modules[__name__] = _module
