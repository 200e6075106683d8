"""One rank of find_sharded inside a running job (issue 43 item 3), run by torchrun (2 CPU ranks,
gloo): every rank calls find_sharded with the job's process group in place and writes what it
ended with to OUT/rank-<r>.json.

  ok:   each rank sizes itself, the ranks agree, one real step verifies;
  fail: rank 1's verification step is made to fail on purpose (out of memory before its first
        collective), so rank 0 waits in FSDP2's all-gather: both must end with the ModelError
        naming rank 1 within the verification's timeout, neither hangs;
  asym: rank 1 alone passes a bad verify_timeout: it refuses it, rank 0 names rank 1's error
        as soon as its own search is done (no wait in new_group or at the store), and a second,
        right call on both agrees and verifies.
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autobatch  # noqa: E402
import tiny_models  # noqa: E402

TIMEOUT_S = 10  # the verification's group timeout


def main(out, mode):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    if mode == "fail" and rank == 1:
        from autobatch._distributed import _in_job as _sharded_job

        def failing(*args, **kwargs):
            raise torch.OutOfMemoryError("made to fail on purpose: rank 1's verification step")
        _sharded_job._lock_step = failing
    def find(timeout):
        return autobatch.find_sharded(tiny_models.ShardedMlp, tiny_models.shard_units,
                                      tiny_models.sharded_mlp_batch(),
                                      step=tiny_models.sharded_mlp_step,
                                      optimizer=tiny_models.adamw, memory_limit="24MiB",
                                      margin=0.15, device="cpu", target_batch=1024,
                                      verify_timeout=timeout)
    t0 = time.monotonic()
    doc = {}
    if mode == "asym":  # rank 1 alone gives a bad argument, then both call again, rightly
        try:
            find(-1 if rank == 1 else TIMEOUT_S)
            doc["first"] = "ok"
        except autobatch.AutobatchError as e:
            doc["first"] = f"{type(e).__name__}: {e}"
        doc["first_seconds"] = time.monotonic() - t0
    try:
        r = find(TIMEOUT_S)
        doc.update({"ok": True, "micro_batch": r.micro_batch, "own": r.result.safe_micro_batch,
                    "sharded": r.to_dict()})
    except autobatch.AutobatchError as e:
        doc.update({"ok": False, "error": type(e).__name__, "message": str(e)})
    doc["seconds"] = time.monotonic() - t0
    doc["rank"] = rank
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
