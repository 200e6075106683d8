#!/usr/bin/env bash
# Bootstrap if needed, configure and build (the shared first half of test.sh and demo.sh).
# Variables: AUTOBATCH_BUILD_DIR (default build/), AUTOBATCH_JOBS (default: cores), Torch_DIR,
# CMAKE_BUILD_TYPE (default RelWithDebInfo), AUTOBATCH_BUILD_TARGETS (default: everything, the
# Python package installed too; scripts/demo.sh builds "autobatch_cli" alone: the library and the
# command, without the tests and the package, issue 41).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"

# ccache shares compiles between clones of the repo (CI builds a fresh clone): paths are taken
# relative to the clone, and the build folder is not hashed (debug info may then name another
# clone's folder).
export CCACHE_BASEDIR="$AUTOBATCH_ROOT" CCACHE_NOHASHDIR=1

autobatch_timed "bootstrap" bash "$here/bootstrap.sh"
torch_prefix="$(autobatch_torch_prefix)"
mkdir -p "$AUTOBATCH_BUILD_DIR"
# A first build says what it is doing and how long it takes (later ones take seconds).
first=0
[ -x "$AUTOBATCH_BUILD_DIR/bin/autobatch" ] || first=1
[ "$first" = 0 ] ||
  echo "build: configuring $AUTOBATCH_BUILD_DIR (CMake and LibTorch's config, seconds)"
# The same definitions serve this configure and the Python package's (below), so that pip's
# configure of the same tree changes no compile flag and rebuilds nothing.
defs=(-DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" -DCMAKE_PREFIX_PATH="$torch_prefix"
      -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DAUTOBATCH_WERROR=ON -DAUTOBATCH_PYTHON="$AUTOBATCH_PYTHON"
      -DAUTOBATCH_BUILD_TESTS=ON -DAUTOBATCH_PYTHON_MODULE=ON -DAUTOBATCH_WITH_TORCH=ON
      -DPython_EXECUTABLE="$AUTOBATCH_PYTHON")
# -U SKBUILD*: the variables pip's configure leaves in the cache (the wheel's install rules).
autobatch_timed "configure" cmake -S "$AUTOBATCH_ROOT" -B "$AUTOBATCH_BUILD_DIR" -G Ninja \
  -U 'SKBUILD*' "${defs[@]}" \
  >"$AUTOBATCH_BUILD_DIR/configure.log" 2>&1 || { cat "$AUTOBATCH_BUILD_DIR/configure.log"; exit 1; }
# ninja prints [done/total] per step.
[ "$first" = 0 ] ||
  echo "build: compiling (${AUTOBATCH_JOBS:-$(nproc)} jobs); the files that include LibTorch" \
       "take 20-50 s each: 1 to 2 minutes on 2 cores the first time (few units), less with a warm ccache"
targets=()
for t in ${AUTOBATCH_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
autobatch_timed "build" cmake --build "$AUTOBATCH_BUILD_DIR" -j "${AUTOBATCH_JOBS:-$(nproc)}" \
  "${targets[@]}"

# The Python package (pyproject.toml: scikit-build-core) installed into the project's environment
# the way a user installs it, pip install --no-build-isolation, on the tree just built: its
# configure repeats the definitions above, so only the wheel is assembled (seconds).
install_package() {
  local log="$AUTOBATCH_BUILD_DIR/pip-install.log" config=() d
  for d in "${defs[@]}"; do config+=(-C "cmake.define.${d#-D}"); done
  config+=(-C "cmake.build-type=${CMAKE_BUILD_TYPE:-RelWithDebInfo}" -C install.strip=true)
  if ! "$AUTOBATCH_PYTHON" -m pip install --no-build-isolation --no-deps --force-reinstall \
       -C build-dir="$AUTOBATCH_BUILD_DIR" "${config[@]}" "$AUTOBATCH_ROOT" >"$log" 2>&1; then
    cat "$log"
    return 1
  fi
}
# Only with the whole tree built: pip's build would build everything else first.
[ ${#targets[@]} -gt 0 ] || autobatch_timed "python package" install_package
