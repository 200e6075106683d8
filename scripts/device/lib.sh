# shellcheck shell=bash disable=SC2154,SC2034
# Settings and helpers shared by the device scripts (check.sh, python.sh), sourced once they set
# `root` (the checkout) and cd there. Settings: OUT (made), python, budget, build, build_type,
# debs (see check.sh's header for the variables). The helpers need `summary` (the summary file),
# `t_start` ($SECONDS at the start) and `failures` (0), set by the script before its first phase.

OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
python="${AUTOBATCH_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3 || echo "$python")"
budget="${AUTOBATCH_DEVICE_SECONDS:-280}"
build="${AUTOBATCH_DEVICE_BUILD_DIR:-$root/build-device}"
build_type="${AUTOBATCH_DEVICE_BUILD_TYPE:-RelWithDebInfo}"
debs="$root/.debs/root"

# record PHASE PASS|FAIL SECONDS DETAIL: one summary line, written at once (a run killed by the
# device tool's timeout still leaves the lines so far).
record() {
  local line
  line="$(printf '%-16s %-4s %4s s  %s' "$1" "$2" "$3" "$4")"
  [ "$2" = PASS ] || failures=$((failures + 1))
  echo "$line" >>"$summary"
  echo "== $line"
}

# time_for CAP: seconds a phase may take: CAP, cut to what the budget has left less 8 s for the
# summary; prints nothing (and fails) when under 10 s would be left.
time_for() {
  local left=$((budget - (SECONDS - t_start) - 8))
  [ "$left" -ge 10 ] || return 1
  echo $(($1 < left ? $1 : left))
}

# run_logged LOG SECONDS CMD...: CMD under `timeout`, its output appended to LOG; returns its exit.
run_logged() {
  local log="$1" secs="$2"
  shift 2
  echo "+ (timeout ${secs}s) $*" >>"$log"
  timeout --kill-after=10 "$secs" "$@" >>"$log" 2>&1
}
