"""autobatch.find_sharded (issue 43): one rank of an FSDP2 job of any world size, sized from one
process under torch's fake process group, on the CPU with real out-of-memory from the budget
allocator. Each test names the wrong implementation it catches."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import autobatch
import tiny_models
from autobatch._distributed import _layout

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "helpers")
ROOT = os.path.dirname(os.path.dirname(HERE))


def find_mlp(world_size, limit="24MiB", **options):
    return autobatch.find_sharded(tiny_models.ShardedMlp, tiny_models.shard_units,
                                  tiny_models.sharded_mlp_batch(), world_size=world_size,
                                  step=tiny_models.sharded_mlp_step, optimizer=tiny_models.adamw,
                                  memory_limit=limit, device="cpu", **options)


def fresh(world, rank, limit, *batches):
    """{B: outcome} of the user's own FSDP2 loop in a fresh process (fresh_sharded.py)."""
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "fresh_sharded.py"), str(world),
                          str(rank), limit, *map(str, batches)], check=True, capture_output=True,
                         text=True, timeout=600)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


# Catches: FSDP2 left midway after a trial that ran out of memory inside forward or backward
# (without _fsdp.reset the next trial's forward skips its all-gather and fails with "mixed
# torch.Tensor and DTensor", a ModelError), an answer that is not the boundary of the user's own
# loop in a fresh process (sharded bytes missed or counted twice, the previous trial's unsharded
# parameters still held), and a process group left behind.
def test_the_answer_is_exact_against_the_users_own_loop_in_a_fresh_process():
    r = find_mlp(4, target_batch=1024)
    assert not dist.is_initialized()
    b = r.max_micro_batch
    outcomes = {t.outcome for t in r.result.trials}
    assert "out-of-memory" in outcomes and b > 8, r
    fits = {t.micro_batch_size for t in r.result.trials if t.outcome == "fits"}
    oom = {t.micro_batch_size for t in r.result.trials if t.outcome == "out-of-memory"}
    assert b in fits and b + 1 in oom, r.result.text
    assert fresh(4, 0, "24MiB", b, b + 1) == {b: "fits", b + 1: "out-of-memory"}
    # the plan is for the global batch over the 4 ranks
    assert r.plan.world_size == 4 and r.plan.effective_batch == 1024


