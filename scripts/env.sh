# shellcheck shell=bash
# Sourced by the other scripts: where the project's Python environment, LibTorch and the build live.
#
#   AUTOBATCH_VENV       the Python environment (default: $AUTOBATCH_ENV_ROOT/venv-<hash of
#                        requirements.txt>, so a fresh clone finds it again and a changed
#                        requirements file gives a fresh one)
#   AUTOBATCH_ENV_ROOT   where such environments are kept (default: ~/.cache/autobatch)
#   Torch_DIR            a LibTorch of your own (the folder holding TorchConfig.cmake); when set,
#                        the build uses it and the Python environment only exports models
#   AUTOBATCH_BUILD_DIR  the CMake build tree (default: build/ in the clone)
AUTOBATCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AUTOBATCH_ENV_ROOT="${AUTOBATCH_ENV_ROOT:-${HOME:-/root}/.cache/autobatch}"
_ab_req_hash="$(sha256sum "$AUTOBATCH_ROOT/requirements.txt" | cut -c1-12)"
AUTOBATCH_VENV="${AUTOBATCH_VENV:-$AUTOBATCH_ENV_ROOT/venv-$_ab_req_hash}"
AUTOBATCH_BUILD_DIR="${AUTOBATCH_BUILD_DIR:-$AUTOBATCH_ROOT/build}"
AUTOBATCH_PYTHON="$AUTOBATCH_VENV/bin/python"
export AUTOBATCH_ROOT AUTOBATCH_ENV_ROOT AUTOBATCH_VENV AUTOBATCH_BUILD_DIR AUTOBATCH_PYTHON

# The CMake prefix that holds LibTorch: Torch_DIR when the user has one, else the environment's wheel.
autobatch_torch_prefix() {
  if [ -n "${Torch_DIR:-}" ]; then
    echo "$Torch_DIR"
  else
    "$AUTOBATCH_PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'
  fi
}

# Prints "<label> took N s" for the phase timing that test.sh and CI show.
autobatch_timed() {
  local label="$1"; shift
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  echo "[time] $label: $((SECONDS - t0)) s (exit $rc)"
  return $rc
}

# One test tier's ctest run (scripts/test.sh, scripts/test_slow.sh), timed:
#   autobatch_ctest_tier LABEL [CTEST ARGS...]
# One job per core (AUTOBATCH_JOBS, default: cores), each with one OpenMP thread unless the caller
# set OMP_NUM_THREADS: LibTorch's and OpenMP's pools of every job on top of the jobs
# oversubscribe the cores (2 cores: the four heaviest tests took 387 s beside each other with the
# default pools, 190 s with one thread each). The job count is read first: nproc follows
# OMP_NUM_THREADS.
autobatch_ctest_tier() {
  local label="$1"; shift
  local jobs="${AUTOBATCH_JOBS:-$(nproc)}"
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" autobatch_timed "$label" \
    ctest --test-dir "$AUTOBATCH_BUILD_DIR" --output-on-failure -j "$jobs" "$@"
}

# Configures a clang-14 Debug build tree for the sanitizer and fuzz scripts, printing its time; the
# CMake output goes to DIR/configure.log, shown only when it fails.
#   autobatch_clang_configure LABEL DIR CXXFLAGS LDFLAGS [CMAKE ARGS...]
autobatch_clang_configure() {
  local label="$1" dir="$2" cxxflags="$3" ldflags="$4"
  shift 4
  local t0=$SECONDS
  mkdir -p "$dir"
  if ! cmake -S "$AUTOBATCH_ROOT" -B "$dir" -G Ninja \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$ldflags" "$@" >"$dir/configure.log" 2>&1; then
    cat "$dir/configure.log"
    echo "[time] $label: $((SECONDS - t0)) s (exit 1)"
    return 1
  fi
  echo "[time] $label: $((SECONDS - t0)) s (exit 0)"
}
