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
# ctest runs one test per core side by side; LibTorch's and OpenMP's thread pools of each on top
# oversubscribe the cores (2 cores: the four heaviest tests took 387 s beside each other with the
# default pools, 190 s with one thread each). A value the caller set is kept. The job count is
# taken first: nproc follows OMP_NUM_THREADS.
export AUTOBATCH_JOBS="${AUTOBATCH_JOBS:-$(nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
bash "$here/build.sh"
autobatch_timed "ctest (fast tier)" ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure \
  -j "$AUTOBATCH_JOBS" -LE slow "$@"
echo "[time] test.sh total: $((SECONDS - t0)) s"
