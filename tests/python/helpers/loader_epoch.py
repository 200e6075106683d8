"""The truth for sizing on the loader (test_loader.py): the user's own plain loop, run in a fresh
process with the CPU budget allocator installed before anything is built (fresh_budget.py's
rule), AdamW with PyTorch's defaults (find's default optimizer).

  python loader_epoch.py epoch KIND LIMIT_BYTES B   one epoch of loader_data.loader(KIND, B)
  python loader_epoch.py worst KIND LIMIT_BYTES B   steps on the worst batch of B samples the
                                                    loader can build (a shuffled epoch may):
                                                    collate_fn of its B costliest samples

Prints {"failed_batch": k (0-based, the batch that ran out of memory) or null, "shape": that
batch's input_ids shape, "batches": the batches run}.

  python loader_epoch.py find KIND LIMIT_BYTES [first | N]

autobatch.find on the loader (with `first`, on its first batch; with N, loader_batches=N) in a
fresh process too, printed as {"max", "safe", "data"}.
"""
import json
import sys

import torch

from autobatch import _budget

import loader_data as D


def train(kind, limit, size, worst):
    backend = _budget.backend(limit, 0)
    backend.finish_setup(0)  # from here every CPU tensor counts, the model's too
    failed, shape, done = None, None, 0
    try:
        model = D.model()
        opt = torch.optim.AdamW(model.parameters())
        loader = D.loader(kind, size)
        if worst:
            ds = loader.dataset
            top = sorted(range(len(ds)), key=lambda k: -ds[k]["input_ids"].shape[0])[:size]
            # Two steps (Adam's state), each batch collated anew while the previous one is still
            # held by the loop's variable, as a loader's next batch is.
            batches = (loader.collate_fn([ds[k] for k in top]) for _ in range(2))
        else:
            batches = loader
        batch = None
        for k, batch in enumerate(batches):
            failed, shape = k, list(batch["input_ids"].shape)
            model(**batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            failed, done = None, k + 1
    except torch.OutOfMemoryError:
        pass
    finally:
        backend.remove()
    print(json.dumps({"failed_batch": failed, "shape": shape if failed is not None else None,
                      "batches": done}))


def find(kind, limit, how=None):
    import autobatch

    loader = D.loader(kind)
    extra = {"loader_batches": int(how)} if how not in (None, "first") else {}
    r = autobatch.find(D.model(), next(iter(loader)) if how == "first" else loader,
                       memory_limit=limit, device="cpu", progress=False, **extra)
    print(json.dumps({"max": r.max_micro_batch, "safe": r.safe_micro_batch, "data": r.data}))


if __name__ == "__main__":
    mode, kind, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "find":
        find(kind, limit, sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        train(kind, limit, int(sys.argv[4]), worst=mode == "worst")
