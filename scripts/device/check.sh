#!/usr/bin/env bash
# The GPU check of autobatch: ONE device call, ON THE GPU MACHINE, from the repo root.
#
#   here, first:   bash scripts/device/prepare.sh        (Debian packages into .debs/, ignored)
#   device tool:   run(command="bash scripts/device/check.sh", carry=[".debs"], timeout_s=300)
#
# Phases, each under its own timeout and all inside AUTOBATCH_DEVICE_SECONDS (default 280 s, so
# the summary is written before the tool's 300 s): a phase that finds too little time left is
# recorded as failed, not run.
#   env        nvidia-smi, torch, torchvision, nvcc, cmake, ninja, g++ (env.txt); a GPU must be
#              visible when the target device is cuda
#   build      configure and build everything against the image's LibTorch (/opt/torch/.venv) and
#              the carried packages (.debs/root) into build-device/ (build.log)
#   models     scripts/export_models.py --only resnet50 decoder_lm into models-device/ (ignored),
#              in the background while the build runs; no torchvision: ResNet-50 fails, said so
#   gpu tests  ctest -L gpu (gpu-tests.log, gpu-tests.xml): fails on a failed test, on no test
#              found, and on any skipped test while nvidia-smi shows a GPU
#   jobs       the main job on each model (resnet50: --input 3x224x224; decoder_lm: the archive's
#              inputs), with --precision amp-bf16 --memory-limit 20GiB --target-batch 512
#              --device cuda --json $OUT/<model>.json; then, each in a FRESH process with the same
#              flags and --margin 0: --check-batch B must exit 0 and --check-batch B+1 must exit 3,
#              B = result.max_micro_batch of that JSON (jobs.log holds every run's output)
# summary.txt (also printed last) has one line per check: PASS / FAIL, what was seen, seconds.
# Exit 0 only when every line is PASS; 1 otherwise. $OUT gets 7 files: env.txt, build.log,
# gpu-tests.log, jobs.log, resnet50.json, decoder_lm.json, summary.txt (the device tool returns at
# most 8, and python.sh adds python.log; ctest's JUnit file stays in the build tree).
#
# Never run on a GPU yet. Guessed times on the H200's 16 cores: build 1-2 min (the critical path is
# one LibTorch-heavy file), gpu tests under a minute, each job and its two checks under a minute.
# A call on a still-warm machine finds build-device/ and models-device/ again (ignored outputs are
# kept there), so a rerun after a timeout may rebuild only what changed.
#
# Options: --build-only (env and build: what scripts/device/bench.sh needs first).
# Variables (defaults for the GPU machine; the others let a CPU machine dry-run the logic):
#   AUTOBATCH_DEVICE_PYTHON     /opt/torch/.venv/bin/python (its torch: the LibTorch built against)
#   AUTOBATCH_DEVICE_SECONDS    280: the whole script's budget
#   AUTOBATCH_DEVICE_BUILD_DIR  build-device
#   AUTOBATCH_DEVICE_SKIP_BUILD 1: use the build already in AUTOBATCH_DEVICE_BUILD_DIR
#   AUTOBATCH_DEVICE_BUILD_TYPE RelWithDebInfo
#   AUTOBATCH_DEVICE_BUILD_SECONDS 170: the build's timeout (configure included)
#   AUTOBATCH_DEVICE_TARGET     cuda (the --device of the jobs; cpu needs no GPU)
#   AUTOBATCH_DEVICE_LIMIT      20GiB (--memory-limit)
#   AUTOBATCH_DEVICE_MODELS     "resnet50 decoder_lm" (names of scripts/export_models.py)
#   AUTOBATCH_DEVICE_MODELS_DIR models-device
#   AUTOBATCH_DEVICE_VISION_INPUT 3x224x224 (--input of the torchvision models)
# CPU dry run of the checking logic, with the CPU build of scripts/build.sh:
#   AUTOBATCH_DEVICE_SKIP_BUILD=1 AUTOBATCH_DEVICE_BUILD_DIR=build AUTOBATCH_DEVICE_TARGET=cpu \
#   AUTOBATCH_DEVICE_PYTHON=$AUTOBATCH_PYTHON AUTOBATCH_DEVICE_MODELS_DIR=models \
#   AUTOBATCH_DEVICE_MODELS=decoder_lm_small AUTOBATCH_DEVICE_LIMIT=256MiB \
#   OUT=/tmp/check-out bash scripts/device/check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
# shellcheck source=scripts/device/lib.sh
. "$root/scripts/device/lib.sh"
target="${AUTOBATCH_DEVICE_TARGET:-cuda}"
limit="${AUTOBATCH_DEVICE_LIMIT:-20GiB}"
read -r -a models <<<"${AUTOBATCH_DEVICE_MODELS:-resnet50 decoder_lm}"
models_dir="${AUTOBATCH_DEVICE_MODELS_DIR:-$root/models-device}"
vision_input="${AUTOBATCH_DEVICE_VISION_INPUT:-3x224x224}"
bin="$build/bin/autobatch"
summary="$OUT/summary.txt"
jobs_log="$OUT/jobs.log"
tmp="$(mktemp -d /tmp/autobatch-check.XXXXXX)"
export PYTHONUNBUFFERED=1
# The image's cmake and ninja may live beside its python only; nvcc in the CUDA toolkit's folder.
PATH="$PATH:$(dirname "$python")"
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || PATH="$PATH:/usr/local/cuda/bin"
export PATH
# The carried runtime libraries (spdlog, fmt) for every program built here: the build RPATH names
# them, but a library they need in turn (libspdlog -> libfmt) is looked up without it.
export LD_LIBRARY_PATH="$debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t_start=$SECONDS
failures=0
: >"$summary"
[ "$build_only" = 1 ] || : >"$jobs_log"


