#!/bin/bash
# A Slurm job that checks, before training, that the planned batch fits on every GPU it landed
# on: one autobatch task per GPU searches on its own GPU, the tasks agree on the smallest
# micro-batch (through a c10d TCPStore on the job's first node), and the job stops with a non-zero
# exit when the plan does not fit (3), a task failed, or a task died (4) — before hours of training.
#
#   sbatch examples/slurm/preflight.sh            (edit the #SBATCH lines, MODEL, TARGET first)
#
#SBATCH --job-name=train-with-preflight
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --time=04:00:00
set -euo pipefail
MODEL="${MODEL:-model.pt}"          # scripts/autobatch_export.py writes it
TARGET="${TARGET:-1024}"            # effective (global) batch
OUT="${OUT:-preflight-$SLURM_JOB_ID}"
mkdir -p "$OUT"

# Each task: rank SLURM_PROCID of SLURM_NTASKS, GPU cuda:SLURM_LOCALID (--device cuda), store on
# the first node of SLURM_JOB_NODELIST at port 15000 + SLURM_JOB_ID mod 10000 (or --master-port).
# When Slurm gives each task only its own GPU (--gpus-per-task), use --device cuda:0 instead.
# --ddp: the training wraps the model in DistributedDataParallel (its gradient buckets count).
rc=0
srun --kill-on-bad-exit=0 bash -c '
    autobatch --model "$0" --device cuda --target-batch "$1" --ddp --rank-timeout 600 \
      --json "$2/rank$SLURM_PROCID.json" --env >"$2/rank$SLURM_PROCID.env"' \
    "$MODEL" "$TARGET" "$OUT" || rc=$?
if [ "$rc" != 0 ]; then   # 3 does not fit, 4 ranks could not agree, 2 usage, 1 model error
  echo "preflight failed (exit $rc): see $OUT/rank*.json (status, error); not training" >&2
  exit "$rc"
fi

# Every rank agreed on the same plan; rank 0's lines are everyone's.
# shellcheck disable=SC1091
. "$OUT/rank0.env"
echo "plan: $AUTOBATCH_PLAN, micro-batches $AUTOBATCH_MICRO_BATCHES x $AUTOBATCH_WORLD_SIZE ranks = $AUTOBATCH_EFFECTIVE_BATCH"

srun python train.py --micro-batch "$AUTOBATCH_MICRO_BATCH" \
  --accumulation-steps "$AUTOBATCH_ACCUM_STEPS" --micro-batches "$AUTOBATCH_MICRO_BATCHES"
