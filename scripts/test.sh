#!/usr/bin/env bash
# README's test command, the fast tier: bootstrap if needed, configure, build, then every unit and
# integration test that is not labelled slow (ctest -LE slow). The slow tier (pt2 exports and their
# packages, torchrun jobs, the fidelity set, the install and framework-example runs, the newest
# torch) is scripts/test_slow.sh; .ci/run runs both. Prints how long each phase took. Extra
# arguments go to ctest (e.g. -L cpu, -R Search).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
bash "$here/build.sh"
autobatch_ctest_tier "ctest (fast tier)" -LE slow "$@"
echo "[time] test.sh total: $((SECONDS - t0)) s"
