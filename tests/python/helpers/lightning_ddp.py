"""One rank of the AutobatchFinder DDP test, run by torchrun (2 CPU ranks, gloo):
python -m torch.distributed.run --nproc-per-node 2 lightning_ddp.py OUT TARGET LIMIT0 LIMIT1
Each rank sizes under its own memory limit, trains one short epoch with the agreed sizes and
writes OUT/rank-<r>.json: its own safe micro-batch, the agreed one, the accumulation, the batch
sizes the fit loop gave training_step."""
import json
import os
import sys

import torch  # noqa: F401  (before autobatch, as the package does)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch.lightning  # noqa: E402
import lightning_models as lm  # noqa: E402

out, target, limits = sys.argv[1], int(sys.argv[2]), sys.argv[3:5]
finder = autobatch.lightning.AutobatchFinder(target_batch=target, margin=0,
                                             memory_limit=lambda rank: limits[rank])
model, data = lm.Net(), lm.Data()
trainer = lm.trainer(finder, devices=2, strategy="ddp")
trainer.fit(model, datamodule=data)
rank = trainer.global_rank
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"own": finder.result.safe_micro_batch, "micro_batch": finder.micro_batch,
               "accumulation": trainer.accumulate_grad_batches, "seen": model.seen,
               "batch_size": data.batch_size, "world_size": trainer.world_size,
               "ddp_bucket_bytes": finder.result.memory.get("ddp_bucket_bytes", 0)}, f)
