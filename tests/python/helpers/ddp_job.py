"""One rank of find_ddp inside a running job (issue 43 item 3, DDP), run by torchrun (2 CPU ranks,
gloo): every rank calls find_ddp with its module before wrapping it and writes what it ended with
to OUT/rank-<r>.json.

  ok:      each rank sizes itself, the ranks agree, one real DDP step verifies; then this rank's
           own DDP loop (the module wrapped over the job's group, the user's loop as written) at
           the agreed micro-batch, under the same budget: it must fit;
  fail:    rank 1's verification step is made to fail on purpose (out of memory before its
           first collective), so rank 0 waits in DDP's all-reduce: both must end with the
           ModelError naming rank 1 within the verification's timeout, neither hangs;
  wrapped: the module passed already wrapped in DistributedDataParallel: a UsageError on every
           rank, before any search;
  asym:    rank 1 alone passes a misspelt DDP argument: rank 1 refuses it, rank 0 names rank 1's
           error at once (no wait for the store's timeout); then both call again, rightly, and
           agree (the agreements' rounds stayed in step);
  view:    gradient_as_bucket_view=True: the answer holds in the user's own loop with it;
  differ:  rank 1 alone asks for another target_batch: a UsageError on every rank, before any
           trial, naming target_batch and both values; then both call again, rightly, and agree.
The ranks' weights differ (seeded by rank) and the user's gradients are set before the call: both
must be bitwise as before after it.
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
LIMIT = "48MiB"


def own_loop(model, micro_batch, **ddp_kwargs):
    """The user's DDP loop at `micro_batch`, two steps, under the same budget (True: it fit):
    the module wrapped over the job's group, forward, cross-entropy, backward, AdamW step."""
    from autobatch import _budget
    from autobatch._options import _bytes
    from torch.nn.parallel import DistributedDataParallel
    from autobatch._state import live_storages
    backend = _budget.backend(_bytes(LIMIT, "limit"), 0)
    # Every tensor this process holds counts, the model's and the rest (this script's copy of
    # the weights), as find_ddp's baseline counts them.
    backend.finish_setup(sum(n for _, n, _ in live_storages(torch.device("cpu"))))
    try:
        x, y = tiny_models.sharded_mlp_batch()  # the batch counted, as the job's loader's
        x, y = x.repeat(micro_batch, 1), y.repeat(micro_batch)
        ddp = DistributedDataParallel(model, **ddp_kwargs)
        optimizer = tiny_models.adamw(ddp.parameters())
        for _ in range(2):
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        ddp = optimizer = x = y = None
        import gc
        gc.collect()
        backend.remove()


def find(model, target_batch=1024, **kwargs):
    return autobatch.find_ddp(model, tiny_models.sharded_mlp_batch(),
                              step=tiny_models.sharded_mlp_step, optimizer=tiny_models.adamw,
                              memory_limit=LIMIT, margin=0.15, target_batch=target_batch,
                              verify_timeout=TIMEOUT_S, **kwargs)


def main(out, mode):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(rank)  # the ranks' weights differ: DDP's broadcast from rank 0 must be undone
    model = tiny_models.ShardedMlp()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)  # the user's gradients, to be left as they are
    if mode == "wrapped":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    if mode == "fail" and rank == 1:
        from autobatch._distributed import _in_job as _sharded_job

        def failing(*args, **kwargs):
            raise torch.OutOfMemoryError("made to fail on purpose: rank 1's verification step")
        _sharded_job._lock_step = failing
    kwargs = {"gradient_as_bucket_view": True} if mode == "view" else {}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.monotonic()
    doc = {}
    if mode in ("asym", "differ"):
        try:
            if mode == "asym":
                find(model, ddp_kwargs={"bucket_size_mb": 25} if rank == 1 else None)
            else:
                find(model, target_batch=2048 if rank == 1 else 1024)
            doc["first"] = "ok"
        except autobatch.AutobatchError as e:
            doc["first"] = f"{type(e).__name__}: {e}"
        doc["first_seconds"] = time.monotonic() - t0
    try:
        r = find(model, ddp_kwargs=kwargs)
        doc.update({"ok": True, "micro_batch": r.micro_batch, "own": r.result.safe_micro_batch,
                    "own_max": r.result.max_micro_batch, "job": r.result.raw["job"],
                    "plan": str(r.plan),
                    "trials": [[t.micro_batch_size, t.outcome, t.peak_bytes]
                               for t in r.result.trials]})
    except autobatch.AutobatchError as e:
        doc.update({"ok": False, "error": type(e).__name__, "message": str(e)})
    doc["seconds"] = time.monotonic() - t0
    plain = model.module if mode == "wrapped" else model
    doc["restored"] = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    doc["grads_kept"] = all(p.grad is not None and bool((p.grad == 0.5).all())
                            for p in plain.parameters())
    if doc["ok"]:
        for p in model.parameters():
            p.grad = None
        doc["own_loop"] = {b: own_loop(model, b, **kwargs) for b in
                           (doc["micro_batch"], doc["own_max"], doc["own_max"] + 1)}
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
