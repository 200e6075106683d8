#!/usr/bin/env bash
# Regenerates the Python package's table of docs/benchmarks.md (issue 29, "Figures to report"):
# autobatch.find (finder autobatch-python) against Lightning's scale_batch_size (binsearch) and
# accelerate's find_executable_batch_size, and the CLI on the exported archive of the same model,
# on ResNet-18 (3x64x64) and the tiny Llama, CPU, every finder under RLIMIT_DATA
# (scripts/bench/run.py, peers.py). Needs the package installed in the project's environment
# (scripts/build.sh does it); builds nothing; AUTOBATCH_MODELS: where resnet18.pt is (models/).
# Wall times are measured: it first waits (polling every 60 s, at most
# AUTOBATCH_BENCH_WAIT_S, default 1800) for a 1-minute load below AUTOBATCH_BENCH_MAX_LOAD (1.5),
# then runs anyway, and prints the load at the start and the end. The whole run is bounded by
# AUTOBATCH_BENCH_SECONDS (1800; run.py starts no process after that less 120 s).
# Extra arguments go to run.py. Raw rows: build/bench-python/results.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../env.sh"
cd "$AUTOBATCH_ROOT"
cli="$(dirname "$AUTOBATCH_PYTHON")/autobatch"
need() {
  echo "python.sh: $1; run scripts/build.sh" >&2
  exit 1
}
"$AUTOBATCH_PYTHON" -c 'import autobatch' || need "no autobatch package in $AUTOBATCH_VENV"
[ -x "$cli" ] || need "no autobatch executable at $cli"
models="${AUTOBATCH_MODELS:-$AUTOBATCH_ROOT/models}"  # the exported models (export_models.py)
[ -f "$models/resnet18.pt" ] || need "no $models/resnet18.pt"

load() { cut -d' ' -f1 /proc/loadavg; }
max_load="${AUTOBATCH_BENCH_MAX_LOAD:-1.5}"
waited=0
while awk -v l="$(load)" -v m="$max_load" 'BEGIN { exit !(l >= m) }' \
    && [ "$waited" -lt "${AUTOBATCH_BENCH_WAIT_S:-1800}" ]; do
  echo "[bench] 1-minute load $(load) >= $max_load; waiting ($waited s so far)" >&2
  sleep 60
  waited=$((waited + 60))
done
seconds="${AUTOBATCH_BENCH_SECONDS:-1800}"
echo "[bench] load at start: $(cat /proc/loadavg)"
t0=$SECONDS
rc=0
timeout "$seconds" "$AUTOBATCH_PYTHON" scripts/bench/run.py --device cpu \
  --cases resnet18-64px tiny-llama \
  --peers lightning-binsearch accelerate autobatch-python \
  --finders-autobatch "autobatch guided, real allocator, 3 steps" --modes \
  --autobatch "$cli" --models "$models" --workdir build/bench-python \
  --jsonl build/bench-python/results.jsonl --md docs/benchmarks.md --section python \
  --timeout 300 --check-timeout 120 --deadline-s $((seconds - 120)) "$@" || rc=$?
echo "[bench] load at end: $(cat /proc/loadavg)"
echo "[time] bench python.sh: $((SECONDS - t0)) s (exit $rc)"
exit "$rc"