# json_get FILE EXPR: a value of the JSON report (EXPR in Python over `r`), empty when unreadable.
json_get() {
  "$python" -c 'import json, sys
r = json.load(open(sys.argv[1]))
v = eval(sys.argv[2], {"r": r})
print("" if v is None else v)' "$1" "$2" 2>/dev/null
}

# ---- env ---------------------------------------------------------------------------------------
t=$SECONDS
echo "== env ($(date -u +%FT%TZ))"
gpu_visible=0
{
  echo "# nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  nvidia-smi -L 2>&1
  echo "# python: $python"
  timeout 60 "$python" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except Exception as e:
    print("torchvision missing:", type(e).__name__, e)' 2>&1
  echo "# tools"
  command -v nvcc && nvcc --version | tail -2
  command -v cmake && cmake --version | head -1
  command -v ninja && ninja --version
  command -v g++ && g++ --version | head -1
  echo "cores $(nproc); $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB memory"}')"
  uname -a
} >"$OUT/env.txt" 2>&1
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu_visible=1
gpu_line="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>/dev/null | head -1)"
torch_line="$(grep -m1 '^torch ' "$OUT/env.txt")"
torch_line="${torch_line% }"
have_torchvision=0
grep -q '^torchvision [0-9]' "$OUT/env.txt" && have_torchvision=1
detail="${gpu_line:-no GPU seen by nvidia-smi}; ${torch_line:-torch not importable from $python}"
if [ -z "$torch_line" ]; then
  record env FAIL $((SECONDS - t)) "$detail"
elif [ "$target" != cpu ] && [ "$gpu_visible" = 0 ]; then
  record env FAIL $((SECONDS - t)) "$detail (the jobs run on $target)"
elif [ "$target" != cpu ] && ! grep -q '^torch .* available True' "$OUT/env.txt"; then
  record env FAIL $((SECONDS - t)) "$detail (nvidia-smi sees a GPU, torch does not)"
else
  record env PASS $((SECONDS - t)) "$detail"
fi

