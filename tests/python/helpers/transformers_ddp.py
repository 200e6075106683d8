"""One rank of the fit_training_arguments DDP test, run by torchrun (2 CPU ranks, gloo):
python -m torch.distributed.run --nproc-per-node 2 transformers_ddp.py OUT TARGET LIMIT0 LIMIT1
Each rank sizes the tiny Llama under its own memory limit and writes OUT/rank-<r>.json: its own
safe micro-batch, the agreed arguments, the DDP bucket bytes its trials held."""
import json
import os
import sys
import tempfile

import torch  # noqa: F401  (before autobatch, as the package does)
from transformers import TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch.transformers as abt  # noqa: E402
import tiny_models  # noqa: E402

out, target, limits = sys.argv[1], int(sys.argv[2]), sys.argv[3:5]
rank = int(os.environ["RANK"])
model, example = tiny_models.llama()
with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to=[])
    sized, result = abt.fit_training_arguments_with_result(args, model, example, target,
                                                           memory_limit=limits[rank], margin=0)
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"own": result.safe_micro_batch, "micro_batch": sized.per_device_train_batch_size,
               "accumulation": sized.gradient_accumulation_steps, "world_size": args.world_size,
               "ddp_bucket_bytes": result.memory.get("ddp_bucket_bytes", 0)}, f)
