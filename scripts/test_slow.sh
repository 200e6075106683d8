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
bash "$here/build.sh"
autobatch_timed "pt2 packages" bash -c '"$0" "$1" @tests >/dev/null' \
  "$AUTOBATCH_PYTHON" "$here/pt2_packages.py"
autobatch_ctest_tier "ctest (slow tier)" -L slow --no-tests=error "$@"
bash "$here/test_newest.sh"
# One wheel for every torch (after test_newest.sh, whose environment it reuses), and the source
# install with the Debian development packages hidden (README, Install).
autobatch_timed "wheel check" bash "$here/wheel_check.sh" --tests
autobatch_timed "pip fresh" bash "$here/pip_fresh.sh"
echo "[time] test_slow.sh total: $((SECONDS - t0)) s"
