#!/usr/bin/env bash
# Runs a program and compares its standard output with a committed golden file
# (tests/golden/README.md): a mismatch fails with `diff -u` (the hunk header gives the line
# numbers). With AUTOBATCH_UPDATE_GOLDEN=1 the file is rewritten from the output instead.
# Usage: golden_output_test.sh GOLDEN_FILE PROGRAM [ARGS...]
set -euo pipefail
golden="$1"
shift
actual="$(mktemp)"
trap 'rm -f "$actual"' EXIT
"$@" >"$actual"
if [ "${AUTOBATCH_UPDATE_GOLDEN:-}" = 1 ]; then
  cp "$actual" "$golden"
  echo "rewrote $golden"
  exit 0
fi
if ! diff -u --label "$golden (expected)" --label "actual: $*" "$golden" "$actual"; then
  echo "the output differs from $golden; an intended change: rerun with AUTOBATCH_UPDATE_GOLDEN=1" \
    "and review git diff" >&2
  exit 1
fi
