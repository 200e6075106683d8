#!/usr/bin/env bash
# The docs site: `mkdocs build --strict` (mkdocs.yml) into site/ (ignored), in the tools
# environment (requirements-docs.txt, scripts/tools_env.sh). Strict: a broken link between pages,
# a page missing from the nav or a reference mkdocstrings cannot resolve fails the build.
# Usage: scripts/docs.sh [serve]   (serve: a live preview on 127.0.0.1:8000 instead)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
py="$(bash "$here/tools_env.sh")"
cd "$AUTOBATCH_ROOT"
if [ "${1:-}" = serve ]; then
  NO_MKDOCS_2_WARNING=1 exec "$py" -m mkdocs serve
fi
NO_MKDOCS_2_WARNING=1 "$py" -m mkdocs build --strict --site-dir "$AUTOBATCH_ROOT/site"
