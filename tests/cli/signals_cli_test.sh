#!/usr/bin/env bash
# One stop request, one report (issue 68 row 3): coreutils `timeout` ends a search the way a job
# scheduler's time limit does, signalling the child and then its process group (two SIGTERMs for
# one request). Every run must write its JSON and print its env lines, with the status and exit
# code of an interrupted run (or of a search that finished first).
# Usage: signals_cli_test.sh CLI PYTHON WORK_DIR [RUNS]
set -euo pipefail
cli="$1" python="$2" work="$3/signals" runs="${4:-20}"
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
model="$work/mlp.pt"
"$python" "$(dirname "${BASH_SOURCE[0]}")/../python/helpers/mlp_archive.py" "$model" 1024 4096
lost=0 interrupted=0
for i in $(seq "$runs"); do
  rc=0
  timeout -s TERM 3 "$cli" --model "$model" --device cpu --memory-limit 512MiB --target-batch 4096 \
    --json "$work/run$i.json" --env >"$work/run$i.env" 2>"$work/run$i.err" </dev/null || rc=$?
  if [ ! -s "$work/run$i.json" ] || ! grep -q "^AUTOBATCH_STATUS=" "$work/run$i.env"; then
    lost=$((lost + 1)); echo "run $i: exit $rc, no JSON or env lines"; tail -3 "$work/run$i.err"
    continue
  fi
  status="$("$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["status"], d["exit_code"])' "$work/run$i.json")"
  case "$rc $status" in
    "124 interrupted 143") interrupted=$((interrupted + 1)) ;;
    "0 found 0") ;;
    *) lost=$((lost + 1)); echo "run $i: exit $rc, JSON status/exit '$status'" ;;
  esac
done
echo "$runs runs under timeout: $interrupted interrupted with their report, $((runs - interrupted - lost)) finished first, $lost lost"
[ "$lost" = 0 ] && [ "$interrupted" -gt 0 ]
