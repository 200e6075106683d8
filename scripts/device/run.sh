#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), from the repo root, with `.debs` carried (made here by
# scripts/device/prepare.sh). Builds against the image's LibTorch, runs the tests labelled `gpu`
# and writes logs and results under $OUT (env.txt, build.log, gpu-tests.log, gpu-tests.xml: $OUT
# brings back at most 8 files). AUTOBATCH_DEVICE_SKIP_TESTS=1 only builds (scripts/device/bench.sh).
#   device run: command "bash scripts/device/run.sh; bash scripts/device/bench.sh", carry [".debs"]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
cd "$root"
python="${AUTOBATCH_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
debs="$root/.debs/root"
[ -d "$debs/usr/include/spdlog" ] || { echo "device: $debs missing: run scripts/device/prepare.sh here first"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/env.txt" || true

torch_prefix="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
build="$root/build-device"
t0=$SECONDS
# The carried packages' runtime libraries (spdlog, fmt) reach the RUNPATH through their imported
# targets' full paths (CMake's build RPATH).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$debs/usr;$debs/usr/lib/x86_64-linux-gnu/cmake" \
  -DCMAKE_CXX_FLAGS="-isystem $debs/usr/include" -DAUTOBATCH_PYTHON="$python" \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "[time] device build: $((SECONDS - t0)) s"
"$build/bin/autobatch" --version | tee -a "$OUT/env.txt"
[ "${AUTOBATCH_DEVICE_SKIP_TESTS:-0}" = 1 ] && exit 0

t1=$SECONDS
ctest --test-dir "$build" -L gpu --output-on-failure --output-junit "$OUT/gpu-tests.xml" \
  2>&1 | tee "$OUT/gpu-tests.log"
echo "[time] device gpu tests: $((SECONDS - t1)) s"
