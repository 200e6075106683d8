#!/usr/bin/env bash
# Run ON THE GPU MACHINE, after scripts/device/gpu.sh on the same warm machine (it needs that
# call's build-device/bin/autobatch and the package it installed into the image's Python): the
# fair race's GPU rows (issue 44; scripts/bench/race.py --device cuda). Every finder gets the
# whole card and meets the caching allocator's real CUDA out of memory (no harness): Lightning
# binsearch, autobatch.find and the command on the archive, on ResNet-50 at 128x128 (needs
# torchvision) and GPT-2 small at 512 tokens (needs transformers), whichever the image has; B*
# from fresh processes of the plain loop. Rows in $OUT/race.jsonl as each model finishes, the
# table in $OUT/race.md at the end. AUTOBATCH_RACE_SECONDS (default 300) bounds the whole run
# (about two minutes a model, estimated).
#   device tool:  run(command="bash scripts/device/race.sh", carry=[".debs"], timeout_s=330)
# Dry run on the CPU (the plumbing, on the CPU race's models and budgets): AUTOBATCH_DEVICE_PYTHON=
# the project's venv Python, AUTOBATCH_CLI=build/bin/autobatch, AUTOBATCH_RACE_DEVICE=cpu,
# AUTOBATCH_RACE_MODELS=mlp.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
cd "$root" || exit 2
python="${AUTOBATCH_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
device="${AUTOBATCH_RACE_DEVICE:-cuda}"
export PYTHONUNBUFFERED=1
# The carried runtime libraries (spdlog, fmt) of the programs built by check.sh (see there).
export LD_LIBRARY_PATH="$root/.debs/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export AUTOBATCH_CLI="${AUTOBATCH_CLI:-$root/build-device/bin/autobatch}"
[ -x "$AUTOBATCH_CLI" ] || { echo "race: $AUTOBATCH_CLI missing: run scripts/device/gpu.sh first"; exit 2; }
"$python" -c 'import autobatch, lightning' ||
  { echo "race: autobatch or lightning missing in $python: run scripts/device/gpu.sh first"; exit 2; }
read -r -a models <<<"${AUTOBATCH_RACE_MODELS:-}"
if [ ${#models[@]} -eq 0 ]; then
  "$python" -c 'import torchvision' 2>/dev/null && models+=(resnet50)
  "$python" -c 'import transformers' 2>/dev/null && models+=(gpt2)
fi
[ ${#models[@]} -gt 0 ] || { echo "race: neither torchvision nor transformers in $python"; exit 2; }
t0=$SECONDS
timeout "${AUTOBATCH_RACE_SECONDS:-300}" "$python" scripts/bench/race.py --device "$device" \
  --models "${models[@]}" --finders lightning-binsearch autobatch cli --timeout 150 \
  --jsonl "$OUT/race.jsonl" --md "$OUT/race.md" 2>&1 | tee "$OUT/race.log"
status=${PIPESTATUS[0]}
echo "[time] race: $((SECONDS - t0)) s (exit $status)"
exit "$status"
