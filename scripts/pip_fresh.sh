#!/usr/bin/env bash
# The package's source install as a user without root meets it (README, Install): a fresh clone, a
# fresh virtual environment that has torch, and `pip install .` in a private mount namespace where
# the machine looks as it does to a user who cannot apt-get: the Debian development packages the
# command's build uses (fmt, spdlog, cxxopts, nlohmann-json, zlib: headers, CMake configs,
# pkg-config files and the fmt/spdlog shared libraries) and the CUDA toolkit (/usr/local/cuda*,
# the copies of its headers and programs in /usr/local/include and /usr/local/bin on this machine
# kind) are covered by empty mounts, CUDA_HOME / CUDA_PATH / LIBRARY_PATH are unset and nvcc is off
# PATH. zlib's library stays (libz.so.1: Python's zlib module, which pip needs, links it, and
# the libz.so link to it cannot be covered without covering it); its headers and configs go. Then, in the
# same namespace: readelf of the installed _core (the C and C++ runtime only), a real `find` on
# the CPU whose answer fresh-process check_batch confirms (tests/python/helpers/wheel_check.py; the budget
# module compiled there on first use, needing torch's headers and the compiler only), and the
# install again with --no-build-isolation (the build requirements installed first), which must
# still work. Prints wall and CPU time and the load at the start of each step.
#
# The fresh environment takes torch from the project's environment through a .pth file (a torch
# wheel with its CUDA libraries is 3-5 GB; the check is the install, not the download).
# Usage: scripts/pip_fresh.sh [source repo (default: this clone)]
# Needs root (unshare -m, mount); says so and exits 0 where it cannot make the namespace.
# The compiler cache is off (CCACHE_DISABLE=1): a new user has none.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
src="${1:-$AUTOBATCH_ROOT}"
if ! unshare -m --propagation private true 2>/dev/null; then
  echo "pip_fresh: skipped: cannot make a private mount namespace here (needs root: unshare -m)"
  exit 0
fi
work="$(mktemp -d /tmp/autobatch-pip-fresh.XXXXXX)"
echo "pip_fresh: work folder $work"

step() {  # step NAME COMMAND...: runs it, prints wall and CPU seconds and the load before it
  local name="$1" load t0 rc=0
  shift
  load="$(cut -d' ' -f1 /proc/loadavg)"
  t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$work/$name.cpu" "$@" >"$work/$name.log" 2>&1 || rc=$?
  local wall cpu
  wall=$(echo "$(date +%s.%N) - $t0" | bc)
  cpu=$(awk '{print $1 + $2}' "$work/$name.cpu" 2>/dev/null || echo "?")
  printf '[time] %s: wall %.0f s, CPU %s s, load at start %s (exit %d)\n' "$name" "$wall" "$cpu" \
    "$load" "$rc"
  if [ "$rc" -ne 0 ]; then
    tail -40 "$work/$name.log"
    exit "$rc"
  fi
}

git clone -q "$src" "$work/autobatch"
step venv python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$AUTOBATCH_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  >"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-from-elsewhere.pth"

# What the namespace hides, then the command given, inside it.
cat >"$work/hidden.sh" <<'EOF2'
set -euo pipefail
hide() {  # an empty folder over a folder, /dev/null over a file (a link: over what it names)
  local p
  for p in "$@"; do
    if [ -d "$p" ]; then
      [ -L "$p" ] || mount -t tmpfs tmpfs "$p"  # a link to a folder: the folder is in the list
    elif [ -e "$p" ]; then
      mount --bind /dev/null "$p"
    fi
  done
}
lib=/usr/lib/x86_64-linux-gnu
hide /usr/local/cuda*
[ -e /usr/local/include/cuda.h ] && hide /usr/local/include
[ -e /usr/local/bin/nvcc ] && hide /usr/local/bin
hide /usr/include/fmt /usr/include/spdlog /usr/include/cxxopts.hpp /usr/include/nlohmann \
  /usr/include/zlib.h /usr/include/zconf.h "$lib"/cmake/fmt "$lib"/cmake/spdlog \
  /usr/lib/cmake/cxxopts /usr/share/cmake/nlohmann_json "$lib"/libfmt.so* "$lib"/libspdlog.so* \
  "$lib"/libz.a "$lib"/pkgconfig/fmt.pc "$lib"/pkgconfig/spdlog.pc \
  "$lib"/pkgconfig/zlib.pc /usr/share/pkgconfig/cxxopts.pc /usr/share/pkgconfig/nlohmann_json.pc
export PATH="$(echo "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)"
unset CUDA_HOME CUDA_PATH LIBRARY_PATH CUDAToolkit_ROOT
export CCACHE_DISABLE=1
visible=""
command -v nvcc >/dev/null && visible+=" nvcc"
[ -e /usr/local/cuda/include/cuda_runtime.h ] && visible+=" cuda_runtime.h"
[ -e /usr/include/fmt/format.h ] && visible+=" fmt"
[ -e /usr/include/nlohmann/json.hpp ] && visible+=" nlohmann"
[ -s /usr/include/zlib.h ] && visible+=" zlib.h"
for f in "$lib"/libfmt.so* "$lib"/libspdlog.so*; do [ -s "$f" ] && visible+=" $f"; done
if [ -n "$visible" ]; then echo "pip_fresh: still visible:$visible"; exit 1; fi
echo "pip_fresh: hidden: the CUDA toolkit, Debian's fmt, spdlog, cxxopts, nlohmann-json, zlib headers"
"$@"
EOF2
hidden=(unshare -m --propagation private bash "$work/hidden.sh")

cd "$work/autobatch"
step "pip install ." "${hidden[@]}" "$py" -m pip install -v .
echo "pip_fresh: the configure, as pip ran it (CMake's lines):"
grep -E "^ *(-- |CMake Error)" "$work/pip install ..log" | head -20
core="$("$py" -c 'import autobatch._core as c; print(c.__file__)')"
echo "pip_fresh: what _core needs at run time (readelf -d):"
readelf -d "$core" | grep -E "NEEDED|RPATH|RUNPATH"
if readelf -d "$core" | grep -E "NEEDED" | grep -vqE "\[(libstdc\+\+|libgcc_s|libc|libm|ld-linux)"; then
  echo "pip_fresh: _core needs a library beyond the C and C++ runtime"; exit 1
fi
cd "$work"
step "find and check_batch" "${hidden[@]}" env AUTOBATCH_EXTENSIONS_DIR="$work/extensions" \
  OMP_NUM_THREADS=1 "$py" "$work/autobatch/tests/python/helpers/wheel_check.py"
cat "$work/find and check_batch.log"

# --no-build-isolation still works, with the build requirements in the environment.
step "build requirements" "$py" -m pip install -q scikit-build-core pybind11 nlohmann_json \
  cmake ninja
cd "$work/autobatch"
step "pip install --no-build-isolation ." "${hidden[@]}" "$py" -m pip install --no-build-isolation \
  --force-reinstall --no-deps .
echo "pip_fresh: done ($work)"
