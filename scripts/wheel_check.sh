#!/usr/bin/env bash
# One wheel for every torch, checked as a user meets it (issue: pip install wherever torch is).
# scripts/wheel.sh builds and repairs the wheel once; then, for each torch the package supports at
# its ends and where the project is pinned, a fresh virtual environment gets that same wheel file
# with `pip install` (timed; ninja, its one dependency besides torch, from PyPI) and runs
# tests/python/helpers/wheel_check.py there: a CPU `find` under a memory_limit, the budget module
# compiled on first use into a fresh extension cache, and fresh-process check_batch of the answer
# (fits) and of one more (out of memory). With --tests, the package's pytest file
# tests/python/test_find.py runs in the lowest environment too (the pinned and the newest torch run
# the whole suite in scripts/test.sh and scripts/test_newest.sh).
#
# Each fresh environment takes torch from an environment that has it, through a .pth file naming
# that environment's site-packages (the torch wheels with their CUDA libraries are 3-5 GB each; a
# copy per run would be the download, not the check):
#   torch 2.11.0  the project's environment (requirements.txt)
#   newest        requirements-newest.txt's (scripts/test_newest.sh makes it; skipped if absent)
#   2.6.0         the lowest claimed (README): $AUTOBATCH_ENV_ROOT/venv-torch-2.6.0, made here
#                 from PyPI the first time (about 3 GB)
# Last, the command's CMake build is configured against the lowest torch and must refuse it
# (cmake/AutobatchTorch.cmake fences the C++ build to the LibTorch versions CI builds).
# Usage: scripts/wheel_check.sh [--tests] [wheel (default: build one with scripts/wheel.sh)]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
tests=0
if [ "${1:-}" = "--tests" ]; then tests=1; shift; fi
wheel="${1:-}"
if [ -z "$wheel" ]; then
  bash "$here/wheel.sh"
  wheel="$(cat "$AUTOBATCH_ROOT/dist/WHEEL")"
fi
lowest=2.6.0
work="$(mktemp -d /tmp/autobatch-wheel-check.XXXXXX)"
echo "wheel_check: $(basename "$wheel"), work folder $work"

lowest_env() {  # the lowest claimed torch's environment, made once
  local venv="$AUTOBATCH_ENV_ROOT/venv-torch-$lowest"
  if [ ! -f "$venv/.autobatch-complete" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    # transformers as requirements.txt pins it: test_find.py sizes tiny Hugging Face models.
    "$venv/bin/python" -m pip install -q --progress-bar off "torch==$lowest" numpy pytest \
      "$(grep -E '^transformers==' "$AUTOBATCH_ROOT/requirements.txt")"
    touch "$venv/.autobatch-complete"
  fi
  echo "$venv/bin/python"
}

envs=("2.11.0:$AUTOBATCH_PYTHON")
newest="$(ls -d "$AUTOBATCH_ENV_ROOT"/venv-newest-*/ 2>/dev/null | head -1 || true)"
if [ -n "$newest" ] && [ -f "$newest/.autobatch-complete" ]; then
  envs+=("newest:${newest}bin/python")
else
  echo "wheel_check: no newest-torch environment (scripts/test_newest.sh makes it): skipped"
fi
envs+=("$lowest:$(lowest_env)")

failed=0
for entry in "${envs[@]}"; do
  label="${entry%%:*}" source_py="${entry#*:}"
  venv="$work/venv-$label"
  python3 -m venv "$venv"
  site="$("$source_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  fresh_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # Every package of that environment but autobatch (an installed copy there would satisfy the
  # requirement, and pip would install nothing), by links in a folder of its own.
  shared="$work/shared-$label"
  mkdir -p "$shared"
  for entry in "$site"/*; do
    case "$(basename "$entry")" in autobatch | autobatch-*) continue ;; esac
    ln -s "$entry" "$shared/"
  done
  echo "$shared" >"$fresh_site/torch-from-elsewhere.pth"
  t0=$(date +%s.%N)
  "$venv/bin/python" -m pip install -q --progress-bar off "$wheel" >"$work/$label-install.log" 2>&1 ||
    { cat "$work/$label-install.log"; exit 1; }
  printf '[time] pip install of the wheel (torch %s): %.1f s\n' "$label" \
    "$(echo "$(date +%s.%N) - $t0" | bc)"
  where="$(cd "$work" && "$venv/bin/python" -c 'import autobatch, os; print(os.path.dirname(autobatch.__file__))')"
  case "$where" in "$venv"/*) ;; *) echo "wheel_check: autobatch imported from $where"; exit 1 ;; esac
  rc=0
  (cd "$work" && AUTOBATCH_EXTENSIONS_DIR="$work/extensions-$label" OMP_NUM_THREADS=1 \
    "$venv/bin/python" "$AUTOBATCH_ROOT/tests/python/helpers/wheel_check.py") || rc=$?
  [ "$rc" -eq 0 ] || failed=1
  # The pinned torch's pytest suite runs in the fast tier (scripts/test.sh) and the newest's in
  # scripts/test_newest.sh, both whole: here only the lowest's.
  if [ "$tests" = 1 ] && [ "$label" = "$lowest" ]; then
    (cd "$work" && AUTOBATCH_EXTENSIONS_DIR="$work/extensions-$label" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
      "$AUTOBATCH_ROOT/tests/python/test_find.py" 2>&1 | tail -3) || failed=1
  fi
done
# The command's C++ build, unlike the package, is fenced to the LibTorch versions CI builds
# (cmake/AutobatchTorch.cmake): against the lowest torch the package supports it must stop at
# configure with its message, before anything compiles.
fence="$work/fence"
lowest_prefix="$("$(lowest_env)" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if cmake -S "$AUTOBATCH_ROOT" -B "$fence" -G Ninja -DCMAKE_PREFIX_PATH="$lowest_prefix" \
     -DAUTOBATCH_BUILD_TESTS=OFF >"$fence.log" 2>&1; then
  echo "wheel_check: the command's build accepted torch $lowest"; failed=1
elif ! tr -s ' \n' '  ' <"$fence.log" | grep -q "the versions CI builds"; then  # CMake wraps lines
  echo "wheel_check: the command's build failed against torch $lowest without the fence's message"
  tail -20 "$fence.log"; failed=1
else
  echo "wheel_check: the command's build refuses torch $lowest at configure, as it should"
fi
[ "$failed" = 0 ] && echo "wheel_check: ok" || { echo "wheel_check: FAILED"; exit 1; }