# ---- models, in the background while the build runs -----------------------------------------
export_pid=""
export_models=()
if [ "$build_only" = 0 ]; then
  for m in "${models[@]}"; do
    case "$m" in
      decoder_lm*) export_models+=("$m") ;;
      *) [ "$have_torchvision" = 1 ] && export_models+=("$m") ;;
    esac
  done
  t_export=$SECONDS
  if [ ${#export_models[@]} -gt 0 ] && secs="$(time_for 120)"; then
    run_logged "$tmp/export.log" "$secs" "$python" scripts/export_models.py --out "$models_dir" \
      --only "${export_models[@]}" &
    export_pid=$!
  fi
fi

# ---- build -------------------------------------------------------------------------------------
t=$SECONDS
echo "== build"
built=0  # a build-device/ kept from an earlier call on a warm machine is used only when rebuilt
: >"$OUT/build.log"
if [ "${AUTOBATCH_DEVICE_SKIP_BUILD:-0}" = 1 ]; then
  if [ -x "$bin" ]; then
    built=1
    record build PASS 0 "skipped: using $build"
  else
    record build FAIL 0 "skipped, but $bin is missing"
  fi
elif [ ! -d "$debs/usr/include/spdlog" ]; then
  record build FAIL 0 "$debs missing: run scripts/device/prepare.sh where the device tool is\
 called, and carry .debs"
elif ! secs="$(time_for "${AUTOBATCH_DEVICE_BUILD_SECONDS:-170}")"; then
  record build FAIL 0 "no time left"
else
  torch_prefix="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' \
    2>>"$OUT/build.log")"
  # The extension too when pybind11 is there (gpu.sh installs it first): python.sh's pip install
  # then configures this tree with the same definitions and builds nothing again.
  python_module=OFF
  "$python" -c 'import pybind11' 2>/dev/null && python_module=ON
  # The carried packages' runtime libraries (spdlog, fmt) reach the RUNPATH through their imported
  # targets' full paths (CMake's build RPATH).
  if [ -z "$torch_prefix" ]; then
    record build FAIL $((SECONDS - t)) "no torch in $python (build.log)"
  elif ! run_logged "$OUT/build.log" "$secs" cmake -S . -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE="$build_type" \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$debs/usr;$debs/usr/lib/x86_64-linux-gnu/cmake" \
      -DCMAKE_CXX_FLAGS="-isystem $debs/usr/include" -DAUTOBATCH_PYTHON="$python" \
      -DAUTOBATCH_PYTHON_MODULE="$python_module" -DPython_EXECUTABLE="$python" \
      -DAUTOBATCH_BUILD_TESTS=ON; then
    tail -30 "$OUT/build.log"
    record build FAIL $((SECONDS - t)) "configure failed (build.log)"
  else
    secs=$((secs - (SECONDS - t)))
    # Everything: the critical path is one LibTorch-heavy file (30-50 s) however many cores work
    # beside it, and every test program then compiles with this image's compiler and CUDA LibTorch.
    echo "building ($build_type, $(nproc) jobs; about a minute)"
    if [ "$secs" -lt 10 ]; then
      record build FAIL $((SECONDS - t)) "no time left after configure"
    elif run_logged "$OUT/build.log" "$secs" cmake --build "$build" -j "$(nproc)"; then
      built=1
      steps="$(grep -c '^\[[0-9]*/[0-9]*\]' "$OUT/build.log")"
      record build PASS $((SECONDS - t)) "$build_type, $steps steps"
    else
      grep -E 'error|FAILED' "$OUT/build.log" | head -20
      tail -20 "$OUT/build.log"
      record build FAIL $((SECONDS - t)) "build failed or timed out (build.log)"
    fi
  fi
fi
[ "$built" = 1 ] && "$bin" --version >>"$OUT/env.txt" 2>&1

if [ "$build_only" = 1 ]; then
  echo "== summary: $OUT/summary.txt"
  cat "$summary"
  rm -rf "$tmp"
  [ "$failures" = 0 ]
  exit $?
fi

# ---- gpu tests ---------------------------------------------------------------------------------
t=$SECONDS
echo "== gpu tests"
: >"$OUT/gpu-tests.log"
if [ "$built" != 1 ]; then
  record "gpu tests" FAIL 0 "not run: no build"
elif ! secs="$(time_for 90)"; then
  record "gpu tests" FAIL 0 "no time left"
else
  junit="$build/gpu-tests.xml"  # read here for the counts, not returned (8 files at most)
  rm -f "$junit"
  run_logged "$OUT/gpu-tests.log" "$secs" ctest --test-dir "$build" -L gpu --no-tests=error \
    --timeout 45 --output-on-failure --output-junit "$junit"
  rc=$?
  # Counts from the JUnit file (a <skipped> child or status notrun/disabled is a skip), else from
  # ctest's own lines; the skipped names are listed.
  counts="$("$python" - "$junit" <<'PY' 2>/dev/null
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
total = failed = 0
skipped = []
for c in cases:
    total += 1
    status = c.get("status", "")
    if c.find("skipped") is not None or status in ("notrun", "disabled"):
        skipped.append(c.get("name"))
    elif c.find("failure") is not None or c.find("error") is not None or status == "fail":
        failed += 1
print(total, failed, len(skipped), " ".join(skipped))
PY
  )"
  read -r total failed skipped skipped_names <<<"${counts:-0 0 0}"
  if [ "$total" = 0 ]; then  # no JUnit file: ctest's "N% tests passed, F tests failed out of T"
    total="$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$OUT/gpu-tests.log" | tail -1)"
    failed="$(sed -n 's/.* tests passed, \([0-9]*\) tests failed out of.*/\1/p' \
      "$OUT/gpu-tests.log" | tail -1)"
    total="${total:-0}" failed="${failed:-0}"
  fi
  log_skipped="$(grep -c -- '\*\*\*Skipped\|Not Run\|\*\*\*Disabled' "$OUT/gpu-tests.log")"
  [ "$log_skipped" -gt "${skipped:-0}" ] && skipped=$log_skipped
  passed=$((total - failed - skipped))
  detail="$total tests: $passed passed, $failed failed, $skipped skipped (exit $rc)"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && detail="$detail, timed out after ${secs}s"
  [ "$total" = 0 ] && detail="no test labelled gpu ran (exit $rc)"
  if [ "$rc" != 0 ] || [ "$total" = 0 ] || [ "$failed" != 0 ]; then
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|Failed|Skipped' "$OUT/gpu-tests.log" | tail -20
    record "gpu tests" FAIL $((SECONDS - t)) "$detail"
  elif [ "$skipped" != 0 ] && [ "$gpu_visible" = 1 ]; then
    names="$(echo "$skipped_names" | tr ' ' '\n' | head -3 | tr '\n' ' ')"
    [ "$skipped" -gt 3 ] && names="$names..."
    record "gpu tests" FAIL $((SECONDS - t)) \
      "$detail with a GPU visible: ${names:-see gpu-tests.log}"
  elif [ "$skipped" != 0 ]; then
    record "gpu tests" PASS $((SECONDS - t)) "$detail; no GPU visible, so skips are expected"
  else
    record "gpu tests" PASS $((SECONDS - t)) "$detail"
  fi
