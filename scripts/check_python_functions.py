#!/usr/bin/env python3
"""The Python package's function-length rule, as the C++ one (docs/architecture.md, STYLE.md: a
function over 80 lines is split): every function and method in src/python/autobatch has a body of
at most MAX_LINES lines, its signature and docstring not counted (the public functions' docstrings
are the API reference and run long on purpose, and a formatted signature of many keyword
arguments takes a line each). Run by scripts/lint_python.sh; exits 1
naming each function over the limit, longest first.

Usage: scripts/check_python_functions.py [--self-test] [FOLDER]   (from the checkout)
"""
from __future__ import annotations

import ast
import os
import sys

MAX_LINES = 80


def long_functions(source: str, path: str, limit: int = MAX_LINES):
    """(lines, path, line, name) of each function in ``source`` whose body, docstring left out,
    has over ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str) and len(body) > 1:
            body = body[1:]  # the docstring
        lines = node.end_lineno - body[0].lineno + 1
        if lines > limit:
            found.append((lines, path, node.lineno, node.name))
    return found


def self_test() -> int:
    """The checker on made-up sources: catches a long body, not a long docstring or signature."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES + 1))
    doc = '    """' + "\n".join("    text" for _ in range(200)) + '"""\n'
    signature = "def h(\n" + "".join(f"    a{i}=None,\n" for i in range(200)) + "):\n"
    long_body = long_functions(f"def f():\n{body}\n", "long.py")
    long_doc = long_functions(f"def g():\n{doc}    return 1\n", "doc.py")
    long_signature = long_functions(f"{signature}    return 1\n", "signature.py")
    ok = [n for _, _, _, n in long_body] == ["f"] and long_doc == [] and long_signature == []
    print("check_python_functions self-test:",
          "ok" if ok else f"FAIL {long_body} {long_doc} {long_signature}")
    return 0 if ok else 1


def main(argv) -> int:
    if "--self-test" in argv:
        return self_test()
    folder = next((a for a in argv if not a.startswith("-")), "src/python/autobatch")
    found = []
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    found += long_functions(f.read(), path)
    for lines, path, line, name in sorted(found, reverse=True):
        print(f"{path}:{line}: {name} has {lines} lines (docstring not counted); split it to "
              f"{MAX_LINES} or fewer")
    if not found:
        print(f"check_python_functions: every function in {folder} has {MAX_LINES} lines or fewer")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
