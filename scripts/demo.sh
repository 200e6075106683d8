#!/usr/bin/env bash
# README's main-job command: builds autobatch and runs it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
bash "$here/build.sh" >&2
"$AUTOBATCH_BUILD_DIR/bin/autobatch" --version
