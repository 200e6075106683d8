#!/usr/bin/env bash
# The Python package's install as a new user does it (issue 41, docs/python.md "Install"): a
# fresh clone, a fresh virtual environment with the default torch wheel from PyPI (built for CUDA),
# and `pip install --no-build-isolation .` with no CUDA toolkit to be found: in a private mount
# namespace the toolkit's folders (/usr/local/cuda*, and the copies of its headers and programs in
# /usr/local/include and /usr/local/bin on this machine kind) are covered by empty tmpfs mounts,
# CUDA_HOME / CUDA_PATH / LIBRARY_PATH are unset and nvcc is off PATH. CMake's FindCUDAToolkit
# searches /usr/local/cuda even off PATH, so hiding it from PATH alone proves nothing.
# Then a torch upgrade is simulated (torch's headers touched) and the install repeated from the
# same clone: only the file that needs torch's ABI recompiles. Prints wall and CPU time and the
# load at the start of each step; keeps the logs in the work folder it names.
# Usage: scripts/pip_fresh.sh [source repo (default: this clone)]   Needs root (unshare, mount).
# The compiler cache is off (CCACHE_DISABLE=1): a new user has none.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${1:-$(cd "$here/.." && pwd)}"
work="$(mktemp -d /tmp/autobatch-pip-fresh.XXXXXX)"
echo "pip_fresh: work folder $work"
# Versions as requirements.txt pins them.
pin() { grep -E "^$1==" "$src/requirements.txt"; }

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
step "torch install" "$py" -m pip install -q "$(pin torch)" "$(pin scikit-build-core)" \
  "$(pin pybind11)" pytest

# The install with the CUDA toolkit hidden.
cat >"$work/hidden.sh" <<EOF
set -euo pipefail
for d in /usr/local/cuda*; do [ -d "\$d" ] && [ ! -L "\$d" ] && mount -t tmpfs tmpfs "\$d"; done
[ -e /usr/local/include/cuda.h ] && mount -t tmpfs tmpfs /usr/local/include
[ -e /usr/local/bin/nvcc ] && mount -t tmpfs tmpfs /usr/local/bin
export PATH="\$(echo "\$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)"
unset CUDA_HOME CUDA_PATH LIBRARY_PATH CUDAToolkit_ROOT
export CCACHE_DISABLE=1
if command -v nvcc >/dev/null || [ -e /usr/local/cuda/include/cuda_runtime.h ]; then
  echo "pip_fresh: the CUDA toolkit is still visible"; exit 1
fi
echo "pip_fresh: no nvcc on PATH, /usr/local/cuda empty"
cd "$work/autobatch"
"$py" -m pip install -v --no-build-isolation --no-deps .
EOF
step "pip install" unshare -m --propagation private bash "$work/hidden.sh"
echo "pip_fresh: the configure, as pip ran it (CMake's lines):"
grep -E "^ *(-- |CMake Error)" "$work/pip install.log" | head -40
if grep -v "^pip_fresh:" "$work/pip install.log" | grep -qi "CUDAToolkit\|nvcc"; then
  echo "pip_fresh: the log names CUDAToolkit or nvcc:"
  grep -v "^pip_fresh:" "$work/pip install.log" | grep -i "CUDAToolkit\|nvcc" | head
fi

cat >"$work/check.py" <<'EOF'
import torch, autobatch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
r = autobatch.find(model, torch.randn(1, 256), memory_limit="64MiB")
print("pip_fresh: autobatch.find:", r.status, "max", r.max_micro_batch, "safe", r.safe_micro_batch,
      "trials", len(r.trials))
print(autobatch._core.version().strip())
EOF
cd "$work"
step "first find" "$py" "$work/check.py"
cat "$work/first find.log"

# A torch upgrade, simulated: every header of torch newer than the build. Only the file compiled
# against torch's headers (cpu_budget.cpp) and the link of _core should run again.
find "$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))')/include" -name '*.h' \
  -exec touch {} +
step "pip install after a torch upgrade" unshare -m --propagation private bash "$work/hidden.sh"
echo "pip_fresh: what ninja ran again:"
grep -E "^ *\[[0-9]+/[0-9]+\] (Building|Linking)" "$work/pip install after a torch upgrade.log" || true
echo "pip_fresh: done ($work)"
