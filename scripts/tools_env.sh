#!/usr/bin/env bash
# The tools environment (requirements-docs.txt: mkdocs, mkdocstrings, ruff, mypy), made once and
# found again by the hash of that file; prints its Python. A changed requirements file gets a fresh
# one; an interrupted install is never taken as ready (the marker is written last).
# Usage: py="$(bash scripts/tools_env.sh)"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
req="$AUTOBATCH_ROOT/requirements-docs.txt"
venv="$AUTOBATCH_ENV_ROOT/venv-tools-$(sha256sum "$req" | cut -c1-12)"
if [ ! -f "$venv/.autobatch-complete" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --progress-bar off -r "$req" >&2
  touch "$venv/.autobatch-complete"
fi
echo "$venv/bin/python"
