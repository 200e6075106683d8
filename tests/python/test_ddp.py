"""autobatch.find_ddp (issue 43 item 3, DDP): the ranks of a DistributedDataParallel job size
themselves without a collective, agree through the store, and verify with one real DDP step.
The job cases are torchrun jobs on 2 CPU ranks (gloo, the slow tier); the argument checks need no
job. Each test names the wrong implementation it catches."""
import pytest
import torch
import torch.distributed as dist

import autobatch
import tiny_models


def _find_ddp(model, **options):
    return autobatch.find_ddp(model, tiny_models.sharded_mlp_batch(),
                              step=tiny_models.sharded_mlp_step, memory_limit="48MiB", **options)


# Catches: find_ddp outside a job searching anyway (each rank would answer alone, with nothing
# verified) instead of pointing to find(ddp=True, world_size=N); and inside torch's fake group
# taking it for a job.
def test_outside_a_job_it_points_to_find_with_ddp():
    with pytest.raises(autobatch.UsageError, match=r"inside a running job.*ddp=True, world_size=N"):
        _find_ddp(tiny_models.ShardedMlp())
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with pytest.raises(autobatch.UsageError, match="inside a running job"):
            _find_ddp(tiny_models.ShardedMlp())
    finally:
        dist.destroy_process_group()


# Catches: a module already wrapped in DistributedDataParallel searched as it is (its reducer's
# all-reduce in every trial's backward: ranks trying different batches wait for each other), or
# refused without saying what to pass instead.
def test_a_module_already_wrapped_is_refused_naming_its_module():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(tiny_models.ShardedMlp())
        with pytest.raises(autobatch.UsageError, match=r"already wrapped.*model\.module"):
            _find_ddp(wrapped)
    finally:
        dist.destroy_process_group()


