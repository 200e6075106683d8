#!/usr/bin/env bash
# The CPU dry run of the one device call (scripts/device/gpu.sh), as .ci/run makes it: the same
# phases and their [time] lines, on the CPU build and package of scripts/build.sh (no second
# build, no install): check.sh's gpu tests (skipped without a GPU), the CLI's job on the small
# decoder with its fresh-process checks, and python.sh's tests/python/test_cuda.py (skipped
# without a GPU). Results in $OUT (default build/device-dry-run). Exit non-zero when a phase fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/../env.sh"
export AUTOBATCH_DEVICE_SKIP_BUILD=1 AUTOBATCH_DEVICE_SKIP_INSTALL=1 AUTOBATCH_DEVICE_TARGET=cpu \
  AUTOBATCH_DEVICE_BUILD_DIR="$AUTOBATCH_BUILD_DIR" AUTOBATCH_DEVICE_PYTHON="$AUTOBATCH_PYTHON" \
  AUTOBATCH_DEVICE_MODELS_DIR="$AUTOBATCH_ROOT/models" AUTOBATCH_DEVICE_MODELS=decoder_lm_small \
  AUTOBATCH_DEVICE_LIMIT=256MiB OUT="${OUT:-$AUTOBATCH_BUILD_DIR/device-dry-run}"
bash "$here/gpu.sh"
