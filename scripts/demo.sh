#!/usr/bin/env bash
# README's main-job command: builds autobatch, exports the real models (first run only), and finds
# the largest micro-batch of ResNet-50 (224x224 images, AdamW, fp32) and the accumulation plan for
# a target batch of 256. With a GPU it runs on the GPU; without one, on the CPU under a 3 GiB RAM
# budget (a few minutes on 2 cores). Extra arguments go to autobatch (e.g. --json report.json).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
# The library and the command only: the tests and the Python package are built by scripts/test.sh.
AUTOBATCH_BUILD_TARGETS=autobatch_cli bash "$here/build.sh" >&2
bin="$AUTOBATCH_BUILD_DIR/bin/autobatch"
"$bin" --version
args=(--model "$AUTOBATCH_ROOT/models/resnet50.pt" --target-batch 256)
if "$bin" --version | grep -q '^GPU: none seen'; then
  args+=(--device cpu --memory-limit 3GiB)
fi
echo "+ autobatch ${args[*]} $*"
exec "$bin" "${args[@]}" "$@"