fi

# ---- models ------------------------------------------------------------------------------------
echo "== models"
if [ -n "$export_pid" ]; then
  wait "$export_pid"
  rc=$?
  cat "$tmp/export.log" >>"$jobs_log"
  if [ "$rc" = 0 ]; then
    record models PASS $((SECONDS - t_export)) "exported ${export_models[*]} (in the background)"
  else
    tail -15 "$tmp/export.log"
    record models FAIL $((SECONDS - t_export)) "export_models.py exit $rc (jobs.log)"
  fi
fi

# ---- jobs --------------------------------------------------------------------------------------
# check NAME EXPECTED B FLAGS...: a fresh process checks micro-batch B with --margin 0; PASS when
# its exit code is EXPECTED (0 fits, 3 does not fit).
check() {
  local name="$1" expected="$2" b="$3" t=$SECONDS secs rc json peak lim what
  shift 3
  local label="$name B"
  [ "$expected" = 3 ] && label="$name B+1"
  if ! secs="$(time_for 60)"; then
    record "$label" FAIL 0 "--check-batch $b: no time left"
    return
  fi
  json="$tmp/$name-check-$b.json"
  echo "== $label: --check-batch $b --margin 0 (expect exit $expected)"
  run_logged "$jobs_log" "$secs" "$bin" "$@" --check-batch "$b" --margin 0 --json "$json"
  rc=$?
  peak="$(json_get "$json" 'r["trials"][-1]["peak_bytes"] / 2**30')"
  lim="$(json_get "$json" 'r["device"]["memory_limit_bytes"] / 2**30')"
  what="exit $rc ($(json_get "$json" 'r["status"]'))"
  [ -n "$peak" ] && what="$what, peak $(printf '%.3f' "$peak") of $(printf '%.3f' "${lim:-0}") GiB"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && what="$what, timed out after ${secs}s"
  if [ "$rc" = "$expected" ]; then
    record "$label" PASS $((SECONDS - t)) "--check-batch $b --margin 0: $what"
  else
    record "$label" FAIL $((SECONDS - t)) \
      "--check-batch $b --margin 0: $what, expected exit $expected"
  fi
}

