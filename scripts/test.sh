#!/usr/bin/env bash
# README's test command: bootstrap if needed, configure, build, run every test with ctest.
# Prints how long each phase took. Extra arguments go to ctest (e.g. -L cpu, -R Search).
# Variables: AUTOBATCH_BUILD_DIR (default build/), AUTOBATCH_JOBS (default: cores), Torch_DIR.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS

autobatch_timed "bootstrap" bash "$here/bootstrap.sh"
torch_prefix="$(autobatch_torch_prefix)"
jobs="${AUTOBATCH_JOBS:-$(nproc)}"

autobatch_timed "configure" cmake -S "$AUTOBATCH_ROOT" -B "$AUTOBATCH_BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DAUTOBATCH_WERROR=ON \
  -DAUTOBATCH_PYTHON="$AUTOBATCH_PYTHON" >"$AUTOBATCH_BUILD_DIR.configure.log" 2>&1 \
  || { cat "$AUTOBATCH_BUILD_DIR.configure.log"; exit 1; }
autobatch_timed "build" cmake --build "$AUTOBATCH_BUILD_DIR" -j "$jobs"
autobatch_timed "ctest" ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure -j "$jobs" "$@"
echo "[time] test.sh total: $((SECONDS - t0)) s"
