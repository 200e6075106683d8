#!/usr/bin/env bash
# Regenerates the real-model table of docs/search.md: guided and binsearch on mlp_8x2048 (1 GiB),
# ResNet-50 (the demo), MobileNetV3-Large, decoder_lm_small and vgg11_cifar (700 MiB), on the CPU
# budget allocator (scripts/bench/search_real.py). Builds autobatch and exports the models first.
# Wall times are measured: run it on a quiet machine. Extra arguments go to search_real.py (e.g.
# --cases mlp_8x2048.pt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../env.sh"
bash "$AUTOBATCH_ROOT/scripts/build.sh" >/dev/null
t0=$SECONDS
cd "$AUTOBATCH_ROOT"
"$AUTOBATCH_PYTHON" scripts/bench/search_real.py --autobatch "$AUTOBATCH_BUILD_DIR/bin/autobatch" \
  --models "$AUTOBATCH_ROOT/models" --md docs/search.md "$@"
echo "[time] search_real.py: $((SECONDS - t0)) s"
