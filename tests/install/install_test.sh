#!/usr/bin/env bash
# The C++ package as a launcher meets it: install into a fresh prefix, check the layout, run the
# installed CLI (RPATH, no LD_LIBRARY_PATH), build examples/launcher against the prefix with
# find_package(autobatch), and run it on a tiny exported model on the CPU under a small budget.
# Usage: install_test.sh BUILD_DIR WORK_DIR TORCH_DIR PYTHON SOURCE_DIR
set -euo pipefail
build="$1" work="$2" torch_dir="$3" python="$4" src="$5"
prefix="$work/prefix"
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/autobatch lib/libautobatch.so include/autobatch/autobatch.h \
         include/autobatch/search/planner.h lib/cmake/autobatch/autobatchConfig.cmake \
         lib/cmake/autobatch/autobatchConfigVersion.cmake lib/cmake/autobatch/autobatchTargets.cmake \
         lib/cmake/autobatch/AutobatchTorch.cmake; do
  [ -e "$prefix/$f" ] || fail "missing $f in the install prefix"
done
# Only LibTorch may be named by the exported target (no build-only interface targets).
if grep -E 'autobatch_(warnings|logging|core)|fmt::|nlohmann|spdlog' \
     "$prefix/lib/cmake/autobatch/autobatchTargets.cmake"; then
  fail "the exported targets name a build-only dependency"
fi
env -u LD_LIBRARY_PATH "$prefix/bin/autobatch" --version | grep -q "LibTorch 2" \
  || fail "installed bin/autobatch does not run"

# A tiny classifier with its input description, exported as a user would.
"$python" - "$src/scripts" "$work/tiny.pt" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch
from autobatch_export import export
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
export(net, sys.argv[2], example_inputs=(torch.randn(4, 256),), loss="cross-entropy")
PY

# No TORCH_CUDA_ARCH_LIST from the caller: the package's AutobatchTorch.cmake defaults it.
env -u TORCH_CUDA_ARCH_LIST cmake -S "$src/examples/launcher" -B "$work/launcher" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix;$(dirname "$torch_dir")" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$work/launcher" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }

out="$work/launcher.out"
env -u LD_LIBRARY_PATH "$work/launcher/launcher" "$work/tiny.pt" --memory-limit 12MiB \
  --target-batch 4000 --steps 3 >"$out" 2>"$work/launcher.err" \
  || { cat "$out" "$work/launcher.err"; fail "launcher exited $?"; }
cat "$out"
grep -q "^findMaxBatch: found, max micro-batch [0-9]*, safe micro-batch [1-9]" "$out" \
  || fail "no search result"
grep -q "weights, buffers and training mode unchanged" "$out" || fail "module changed"
grep -Eq "^plan: [0-9+]+ = 4000 samples per step \((uniform|balanced), [2-9][0-9]* accumulation steps, effective batch 4000\)" "$out" \
  || fail "no accumulation plan for 4000"
[ "$(grep -c '^step [123]: .* 4000 samples, loss [0-9.]*$' "$out")" = 3 ] || fail "not 3 steps"
grep -q "^trained 3 optimizer steps of 4000 samples" "$out" || fail "did not finish"

# The cached search from C++ (findMaxBatchCached): a miss searches and stores, a repeat answers
# from the folder with one confirming trial.
for outcome in miss hit; do
  env -u LD_LIBRARY_PATH "$work/launcher/launcher" "$work/tiny.pt" --memory-limit 12MiB \
    --target-batch 4000 --steps 1 --cache "$work/results" >"$out" 2>"$work/launcher.err" \
    || { cat "$out" "$work/launcher.err"; fail "launcher --cache exited $?"; }
  grep -q "^findMaxBatchCached (cache $outcome): found, .*safe micro-batch [1-9]" "$out" \
    || { cat "$out"; fail "no cache $outcome"; }
done
grep -q "(1 trials, limit" "$out" || { cat "$out"; fail "a hit ran more than its confirming trial"; }
echo "install test passed"