# Catches: shard bytes taken from the global parameters (a world of 64 would look 64 times
# larger), or from the rows a rank owns instead of FSDP2's padded storage, or a layout whose
# classes miss the last ranks (their rows run short: 503 rows in chunks of 8 leave rank 62 with 7
# and rank 63 with none).
def test_a_tiny_llama_rank_of_64_is_sized_with_fsdp2s_padded_shard_bytes():
    pytest.importorskip("transformers")
    ids = torch.randint(0, 503, (1, 32), generator=torch.Generator().manual_seed(0))
    r = autobatch.find_sharded(tiny_models.sharded_llama, tiny_models.shard_units,
                               {"input_ids": ids, "labels": ids}, world_size=64,
                               optimizer=tiny_models.adamw, memory_limit="12MiB", device="cpu")
    assert not dist.is_initialized()
    model = tiny_models.sharded_llama()  # the global shapes
    expected = sum(math.ceil(p.shape[0] / 64) * (p.numel() // p.shape[0]) * p.element_size()
                   for p in model.parameters())
    rank0 = r.ranks[0]
    assert rank0.rank == 0 and rank0.parameter_bytes == expected
    assert r.result.memory["parameter_bytes"] == expected  # measured from the storages
    assert expected < sum(p.numel() * p.element_size() for p in model.parameters()) / 32
    # the last rank's own rows, from torch.chunk's rule
    last = sum(_layout.shard_rows(p.shape[0], 64, 63) * (p.numel() // p.shape[0]) *
               p.element_size() for p in model.parameters())
    classes = {tuple(c["ranks"]): c for c in r.layout}
    assert sum(c["count"] for c in r.layout) == 64
    assert any(c["ranks"][-1] == 63 and c["local_parameter_bytes"] == last for c in r.layout), \
        classes
    assert r.safe_micro_batch > 0 and r.to_dict()["ranks"][0]["parameter_bytes"] == expected


# Catches: a rank choice that sizes every class (64 searches for a world of 64) or drops the
# largest; the claim that a rank with smaller shards allocates no more (if it were wrong, rank
# 3's answer would be below rank 0's).
def test_only_uncovered_ranks_are_sized_and_a_smaller_shard_fits_no_less():
    r = find_mlp(4)
    assert [x.rank for x in r.ranks] == [0]
    assert [c["ranks"] for c in r.layout] == [[0, 2], [3, 3]]
    both = find_mlp(4, ranks=[0, 3])
    assert [x.rank for x in both.ranks] == [0, 3]
    rank0, rank3 = both.ranks
    assert rank3.local_parameter_bytes < rank0.local_parameter_bytes
    assert rank3.parameter_bytes == rank0.parameter_bytes  # padded alike
    assert rank3.result.max_micro_batch >= rank0.result.max_micro_batch
    assert both.binding_rank == 0 and both.safe_micro_batch == rank0.result.safe_micro_batch


# Catches: chunking by floor (rank 3 of d=10 would own 2 rows and the padded storage 2), or
# ranks past the last chunk given rows; covered classes kept.
def test_shard_rows_and_classes_follow_torch_chunk():
    assert [_layout.shard_rows(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [_layout.shard_rows(2, 4, r) for r in range(4)] == [1, 1, 0, 0]
    params = [((10, 3), 0, 4), ((7,), None, 4)]
    classes = _layout.rank_classes(params, 4)
    assert [rs for _, rs in classes] == [[0, 1, 2], [3]]
    assert [rs for _, rs in _layout.ranks_to_size(classes)] == [[0, 1, 2]]
    # a class that is larger in one parameter and smaller in another is sized too
    crossing = [((9, 1), [0]), ((1, 9), [1]), ((1, 1), [2])]
    assert [rs for _, rs in _layout.ranks_to_size(crossing)] == [[0], [1]]


# Catches: bad arguments found only inside the search (or as torch's own errors), and a failed
# call that leaves the fake process group behind (the next call, or the user's
# init_process_group, would then fail).
@pytest.mark.parametrize("kwargs,words", [
    ({"world_size": 0}, "world_size: expected an int >= 1"),
    ({"world_size": None}, "None means the running job's, and this process is in no process"),
    ({"world_size": 4, "ranks": [4]}, "ranks: expected a non-empty list of ranks below"),
    ({"world_size": 4, "shard": lambda model: None}, "shard: expected a function called as"),
    ({"world_size": 4, "shard": lambda model, mesh: None}, "no module of the model is an FSDP2"),
    ({"world_size": 4, "build": lambda: 3}, "build: expected a function that returns"),
    ({"world_size": 4, "ddp": True}, "ddp does not apply"),
    ({"world_size": 4, "ranks": 3}, "ranks: expected a list of ranks"),
    ({"world_size": [2, 8], "target_batch": 1004}, "not a multiple of the world size 8"),
    ({"world_size": 4, "cache": True}, "cache: find_sharded does not use the result cache"),
    ({"world_size": 4, "verify_timeout": 0}, "verify_timeout: expected seconds > 0"),
    # unchecked, 2^31 - 1 exhausts memory in torch's fake group and 2^31 fails its cast
    ({"world_size": 2**31 - 1}, "world_size: expected an int >= 1 and <= 1048576"),
    # and a misspelt option, build and init of the wrong arity (raw TypeErrors, some late)
    ({"world_size": 4, "memry_limit": "8MiB"}, "find_sharded: no option 'memry_limit'"),
    ({"world_size": 4, "build": lambda config: None}, "build: expected a function called as"),
    ({"world_size": 4, "init": lambda: None}, "init: expected a function called as"),
    # a model built elsewhere than on the meta device: every rank would allocate it whole
    ({"world_size": 4, "build": lambda: torch.nn.Linear(3, 3, device="cpu")},
     "must construct the model there"),
])
def test_bad_arguments_are_usage_errors_and_leave_no_process_group(kwargs, words):
    args = {"build": tiny_models.ShardedMlp, "shard": tiny_models.shard_units}
    args.update(kwargs)
    build, shard = args.pop("build"), args.pop("shard")
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.find_sharded(build, shard, tiny_models.sharded_mlp_batch(),
                               step=tiny_models.sharded_mlp_step, memory_limit="24MiB",
                               device="cpu", **args)
    assert not dist.is_initialized()


# Catches: find_sharded run inside the user's own process group (it would replace or corrupt it).
def test_a_process_already_in_a_group_is_refused():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with pytest.raises(autobatch.UsageError, match="already in one"):
            find_mlp(4)
        assert dist.get_world_size() == 2  # the user's group untouched
    finally:
        dist.destroy_process_group()


# The one-process emulation against a real torchrun job on gloo, per rank (issue 43 item 5):
# catches an emulation that misses FSDP2 allocations of ranks above 0 or counts some twice.
@pytest.mark.slow
def test_emulated_peaks_match_each_real_gloo_rank():
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench",
                                                        "fsdp_fidelity.py"),
                           "--cases", "mlp,llama", "--worlds", "2"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


# Catches: a table whose rows are extrapolated from one measurement (each row here has its own
# trials and its own shard bytes), or planned for the wrong world size.
# Catches: a reset that leaves the all-gather output FSDP2 keeps through a forward for overlap
# (comm_ctx.all_gather_state) when out of memory stopped the forward midway: the next trial
# starts with one unit's unsharded parameters held (2.1 MB here), an overcount that can fail a
# batch that fits.
def test_a_forward_stopped_midway_leaves_no_all_gather_output_after_the_reset():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autobatch import _fsdp
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        model = tiny_models.ShardedMlp()
        tiny_models.shard_units(model, init_device_mesh("cpu", (4,)))

        def out_of_memory(module, args):
            raise torch.OutOfMemoryError("made on purpose, inside the second block's forward")
        hook = model.layers[1].up.register_forward_pre_hook(out_of_memory)
        with pytest.raises(torch.OutOfMemoryError):
            model(tiny_models.sharded_mlp_batch()[0])
        hook.remove()
        comm = model._get_fsdp_state()._comm_ctx
        assert comm.all_gather_state is not None  # what the forward left: the test's premise
        _fsdp.reset(_fsdp.fsdp_modules(model))
        assert comm.all_gather_state is None
        assert not _fsdp.check_internals(_fsdp.fsdp_modules(model))
    finally:
        dist.destroy_process_group()


# The plot: catches a table JSON without what scripts/plot_report.py draws (it would raise).
def test_a_table_along_the_world_size_measures_every_row(tmp_path):
    table = find_mlp([2, 8], target_batch=4096)
    assert [r.world_size for r in table.rows] == [2, 8]
    shard = {n: sum(math.ceil(p.shape[0] / n) * (p.numel() // p.shape[0]) * p.element_size()
                    for p in tiny_models.ShardedMlp().parameters()) for n in (2, 8)}
    for n in (2, 8):
        row = table[n]
        assert row.ranks[0].parameter_bytes == shard[n] and row.ranks[0].result.trials
        assert row.plan.world_size == n and row.plan.effective_batch == 4096
    # smaller shards leave more room: never a smaller answer at 8 ranks than at 2
    assert table[8].max_micro_batch > table[2].max_micro_batch
    doc = table.to_dict()
    assert doc["world_sizes"] == [2, 8] and doc["rows"][1]["ranks"][0]["parameter_bytes"] == shard[8]
    assert "world size" in str(table) and not dist.is_initialized()
    if importlib.util.find_spec("matplotlib") is None:
        return  # the plot script needs the project's environment (the newest torch's lacks it)
    (tmp_path / "table.json").write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_report.py"),
                           str(tmp_path / "table.json"), str(tmp_path / "table.png")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "table.png").stat().st_size > 10_000, done.stderr


# The budget allocator's split of a backend's bytes (scripts/bench/fsdp_fidelity.py reads it):
# catches a scope that is ignored, another thread's allocation counted as the step's, and a free
# that leaves its bytes set apart (the split would drift over a long step).
def test_the_budget_allocator_sets_a_backends_bytes_apart_while_they_are_held():
    import threading

    from autobatch import _budget, _core
    from autobatch._meter import Meter
    meter = Meter.cpu(1 << 34, 0)
    held = []
    try:
        meter.finish_setup(0)
        meter.begin()
        own = torch.empty(1 << 20, dtype=torch.uint8)
        _core.backend_scope(True)
        try:
            inside = torch.empty(3 << 20, dtype=torch.uint8)
        finally:
            _core.backend_scope(False)
        worker = threading.Thread(target=lambda: held.append(torch.empty(5 << 20,
                                                                         dtype=torch.uint8)))
        worker.start()
        worker.join()
        own_peak, apart = _budget.own_peak()
        assert apart == (3 << 20) + (5 << 20)
        del inside
        assert _budget.own_peak()[1] == 5 << 20
        peaks = meter.end()
        assert peaks["peak_allocated_bytes"] - own_peak == 8 << 20
        del own
    finally:
        held.clear()
        meter.remove()


def _raises(*args):
    raise KeyError("the user's own error")


# Catches: the user's own error in build, shard or init swallowed, turned into another, or leaving
# the fake process group behind (the next call would be refused as "already in one").
@pytest.mark.parametrize("where", ["build", "shard", "init"])
def test_the_users_error_in_build_shard_or_init_leaves_unchanged_and_leaves_no_group(where):
    args = {"build": tiny_models.ShardedMlp, "shard": tiny_models.shard_units, "init": None}
    args[where] = _raises
    with pytest.raises(KeyError, match="the user's own error"):
        autobatch.find_sharded(args["build"], args["shard"], tiny_models.sharded_mlp_batch(),
                               world_size=4, init=args["init"], step=tiny_models.sharded_mlp_step,
                               memory_limit="24MiB", device="cpu")
    assert not dist.is_initialized()


# Inside a running torchrun job (issue 43 item 3). Catches: a rank sizing through the real group
# (its FSDP2 collectives would wait for ranks that try other batches: a hang), ranks that keep
# their own answers instead of the smallest, and a failed verification step that leaves the
# other rank waiting in a collective (the job would hang until the group's timeout, 120 s here)
# or ends it without naming the rank.
# asym: a bad argument on one rank raised before the fake group's new_group (collective): the
# other rank waited there until the store's timeout.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ok", "fail", "asym"])
def test_the_ranks_of_a_job_size_agree_and_verify_or_all_end(tmp_path, mode):
    import torchrun
    offset = {"ok": 41, "fail": 61, "asym": 81}[mode]
    done, ranks = torchrun.run(tmp_path, "sharded_job.py", mode, port_offset=offset, timeout=300)
    assert done.returncode == 0 and len(ranks) == 2, done.stderr[-3000:]
    if mode == "asym":
        by_rank = sorted(ranks, key=lambda r: r["rank"])
        assert by_rank[1]["first"].startswith("UsageError: verify_timeout"), by_rank
        assert "another rank did not size (rank 1: UsageError: verify_timeout" in \
            by_rank[0]["first"], by_rank
        assert by_rank[0]["first_seconds"] < 60, by_rank  # not the store's 120 s timeout
    if mode in ("ok", "asym"):
        assert all(r["ok"] for r in ranks), ranks
        agreed = {r["micro_batch"] for r in ranks}
        assert len(agreed) == 1 and agreed.pop() == min(r["own"] for r in ranks) > 0, ranks
        assert all(r["sharded"]["verified"] for r in ranks)
        return
    for r in ranks:
        assert not r["ok"] and r["error"] == "ModelError", ranks
        assert "rank 1" in r["message"] and "made to fail on purpose" in r["message"], r
        assert r["seconds"] < 120, r  # well before the job's own group timeout


# Catches a call that leaves the process changed: torch's init_process_group wraps sys.excepthook
# ("[rank3]: ..." before every later traceback) and destroy_process_group does not unwrap it; the
# default init (reset_parameters) draws from torch's generator outside find()'s snapshot, so a
# seeded job that sized first built other weights. And a failing rank of a table says which world
# size and rank it was.
def test_the_process_is_left_as_it_was_and_a_failing_row_is_named():
    hook = sys.excepthook
    torch.manual_seed(0)
    expected = torch.randn(3)
    torch.manual_seed(0)
    find_mlp(2, max_batch=64)
    assert sys.excepthook is hook
    assert torch.equal(torch.randn(3), expected)
    with pytest.raises(autobatch.DoesNotFit, match="world size 2, rank 0: nothing fits"):
        find_mlp(2, limit="1MiB")
    assert not dist.is_initialized() and sys.excepthook is hook