# Catches: DDP arguments passed through unchecked (a misspelt one, a value of the wrong type or
# device_ids on a CPU module would raise inside DDP's constructor only in the verification, after
# the whole search; options whose hooks outlive the wrapper accepted), the verification's own
# group replaced by the user's, find()'s world_size or ddp taken twice, a timeout torch cannot
# hold (inf: OverflowError after the search), and eval= (the verification trains).
@pytest.mark.parametrize("kwargs, match", [
    ({"ddp_kwargs": {"bucket_size_mb": 25}},
     r"ddp_kwargs: not DistributedDataParallel's.*bucket_size_mb"),
    ({"ddp_kwargs": {"process_group": None}}, r"ddp_kwargs: process_group is find_ddp's own"),
    ({"ddp_kwargs": [("bucket_cap_mb", 25)]}, r"ddp_kwargs: expected a dict"),
    ({"world_size": 2}, r"world_size is the job's number of ranks"),
    ({"ddp": True}, r"ddp is always True here"),
    ({"verify_timeout": 0}, r"verify_timeout: expected seconds > 0"),
    ({"verify_timeout": float("inf")}, r"verify_timeout: expected seconds > 0 and at most"),
    ({"ddp_kwargs": {"bucket_cap_mb": "25"}}, r"bucket_cap_mb expects megabytes > 0"),
    ({"ddp_kwargs": {"gradient_as_bucket_view": "no"}}, r"gradient_as_bucket_view expects True"),
    ({"ddp_kwargs": {"device_ids": [0]}}, r"device_ids is for a module on one CUDA device"),
    # unchecked, these two would fail only in the verification, after the whole search, as a
    # ModelError without a result
    ({"ddp_kwargs": {"bucket_cap_mb": float("inf")}}, r"bucket_cap_mb expects megabytes > 0"),
    ({"ddp_kwargs": {"output_device": "cpu"}}, r"output_device is for a module on one CUDA"),
    ({"ddp_kwargs": {"param_to_hook_all_reduce": torch.nn.Parameter(torch.ones(1))}},
     r"param_to_hook_all_reduce is not supported by find_ddp"),
    ({"eval": "only"}, r"eval: find_ddp sizes and verifies the training step only"),
    ({"verify_timeout": True}, r"verify_timeout: expected seconds > 0"),
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs, match):
    with pytest.raises(autobatch.UsageError, match=match):
        _find_ddp(tiny_models.ShardedMlp(), **kwargs)


# In a 2-rank torchrun job (tests/python/helpers/ddp_job.py). Catches:
# ok: ranks that keep their own answers instead of the smallest; a search that counts DDP's
#     buckets or the batch wrongly (the answer then is not the boundary of the user's own DDP loop
#     under the same budget: that loop fits at the agreed and at the rank's max micro-batch, and
#     not one above the max); a module left changed by the verification (DDP's broadcast from
#     rank 0 over ranks whose weights differ, the steps' updates, the user's gradients summed
#     into: all must be bitwise as before);
# fail: a failed verification step that leaves the other rank waiting in DDP's collectives (a
#     hang until the group's timeout, 120 s here) or ends it without naming the failed rank;
# wrapped: a module already wrapped searched (a hang) instead of refused on every rank;
# asym: a bad argument on one rank raised before the agreement (the other waited the store's
#     timeout, 120 s, told only that a rank "died or is still searching", and the next call was
#     paired with the wrong round);
# view: gradient_as_bucket_view=True searched without the bucket (the buckets exist from the
#     wrapper's construction and hold the gradients: the answer ran out of memory in the real
#     step);
# differ: ranks with different targets that each planned their own (issue 68: one backward per
#     step on one rank, two on the other), instead of refusing on every rank before any trial.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ok", "fail", "wrapped", "asym", "view", "differ"])
def test_the_ranks_of_a_ddp_job_size_agree_and_verify_or_all_end(tmp_path, mode):
    import torchrun
    offset = {"ok": 120, "fail": 140, "wrapped": 160, "asym": 180, "view": 100,
              "differ": 200}[mode]
    done, ranks = torchrun.run(tmp_path, "ddp_job.py", mode, port_offset=offset, timeout=300)
    assert done.returncode == 0 and len(ranks) == 2, done.stderr[-3000:]
    assert all(r["restored"] and r["grads_kept"] for r in ranks), ranks
    if mode in ("ok", "asym", "view", "differ"):
        assert all(r["ok"] and r["job"]["verified"] for r in ranks), ranks
        agreed = {r["micro_batch"] for r in ranks}
        assert len(agreed) == 1 and agreed.pop() == min(r["own"] for r in ranks) > 0, ranks
        for r in ranks:
            loop = {int(b): fits for b, fits in r["own_loop"].items()}
            assert loop[r["micro_batch"]] and loop[r["own_max"]], r
            if mode != "view":  # with views the search counts the gradients twice: not exact
                assert not loop[r["own_max"] + 1], r
        if mode == "asym":
            by_rank = sorted(ranks, key=lambda r: r["job"]["rank"])
            assert by_rank[1]["first"].startswith("UsageError: ddp_kwargs: not "), by_rank
            assert "rank 1: UsageError: ddp_kwargs: not" in by_rank[0]["first"], by_rank
            assert by_rank[0]["first_seconds"] < 60, by_rank  # not the store's 120 s timeout
        if mode == "differ":
            for r in ranks:
                assert r["first"].startswith("UsageError: find_ddp: the ranks disagree on "
                                             "target_batch: rank 0 has '1024', rank 1 has "
                                             "'2048'"), r
                assert r["first_seconds"] < 60, r
        return
    for r in ranks:
        assert not r["ok"], ranks
        if mode == "wrapped":
            assert r["error"] == "UsageError" and "already wrapped" in r["message"], r
            continue
        assert r["error"] == "ModelError", r
        assert "rank 1" in r["message"] and "made to fail on purpose" in r["message"], r
        assert r["seconds"] < 120, r  # well before the job's own group timeout
