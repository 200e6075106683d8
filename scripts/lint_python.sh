#!/usr/bin/env bash
# Lints the Python package (src/python/autobatch) and type-checks the examples against it:
#
#   1. ruff's lint rules (pyproject.toml, [tool.ruff]: pycodestyle, pyflakes, import order,
#      bugbear) and its format check on the whole package, and its D1 rules: every public module, class, method,
#      function and __init__ of the package has a docstring, since the docstrings are the
#      package's API reference (docs/python.md points at them; mkdocstrings renders them).
#      ruff counts every name in a module whose file name starts with "_" as private and never
#      checks it, while autobatch's public names are defined in such modules (autobatch.find is
#      _find.find). So the modules that define what `autobatch` exports (API_MODULES below) are
#      checked again under their public names (through stdin, --stdin-filename), and findings
#      are shown with their real file names. The other private modules (the trial runner, the
#      meters, the budget allocator's binding, ...) hold internal helpers: left out on purpose.
#   2. every function of the package at most 80 lines, its docstring not counted, as the C++
#      (scripts/check_python_functions.py).
#   3. mypy (pyproject.toml, [tool.mypy]): the examples in examples/python against the
#      package's annotations, read from the sources (mypy_path = src/python), never from the
#      copy installed in the project environment, which may be older; torch, Lightning and
#      transformers come from that environment (--python-executable). The package ships
#      py.typed, so this is what a user's mypy sees of it.
#
# The tools come from scripts/tools_env.sh (requirements-docs.txt), the project's Python from
# scripts/env.sh. Their caches go to the build tree. Exit status 0 when all pass.
# Usage: bash scripts/lint_python.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
cd "$AUTOBATCH_ROOT"
py="$(bash "$here/tools_env.sh")"
package=src/python/autobatch
cache="$AUTOBATCH_BUILD_DIR/lint-cache"
mkdir -p "$cache"

# The modules that define the names `autobatch` exports: those autobatch/__init__.py imports
# from (a subpackage: its __init__ and the modules that define what it exposes), and the ones
# they re-export from (_export/_pt2: export_pt2; _fingerprint: fingerprint).
API_MODULES=(_check_eval _errors _find _fingerprint _plans _result _soak
             _distributed/__init__ _distributed/_sharded _distributed/_sharded_result
             _distributed/_layout _distributed/_ddp
             _export/__init__ _export/_torchscript _export/_pt2
             lightning/__init__ lightning/_finder)
for imported in $(sed -n 's/^from \.\(_[a-z0-9_]*\) import .*/\1/p' "$package/__init__.py"); do
  [ -d "$package/$imported" ] && imported="$imported/__init__"
  if [[ " ${API_MODULES[*]} " != *" $imported "* ]]; then
    echo "lint_python.sh: autobatch/__init__.py imports from $imported, which API_MODULES" \
         "does not list; add it there" >&2
    exit 1
  fi
done

failed=0
echo "== ruff: $package (lint; D1 for public modules), then the API modules under their public names"
"$py" -m ruff check --cache-dir "$cache/ruff" "$package" || failed=1
for module in "${API_MODULES[@]}"; do
  # its public name: the leading underscore of each part dropped (_export/_pt2: export/pt2.py)
  public="$package/$(sed -E 's#(^|/)_([a-z])#\1\2#g' <<<"$module").py"
  out="$("$py" -m ruff check --no-cache --output-format concise --stdin-filename "$public" - \
         <"$package/$module.py")" || { failed=1; echo "${out//$public/$package/$module.py}"; }
done

echo "== ruff format: $package (pyproject.toml, [tool.ruff]: 100 columns)"
"$py" -m ruff format --cache-dir "$cache/ruff" --check "$package" || failed=1

echo "== function length: $package (scripts/check_python_functions.py)"
"$py" "$here/check_python_functions.py" --self-test && "$py" "$here/check_python_functions.py" "$package" || failed=1

echo "== mypy: examples/python against $package"
if [ ! -x "$AUTOBATCH_PYTHON" ]; then
  echo "lint_python.sh: no project environment at $AUTOBATCH_VENV (scripts/bootstrap.sh makes" \
       "it); mypy needs its torch, Lightning and transformers" >&2
  exit 1
fi
"$py" -m mypy --cache-dir "$cache/mypy" --python-executable "$AUTOBATCH_PYTHON" || failed=1

if [ "$failed" -ne 0 ]; then
  echo "lint_python.sh: FAILED" >&2
  exit 1
fi
echo "lint_python.sh: ruff and mypy passed"
