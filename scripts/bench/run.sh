#!/usr/bin/env bash
# Regenerates the CPU tables of docs/benchmarks.md: autobatch against PyTorch Lightning and HF
# accelerate (scripts/bench/run.py), on this machine. Builds autobatch and exports the models first
# (scripts/build.sh). About 15 minutes on 2 cores (861 s measured); run it on a quiet machine,
# since wall times are measured. Extra arguments go to run.py (e.g. --cases decoder-lm-small).
# Raw rows: build/bench/results.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../env.sh"
bash "$AUTOBATCH_ROOT/scripts/build.sh" >/dev/null
t0=$SECONDS
cd "$AUTOBATCH_ROOT"
"$AUTOBATCH_PYTHON" scripts/bench/run.py --device cpu --md docs/benchmarks.md "$@"
echo "[time] bench run.py: $((SECONDS - t0)) s"
