#!/usr/bin/env bash
# Runs autobatch N times inside a fresh cgroup v1 memory cgroup with a given limit and prints, per
# run, the exit code and whether the kernel OOM-killed it (memory.oom_control's oom_kill count).
# The process guard must keep every run alive: a kill is a bug. Needs root and the cgroup v1
# memory controller (this machine kind has both); the cgroup is removed at the end.
#   scripts/bench/cgroup_runs.sh LIMIT_BYTES RUNS [--cold] -- AUTOBATCH_ARGS...
#   --cold  evicts the --model file from the page cache before each run (posix_fadvise DONTNEED):
#           the cgroup then holds the file's cache, which the kernel reclaims as the process grows.
# Example (docs/trial_runner.md, "the process guard"):
#   scripts/bench/cgroup_runs.sh 681574400 9 --cold -- --model models/resnet50.pt --input 3x64x64 --max-trials 3
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 3 ] || { echo "usage: $0 LIMIT_BYTES RUNS [--cold] -- AUTOBATCH_ARGS..." >&2; exit 2; }
limit="$1" runs="$2"
shift 2
cold=0
[ "${1:-}" = --cold ] && { cold=1; shift; }
[ "${1:-}" = -- ] && shift
model=""
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [ "${args[i]}" = --model ] && model="${args[i + 1]:-}"
done
own="$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)"
[ -n "$own" ] || { echo "no cgroup v1 memory controller for this process" >&2; exit 2; }
cg="/sys/fs/cgroup/memory${own%/}/autobatch-runs-$$"
mkdir "$cg" || exit 2
trap 'rmdir "$cg" 2>/dev/null' EXIT
echo "$limit" >"$cg/memory.limit_in_bytes" || exit 2
bin="${AUTOBATCH_BIN:-$root/build/bin/autobatch}"
cd "$root" || exit 2
kills() { awk '/^oom_kill /{print $2}' "$cg/memory.oom_control"; }
for ((run = 1; run <= runs; ++run)); do
  if [ "$cold" = 1 ] && [ -n "$model" ]; then
    python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$model"
  fi
  before="$(kills)"
  log="$(mktemp)"
  (echo "$BASHPID" >"$cg/cgroup.procs" && exec "$bin" "${args[@]}") >"$log" 2>&1
  rc=$?
  result="$(grep -E '^  (max|safe) micro-batch' "$log" | tr -s ' ' | tr '\n' ';')"
  echo "run $run: exit $rc, oom kills $(($(kills) - before)); $result"
  rm -f "$log"
done
