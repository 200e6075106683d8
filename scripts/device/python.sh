#!/usr/bin/env bash
# The Python package on the GPU machine (autobatch.find's CUDA trials, through the command's CUDA
# backend, have never run on a GPU): run by scripts/device/gpu.sh after scripts/device/check.sh in
# the same device call; it reuses build-device/ (check.sh configured it with the same definitions
# and built the extension), so only the wheel is assembled.
#
#   here, first:   bash scripts/device/prepare.sh        (.debs/root and .debs/wheels, ignored)
#   device tool:   run(command="bash scripts/device/gpu.sh", carry=[".debs"], timeout_s=420)
#
# Phases (summary lines as check.sh's, appended to $OUT/summary.txt under a "python.sh" line;
# output in $OUT/python.log: with check.sh's 7 files, the 8 the device tool returns):
#   tools    pip install --no-index --find-links .debs/wheels scikit-build-core pybind11 pytest
#            into the image's Python (/opt/torch/.venv; those already there are kept)
#   install  pip install --no-build-isolation --no-deps . into that Python, as a user installs it
#            (docs/python.md), against the image's CUDA torch, with build-dir build-device/ and the
#            carried Debian packages (as check.sh's build)
#   tests    pytest tests/python/test_cuda.py: the search's answer B against the user's eager job
#            in fresh processes (device use at B under the limit, above it at B+1), memory
#            returned, a trial's peak against the eager loop within 1%, a preset fraction, a
#            refused allocator setting, a device-side assert, evaluation sizing, the soak's growth
#            and the allocator's fragmentation on the device (fails when any
#            test is skipped while nvidia-smi shows a GPU)
# Exit 0 only when every line is PASS. Not yet run on a GPU.
# Variables: AUTOBATCH_DEVICE_PYTHON (/opt/torch/.venv/bin/python), AUTOBATCH_DEVICE_SECONDS (280;
# gpu.sh passes what its budget leaves),
# AUTOBATCH_DEVICE_BUILD_DIR (build-device), AUTOBATCH_DEVICE_BUILD_TYPE (RelWithDebInfo),
# AUTOBATCH_DEVICE_SKIP_INSTALL (1: test the package already installed in that Python; the CPU
# dry run of scripts/device/dry_run.sh).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/device/lib.sh
. "$root/scripts/device/lib.sh"
wheels="$root/.debs/wheels"
summary="$OUT/summary.txt"
log="$OUT/python.log"
PATH="$PATH:$(dirname "$python")"
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || PATH="$PATH:/usr/local/cuda/bin"
export PATH PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t_start=$SECONDS
failures=0
echo "== python.sh" >>"$summary"
: >"$log"


t=$SECONDS
if [ "${AUTOBATCH_DEVICE_SKIP_INSTALL:-0}" = 1 ]; then
  record tools PASS 0 "skipped: the dry run uses the tools already in $python"
elif [ ! -d "$wheels" ]; then
  record tools FAIL 0 "$wheels missing: run scripts/device/prepare.sh here and carry .debs"
elif secs="$(time_for 60)" && run_logged "$log" "$secs" "$python" -m pip install --no-index \
    --find-links "$wheels" scikit-build-core pybind11 pytest; then
  record tools PASS $((SECONDS - t)) "$("$python" -m pytest --version 2>&1 | head -1)"
else
  record tools FAIL $((SECONDS - t)) "pip install from $wheels failed (python.log)"
fi

t=$SECONDS
torch_prefix="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>>"$log")"
defs=(-DCMAKE_BUILD_TYPE="$build_type"
      "-DCMAKE_PREFIX_PATH=$torch_prefix;$debs/usr;$debs/usr/lib/x86_64-linux-gnu/cmake"
      "-DCMAKE_CXX_FLAGS=-isystem $debs/usr/include" -DAUTOBATCH_PYTHON="$python"
      -DAUTOBATCH_PYTHON_MODULE=ON -DAUTOBATCH_WITH_TORCH=ON -DPython_EXECUTABLE="$python"
      # pyproject.toml's OFF would land in build-device's cache, and a rerun of check.sh on the
      # warm machine would find no test labelled gpu
      -DAUTOBATCH_BUILD_TESTS=ON)
config=()
for d in "${defs[@]}"; do config+=(-C "cmake.define.${d#-D}"); done
if [ "${AUTOBATCH_DEVICE_SKIP_INSTALL:-0}" = 1 ]; then
  # The CPU dry run (.ci/run): the package scripts/build.sh installed in $python is the one tested.
  if (cd /tmp && "$python" -c 'import autobatch' 2>>"$log"); then
    record install PASS 0 "skipped: the package already installed in $python"
  else
    record install FAIL 0 "skipped, but autobatch does not import in $python (python.log)"
  fi
elif [ "$failures" != 0 ]; then
  record install FAIL 0 "not run: no build tools"
elif ! secs="$(time_for 180)"; then
  record install FAIL 0 "no time left"
elif run_logged "$log" "$secs" "$python" -m pip install --no-build-isolation --no-deps --no-index \
    --force-reinstall -C build-dir="$build" -C cmake.build-type="$build_type" "${config[@]}" .; then
  record install PASS $((SECONDS - t)) "$(cd /tmp && "$python" -c 'import torch, autobatch
print("autobatch", autobatch.__version__, "torch", torch.__version__, "cuda",
      torch.cuda.is_available())' 2>&1 | tail -1)"
else
  rc=$?
  grep -E 'error|Error' "$log" | tail -10
  why="failed"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="timed out after ${secs}s"
  record install FAIL $((SECONDS - t)) "pip install . $why (exit $rc, python.log)"
fi

t=$SECONDS
if [ "$failures" != 0 ]; then
  record tests FAIL 0 "not run: no package"
elif ! secs="$(time_for 200)"; then
  record tests FAIL 0 "no time left"
else
  (cd /tmp && run_logged "$log" "$secs" "$python" -m pytest -q -rs -p no:cacheprovider \
    "$root/tests/python/test_cuda.py")
  rc=$?
  line="$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1)"
  if [ "$rc" != 0 ]; then
    record tests FAIL $((SECONDS - t)) "exit $rc: ${line:-see python.log}"
  elif grep -q skipped <<<"$line" && nvidia-smi -L >/dev/null 2>&1; then
    record tests FAIL $((SECONDS - t)) "skipped with a GPU visible: $line"
  else
    record tests PASS $((SECONDS - t)) "$line"
  fi
fi

echo "== summary: $summary"
cat "$summary"
[ "$failures" = 0 ]
