#!/usr/bin/env bash
# The ONE device call of a lent GPU machine (issue 39, item 4; docs/trial_runner.md, "A lent GPU
# machine"): the C++ checks and the Python package's checks in one call of at most 420 s, the
# build made once.
#
#   here, first:   bash scripts/device/prepare.sh        (.debs/root and .debs/wheels, ignored)
#   device tool:   run(command="bash scripts/device/gpu.sh", carry=[".debs"], timeout_s=420)
#
# Phases, each timed ("[time] ..." lines, also in a CPU dry run):
#   tools      scikit-build-core, pybind11, pytest from .debs/wheels into the image's Python, so
#              that check.sh's configure builds the extension as well
#   check.sh   env, build (everything, into build-device/), ctest -L gpu, the CLI jobs with their
#              fresh-process checks (summary.txt)
#   python.sh  pip install --no-build-isolation . from build-device/ (configured with the same
#              definitions: only the wheel is assembled), then tests/python/test_cuda.py
#              (its lines appended to summary.txt; $OUT holds 8 files, the device tool's most)
# AUTOBATCH_DEVICE_SECONDS (default 400) is the whole call's budget: check.sh gets
# AUTOBATCH_DEVICE_CHECK_SHARE percent of it (default 55), python.sh what is left (about 180 s:
# the install from the configured tree, and test_cuda.py's 20 or so fresh processes, each
# importing torch and starting CUDA). Exit 0 only when both scripts pass. The other variables are
# check.sh's and python.sh's.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
total="${AUTOBATCH_DEVICE_SECONDS:-400}"
python="${AUTOBATCH_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
t0=$SECONDS
t=$SECONDS
if [ -d "$root/.debs/wheels" ]; then
  timeout 60 "$python" -m pip install -q --no-index --find-links "$root/.debs/wheels" \
    scikit-build-core pybind11 pytest || echo "tools: pip install from .debs/wheels failed"
else
  echo "tools: $root/.debs/wheels missing (scripts/device/prepare.sh); the extension is not built"
fi
echo "[time] tools: $((SECONDS - t)) s"
t=$SECONDS
AUTOBATCH_DEVICE_SECONDS=$(((total - (SECONDS - t0)) * ${AUTOBATCH_DEVICE_CHECK_SHARE:-55} / 100)) \
  bash "$root/scripts/device/check.sh"
check=$?
echo "[time] check.sh: $((SECONDS - t)) s (exit $check)"
t=$SECONDS
AUTOBATCH_DEVICE_SECONDS=$((total - (SECONDS - t0))) bash "$root/scripts/device/python.sh"
package=$?
echo "[time] python.sh: $((SECONDS - t)) s (exit $package)"
echo "[time] gpu.sh total: $((SECONDS - t0)) s"
[ "$check" = 0 ] && [ "$package" = 0 ]
