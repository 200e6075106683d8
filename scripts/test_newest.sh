#!/usr/bin/env bash
# The Python package against the newest torch on the package index (issue 29 item 6; CI runs it
# after scripts/test.sh): a second environment from requirements-newest.txt, kept beside the first
# and keyed by a hash of that file (created once: about 5 GB, a few minutes), the package installed
# into it with pip install --no-build-isolation, the `autobatch` executable included
# (AUTOBATCH_WITH_TORCH=ON: test_export.py runs it; its own build tree, build-newest/, compiled
# against that torch: minutes the first time, seconds with a warm ccache), then the package's
# pytest suite with that Python. Prints each phase's time; exits non-zero on any failure.
# Variables: AUTOBATCH_ENV_ROOT (scripts/env.sh), AUTOBATCH_JOBS (default: cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
t0=$SECONDS
req="$AUTOBATCH_ROOT/requirements-newest.txt"
venv="$AUTOBATCH_ENV_ROOT/venv-newest-$(sha256sum "$req" | cut -c1-12)"
py="$venv/bin/python"
build="$AUTOBATCH_ROOT/build-newest"

make_env() {
  if [ -f "$venv/.autobatch-complete" ]; then
    echo "test_newest: environment ready at $venv"
    return
  fi
  rm -rf "$venv"  # an interrupted install is never taken as ready (the marker is written last)
  mkdir -p "$(dirname "$venv")"
  echo "test_newest: creating $venv from requirements-newest.txt (torch's CUDA wheel, about 5 GB)"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q --progress-bar off -r "$req"
  touch "$venv/.autobatch-complete"
}

install_package() {
  local log="$build.pip-install.log"
  mkdir -p "$build"
  # ccache shares what it can with the first build: the same build type and flags (scripts/build.sh;
  # GCC 12 at -O3, the wheel's default Release, warns falsely (-Wrestrict) inside std::string, and
  # -Werror is on here), while the files that include LibTorch's headers are compiled anew.
  if ! CCACHE_BASEDIR="$AUTOBATCH_ROOT" CCACHE_NOHASHDIR=1 \
       CMAKE_BUILD_PARALLEL_LEVEL="${AUTOBATCH_JOBS:-$(nproc)}" \
       "$py" -m pip install --no-build-isolation --no-deps --force-reinstall \
       -C build-dir="$build" -C cmake.build-type=RelWithDebInfo -C cmake.define.AUTOBATCH_WERROR=ON \
       -C cmake.define.AUTOBATCH_WITH_TORCH=ON \
       "$AUTOBATCH_ROOT" >"$log" 2>&1; then
    tail -n 60 "$log"
    return 1
  fi
  "$py" -c 'import torch, autobatch; print("test_newest: autobatch", autobatch.__version__,
             "built against torch", torch.__version__)'
}

run_tests() {
  # From the build tree, so that nothing is written into the checkout.
  (cd "$build" && "$py" -m pytest -q -p no:cacheprovider "$AUTOBATCH_ROOT"/tests/python/test_*.py)
}

# Not here yet: the pt2 export against this torch (issue 41 asks for a subset of at most 120 s).
# On torch 2.15 it fails at the first package: "InductorError: AttributeError: 'GraphLowering'
# object has no attribute 'additional_star_deps'" (src/python/autobatch/_export.py, run_node's
# patch of Inductor), in `pt2_export_test.py --only mlp` and `--only tied`; `--only
# does_not_export` passes. Fencing those patches by a check of the names they need, with a clear
# refusal, is issue 42 item 3; the subset joins this script with that fix.

autobatch_timed "newest torch: environment" make_env
autobatch_timed "newest torch: package" install_package
autobatch_timed "newest torch: pytest" run_tests
echo "[time] test_newest.sh total: $((SECONDS - t0)) s"
