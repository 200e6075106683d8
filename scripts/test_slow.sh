#!/usr/bin/env bash
# The slow tier (README; issue 41 item 2), after scripts/test.sh: the pt2 packages the tests use
# (scripts/pt2_packages.py, cached under the environment root: about a minute cold on 2 cores,
# seconds warm), every ctest labelled slow (ctest -L slow: the pt2 export and pt2 format tests,
# the multi-rank CLI runs and the package's torchrun jobs, the fidelity set, the install test, the
# framework examples), then the Python package against the newest torch (scripts/test_newest.sh).
# Prints each phase's time; exits non-zero on any failure. Extra arguments go to ctest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
# ctest runs one test per core side by side; LibTorch's and OpenMP's thread pools of each on top
# oversubscribe the cores (2 cores: the four heaviest tests took 387 s beside each other with the
# default pools, 190 s with one thread each). A value the caller set is kept. The job count is
# taken first: nproc follows OMP_NUM_THREADS.
export AUTOBATCH_JOBS="${AUTOBATCH_JOBS:-$(nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
bash "$here/build.sh"
autobatch_timed "pt2 packages" bash -c '"$0" "$1" @tests >/dev/null' \
  "$AUTOBATCH_PYTHON" "$here/pt2_packages.py"
autobatch_timed "ctest (slow tier)" ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure \
  -j "$AUTOBATCH_JOBS" -L slow --no-tests=error "$@"
bash "$here/test_newest.sh"
echo "[time] test_slow.sh total: $((SECONDS - t0)) s"