for m in "${models[@]}"; do
  t=$SECONDS
  # The search's flags without the plan's: --check-batch refuses a --target-batch that is not
  # the checked batch.
  flags=(--model "$models_dir/$m.pt" --precision amp-bf16 --memory-limit "$limit"
         --device "$target")
  case "$m" in decoder_lm*) ;; *) flags+=(--input "$vision_input") ;; esac
  json="$OUT/$m.json"
  rm -f "$json"
  if [ "$built" != 1 ]; then
    record "$m" FAIL 0 "not run: no build"
    continue
  fi
  case "$m" in
    decoder_lm*) ;;
    *) if [ "$have_torchvision" != 1 ]; then
         record "$m" FAIL 0 "not exported: no torchvision in $python (env.txt)"
         continue
       fi ;;
  esac
  if [ ! -f "$models_dir/$m.pt" ]; then
    record "$m" FAIL 0 "not exported (jobs.log)"
    continue
  fi
  if ! secs="$(time_for 90)"; then
    record "$m" FAIL 0 "no time left"
    continue
  fi
  echo "== $m: autobatch ${flags[*]} --target-batch 512"
  run_logged "$jobs_log" "$secs" "$bin" "${flags[@]}" --target-batch 512 --json "$json"
  rc=$?
  b="$(json_get "$json" 'r["result"]["max_micro_batch"]')"
  what="exit $rc, $(json_get "$json" 'r["status"] + (": " + r["error"][:120] if r["error"] else
    "")')"
  what="$what$(json_get "$json" '": max %s, safe %s, %s trials in %.1f s" % (
    r["result"]["max_micro_batch"], r["result"]["safe_micro_batch"], r["result"]["trial_count"],
    r["result"]["elapsed_s"])')"
  plan="$(json_get "$json" '", ".join("%s %s x %s" % (p["kind"], p["micro_batch_size"],
    p["accumulation_steps"]) for p in (r["plans"].get("uniform"), r["plans"].get("balanced"))
    if p)')"
  [ -n "$plan" ] && what="$what; plan $plan"
  [ -s "$json" ] || what="$what, no JSON report"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && what="$what, timed out after ${secs}s"
  status="$(json_get "$json" 'r["status"]')"
  if [ "$rc" != 0 ] || [ "$status" != found ] || ! [[ "$b" =~ ^[0-9]+$ ]] || [ "$b" -lt 1 ]; then
    grep -E 'autobatch:|error|Error' "$jobs_log" | tail -5
    record "$m" FAIL $((SECONDS - t)) "$what"
    continue
  fi
  record "$m" PASS $((SECONDS - t)) "$what"
  check "$m" 0 "$b" "${flags[@]}"
  check "$m" 3 $((b + 1)) "${flags[@]}"
done

# ---- summary -----------------------------------------------------------------------------------
total=$((SECONDS - t_start))
verdict=PASS
[ "$failures" = 0 ] || verdict="FAIL ($failures failed)"
echo "autobatch device check: $verdict, $total s of a $budget s budget; ${gpu_line:-no GPU seen}" \
  >>"$summary"
rm -rf "$tmp"
echo
echo "== summary ($OUT/summary.txt)"
cat "$summary"
[ "$failures" = 0 ]
