#!/usr/bin/env bash
# Run ON THE GPU MACHINE, in its own device call (scripts/device/check.sh is the GPU check; this is
# the benchmark of issue 7, sized for one call): builds with `check.sh --build-only` (env.txt,
# build.log, summary.txt; skipped when build-device/ already holds the CLI), then one cap (20 GiB),
# amp-bf16, ResNet-50 (3x224x224) and the 110M decoder LM (256 tokens); autobatch guided (2 and 3
# steps per trial) vs Lightning binsearch vs accelerate (from 512); ground truth and the eager-loop
# check for autobatch's answers only; then, if time is left, autobatch alone on the full card.
# Every row is appended to $OUT/bench.jsonl and $OUT/benchmarks.md is rewritten as each finishes
# (with bench.log: 6 files in $OUT). AUTOBATCH_BENCH_SECONDS (default 300): no benchmark process
# runs past that many seconds after the build (each one's timeout is cut to what is left).
#   here, first:  bash scripts/device/prepare.sh
#   device tool:  run(command="bash scripts/device/bench.sh", carry=[".debs"], timeout_s=540)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
cd "$root" || exit 2
python="${AUTOBATCH_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
budget="${AUTOBATCH_BENCH_SECONDS:-300}"
export PYTHONUNBUFFERED=1
# The carried runtime libraries (spdlog, fmt) of the programs built by check.sh (see there).
export LD_LIBRARY_PATH="$root/.debs/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$OUT/bench.log") 2>&1
[ -x build-device/bin/autobatch ] || bash scripts/device/check.sh --build-only || exit 1
t0=$SECONDS

# Models are exported here (the carried tree is limited to 64 MiB); ResNet-50 needs torchvision.
models="$root/models-device"
only="decoder_lm"
"$python" -c 'import torchvision' 2>/dev/null && only="resnet50 decoder_lm" ||
  echo "bench: no torchvision in $python: ResNet-50 skipped"
# shellcheck disable=SC2086
"$python" scripts/export_models.py --out "$models" --only $only || exit 1
cases=()
for c in $only; do cases+=("$([ "$c" = resnet50 ] && echo resnet50-bf16 || echo decoder-lm-bf16)"); done
echo "[time] bench: models $((SECONDS - t0)) s"

left=$((budget - (SECONDS - t0)))
"$python" scripts/bench/run.py --device cuda --cases "${cases[@]}" \
  --autobatch build-device/bin/autobatch --models "$models" --workdir /tmp/autobatch-bench \
  --jsonl "$OUT/bench.jsonl" --md "$OUT/benchmarks.md" --peers lightning-binsearch accelerate \
  --finders-autobatch "autobatch guided" "autobatch guided, 3 steps" --modes \
  --timeout 120 --check-timeout 60 --deadline-s "$left"

# autobatch alone on the full card (no --memory-limit), if time is left.
for c in $only; do
  [ $((budget - (SECONDS - t0))) -gt 60 ] || break
  echo "bench: $c on the full card"
  timeout $((budget - (SECONDS - t0))) build-device/bin/autobatch --model "$models/$c.pt" \
    --precision amp-bf16 --optimizer adamw --margin 0 --device cuda --json "/tmp/full-$c.json" \
    || true
  "$python" - "$c" "/tmp/full-$c.json" <<'PY' >>"$OUT/bench.jsonl" || true
import json, sys
r = json.load(open(sys.argv[2]))
res = r.get("result") or {}
print(json.dumps({"case": sys.argv[1] + "-full-card", "finder": "autobatch guided (full card)",
                  "found": res.get("max_micro_batch"), "trials": res.get("trial_count"),
                  "elapsed_s": res.get("elapsed_s"), "limit": r.get("device"), "status": r.get("status")}))
PY
done
echo "[time] bench total: $((SECONDS - t0)) s"
