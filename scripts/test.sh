#!/usr/bin/env bash
# README's test command: bootstrap if needed, configure, build, run every test with ctest.
# Prints how long each phase took. Extra arguments go to ctest (e.g. -L cpu, -R Search).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
bash "$here/build.sh"
# The pt2 packages the tests use (issue 19): built here, timed, so their cost shows on its own
# line; cached under the environment root (cold about a minute on 2 cores, warm seconds).
autobatch_timed "pt2 packages" bash -c '"$0" "$1" @tests >/dev/null' \
  "$AUTOBATCH_PYTHON" "$here/pt2_packages.py"
autobatch_timed "ctest" ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure \
  -j "${AUTOBATCH_JOBS:-$(nproc)}" "$@"
echo "[time] test.sh total: $((SECONDS - t0)) s"
