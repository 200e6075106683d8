"""The export helpers, for scripts and for checkouts where the package is not installed.

They live in the Python package (the subpackage src/python/autobatch/_export/;
`autobatch.export` and `autobatch.export_pt2` once `pip install --no-build-isolation .` installed
it). This shim loads them from the checkout without the package's __init__ (which needs the built
extension): the folder is registered as a namespace of its own, `_autobatch_source`, and its
_export subpackage (which imports nothing else of autobatch) stands in for this one, so `import
autobatch_export` (with scripts/ on sys.path) and `python scripts/autobatch_export.py ...` keep
working before the package is built (scripts/bootstrap.sh exports the real models that way).
Module attributes set through this name are the subpackage's own (the shim replaces itself in sys.modules); `autobatch_export.SOURCES` lists
the files of the export's code.
"""
import importlib
import os
import sys
import types

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "python", "autobatch")
if "_autobatch_source" not in sys.modules:
    _package = types.ModuleType("_autobatch_source")
    _package.__path__ = [os.path.normpath(_DIR)]
    sys.modules["_autobatch_source"] = _package
_module = importlib.import_module("_autobatch_source._export")
sys.modules["autobatch_export"] = _module

if __name__ == "__main__":
    _module.main()
else:
    sys.modules[__name__] = _module
