#!/usr/bin/env bash
# Runs clang-format (check only) and clang-tidy on our sources, never on LibTorch; fails on findings.
# Needs a configured build tree with compile_commands.json (scripts/test.sh makes one).
# Usage: scripts/lint.sh [files...]   (default: every tracked .cpp/.h under src, include, tests)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
cd "$AUTOBATCH_ROOT"

# A missing comma in .clang-tidy silently disables whole groups: the count catches it.
expected_checks=138
enabled=$(clang-tidy-14 --list-checks 2>/dev/null | tail -n +2 | grep -c .)
if [ "$enabled" -ne "$expected_checks" ]; then
  echo "lint: .clang-tidy enables $enabled checks, expected $expected_checks (fix .clang-tidy, or" \
       "update expected_checks in scripts/lint.sh when a check was added on purpose)"
  exit 1
fi

if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'include/*.h' 'tests/*.cpp' 'tests/*.h' \
                       'examples/*.cpp' | grep -v '^tests/fixtures/')
fi
echo "lint: clang-format on ${#files[@]} files"
clang-format-14 --dry-run --Werror "${files[@]}"

db="$AUTOBATCH_BUILD_DIR/compile_commands.json"
[ -f "$db" ] || { echo "lint: $db missing: run scripts/test.sh first"; exit 1; }
mapfile -t tus < <(printf '%s\n' "${files[@]}" | grep '\.cpp$' \
                   | while read -r f; do grep -q "\"file\": \"$AUTOBATCH_ROOT/$f\"" "$db" && echo "$f"; done)
echo "lint: clang-tidy on ${#tus[@]} translation units"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! printf '%s\n' "${tus[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy-14 -p "$AUTOBATCH_BUILD_DIR" \
     --quiet --extra-arg=-Wno-unknown-warning-option >"$log" 2>&1; then
  grep -v 'warnings generated' "$log"
  echo "lint: clang-tidy findings above"
  exit 1
fi
echo "lint: clean"
