#!/usr/bin/env bash
# One rank of the preflight (started by torchrun --no-python; see preflight_then_train.sh).
# autobatch reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT itself.
set -euo pipefail
exec autobatch --model "$MODEL" --device cuda --target-batch "$TARGET" --ddp --rank-timeout 600 \
  --json "$OUT/rank$RANK.json" --env >"$OUT/rank$RANK.env"
