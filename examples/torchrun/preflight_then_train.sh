#!/usr/bin/env bash
# torchrun: a preflight run of autobatch on every rank (each on cuda:LOCAL_RANK), the ranks agree
# through torchrun's own store (TORCHELASTIC_USE_AGENT_STORE=True: every rank is a client of the
# agent's store at MASTER_ADDR:MASTER_PORT; otherwise rank 0 hosts one there), then training with
# the agreed plan. Stops with a non-zero exit before training when the plan does not fit.
#
#   NPROC=8 MODEL=model.pt TARGET=1024 examples/torchrun/preflight_then_train.sh
#   (multi-node: add torchrun's --nnodes/--rdzv-* options to both torchrun lines)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NPROC="${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
export MODEL="${MODEL:-model.pt}" TARGET="${TARGET:-1024}" OUT="${OUT:-preflight}"
mkdir -p "$OUT"

# --no-python: torchrun starts the rank script itself, with RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT set. torchrun exits non-zero when any rank does.
if ! torchrun --nproc-per-node "$NPROC" --no-python bash "$here/rank_preflight.sh"; then
  # Each rank's exit code (3 does not fit, 4 ranks could not agree, ...) is in its JSON.
  echo "preflight failed: see $OUT/rank*.json (status, exit_code, error); not training" >&2
  exit 3
fi
# shellcheck disable=SC1091
. "$OUT/rank0.env"
echo "plan: $AUTOBATCH_PLAN, micro-batches $AUTOBATCH_MICRO_BATCHES x $AUTOBATCH_WORLD_SIZE ranks = $AUTOBATCH_EFFECTIVE_BATCH"
torchrun --nproc-per-node "$NPROC" train.py --micro-batch "$AUTOBATCH_MICRO_BATCH" \
  --accumulation-steps "$AUTOBATCH_ACCUM_STEPS" --micro-batches "$AUTOBATCH_MICRO_BATCHES"
