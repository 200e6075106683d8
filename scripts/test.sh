#!/usr/bin/env bash
# README's test command: bootstrap if needed, configure, build, run every test with ctest.
# Prints how long each phase took. Extra arguments go to ctest (e.g. -L cpu, -R Search).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
bash "$here/build.sh"
autobatch_timed "ctest" ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure \
  -j "${AUTOBATCH_JOBS:-$(nproc)}" "$@"
echo "[time] test.sh total: $((SECONDS - t0)) s"
