#!/usr/bin/env bash
# Multi-rank preflight on one machine: rank processes of the CLI on 127.0.0.1, CPU budget
# allocator with a different budget per rank, one compute thread each.
# Usage: ranks_cli_test.sh CASE CLI PYTHON WORK_DIR
#   agree2, agree4  the ranks agree on the minimum (the rank with the smallest budget limits)
#   killed          a rank killed mid-search: the others exit 4, naming it, in bounded time
#   missing         a rank that never arrives: exit 4 naming it after --rank-timeout
#   wrong-world     rank >= world size (flags, torchrun env): exit 2
#   different-targets, different-models
#                   a plan's input differs between the ranks: exit 4 on both, naming the field
set -euo pipefail
case_name="$1" cli="$2" python="$3" work="$4/$1"
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SLURM_PROCID SLURM_NTASKS TORCHELASTIC_USE_AGENT_STORE
fail() { echo "FAIL: $*" >&2; for f in "$work"/*.err; do echo "== $f"; tail -5 "$f"; done >&2; exit 1; }

model="$work/mlp.pt"
archive="$(dirname "${BASH_SOURCE[0]}")/../python/helpers/mlp_archive.py"
"$python" "$archive" "$model" 512 1024
port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

# start_rank RANK WORLD BUDGET [extra flags]: runs in the background, pid in pids[RANK].
declare -a pids
start_rank() {
  local r="$1" world="$2" budget="$3"; shift 3
  "$cli" --model "$model" --device cpu --memory-limit "$budget" --target-batch 9600 \
    --rank "$r" --world-size "$world" --master-addr 127.0.0.1 --master-port "$port" \
    --json "$work/rank$r.json" "$@" >"$work/rank$r.out" 2>"$work/rank$r.err" </dev/null &
  pids[$r]=$!
}
# Sets rc to rank $1's exit code (not in a subshell: only this shell can wait for it).
wait_rank() { rc=0; wait "${pids[$1]}" || rc=$?; }

agree() {
  local budgets=("$@") world=$#
  for r in $(seq 0 $((world - 1))); do start_rank "$r" "$world" "${budgets[$r]}" --rank-timeout 120; done
  for r in $(seq 0 $((world - 1))); do
    wait_rank "$r"; [ "$rc" = 0 ] || fail "rank $r exited $rc"
  done
  "$python" - "$work" "$world" <<'PY'
import json, sys
work, world = sys.argv[1], int(sys.argv[2])
docs = [json.load(open(f"{work}/rank{r}.json")) for r in range(world)]
own = [d["ranks"]["reports"][d["ranks"]["rank"]]["safe_micro_batch"] for d in docs]
agreed = {d["ranks"]["safe_micro_batch"] for d in docs}
assert len(agreed) == 1, agreed
agreed = agreed.pop()
assert agreed == min(own) > 0, (agreed, own)
assert len(set(own)) > 1, f"budgets should give different batches: {own}"
for d in docs:
    assert d["status"] == "found" and d["exit_code"] == 0, d["status"]
    assert d["result"]["safe_micro_batch"] == agreed
    assert d["ranks"]["limiting_ranks"] == [own.index(agreed)], d["ranks"]["limiting_ranks"]
    plan = d["plans"][d["plans"]["primary"]]
    assert plan["world_size"] == world and plan["effective_batch"] == 9600, plan
    assert max(plan["micro_batches"]) <= agreed, (plan, agreed)
    assert sum(plan["micro_batches"]) * world == 9600
print(f"{world} ranks agreed on safe micro-batch {agreed} (own: {own})")
PY
  cat "$work/rank0.out"
}

case "$case_name" in
  agree2) agree 40MiB 24MiB ;;
  agree4) agree 40MiB 32MiB 24MiB 48MiB ;;
  killed)
    start=$SECONDS
    for r in 0 1 2; do start_rank "$r" 3 "$((24 + 8 * r))MiB" --rank-timeout 3; done
    # Kill rank 1 once its search is under way (its first trial is logged).
    for _ in $(seq 600); do grep -q "trial batch" "$work/rank1.err" && break; sleep 0.05; done
    grep -q "trial batch" "$work/rank1.err" || fail "rank 1 never started a trial"
    kill -9 "${pids[1]}"
    for r in 0 2; do
      wait_rank "$r"; [ "$rc" = 4 ] || fail "rank $r exited $rc, expected 4"
      grep -q "no result from rank(s) 1 within 3.0 s (--rank-timeout): rank 1 stopped its heartbeat" \
        "$work/rank$r.err" || fail "rank $r: no message naming rank 1"
      grep -q '"status": "ranks-disagree"' "$work/rank$r.json" || fail "rank $r: JSON status"
    done
    echo "killed rank 1: ranks 0 and 2 exited 4 after $((SECONDS - start)) s"
    [ $((SECONDS - start)) -lt 120 ] || fail "took too long"
    grep -h "ranks could not agree" "$work/rank0.err" ;;
  missing)
    start=$SECONDS
    start_rank 0 2 64MiB --rank-timeout 2
    wait_rank 0; [ "$rc" = 4 ] || fail "rank 0 exited $rc, expected 4"
    grep -q "no job record from rank(s) 1 within 2.0 s (--rank-timeout): rank 1 never arrived" \
      "$work/rank0.err" || fail "no message naming rank 1"
    echo "missing rank 1: rank 0 exited 4 after $((SECONDS - start)) s" ;;
  different-targets|different-models)
    # Issue 68 rows 1 and 2: what a plan depends on differs between the ranks; both exit 4 in
    # the job round (before any trial), naming the field, the ranks and both values.
    if [ "$case_name" = different-targets ]; then
      start_rank 0 2 40MiB --rank-timeout 60 --target-batch 64
      start_rank 1 2 40MiB --rank-timeout 60 --target-batch 40000
      words="ranks disagree on target-batch: rank 0 has '64', rank 1 has '40000'"
    else
      other="$work/other.pt"
      "$python" "$archive" "$other" 512 256 1
      start_rank 0 2 40MiB --rank-timeout 60
      start_rank 1 2 40MiB --rank-timeout 60 --model "$other"
      words="ranks disagree on model: rank 0 has '"
    fi
    for r in 0 1; do
      wait_rank "$r"; [ "$rc" = 4 ] || fail "rank $r exited $rc, expected 4"
      grep -qF "$words" "$work/rank$r.err" || fail "rank $r: no message naming the field"
      grep -q '"status": "ranks-disagree"' "$work/rank$r.json" || fail "rank $r: JSON status"
      ! grep -q "trial batch" "$work/rank$r.err" || fail "rank $r ran a trial before the job round"
    done
    grep -h "ranks disagree" "$work/rank0.err" ;;
  wrong-world)
    rc=0; "$cli" --model "$model" --device cpu --rank 2 --world-size 2 >"$work/a.out" 2>"$work/a.err" || rc=$?
    [ "$rc" = 2 ] || fail "--rank 2 --world-size 2 exited $rc"
    grep -q "expected a rank in \[0, 2) for world size 2 (--world-size), but got 2 (--rank)" "$work/a.err" \
      || fail "message: $(cat "$work/a.err")"
    rc=0; RANK=3 WORLD_SIZE=2 "$cli" --model "$model" --device cpu >"$work/b.out" 2>"$work/b.err" || rc=$?
    [ "$rc" = 2 ] || fail "RANK=3 WORLD_SIZE=2 exited $rc"
    grep -q "but got 3 (RANK)" "$work/b.err" || fail "message: $(cat "$work/b.err")"
    echo "wrong world size: exit 2" ;;
  *) fail "unknown case $case_name" ;;
esac
