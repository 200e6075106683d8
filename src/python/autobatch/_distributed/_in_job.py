"""find_sharded inside a running job (issue 43 item 3): every rank of a torchrun job calls it with
the job's real process group in place, and no rank ever waits in a collective for one that
failed.

1. Each rank sizes itself: its model is sharded on a mesh over a fake process group made beside
   the real one (`new_group(backend="fake")`, the job's own ranks), so FSDP2 allocates what this
   rank allocates in the job while its collectives return at once; the search is find()'s.
2. The ranks agree on the smallest safe micro-batch through the job's store (_ranks.py: no
   collective, so a rank whose search failed still answers, and every rank raises).
3. One real lock-step step verifies it: the model sharded on a mesh over a new group of the real
   backend with `verify_timeout` seconds as its timeout, `steps_per_trial` steps at the agreed
   micro-batch under the same memory limit (the CPU budget; on CUDA the device's own memory).
   Each rank then writes its outcome to the store and waits for every rank's: a rank that ran
   out of memory (or raised) inside the step leaves the others waiting in an FSDP2 collective
   until the group's timeout, after which they report too, so every rank ends within about
   `verify_timeout` seconds (3 x at most: the step's timeout, then the store's wait of 2 x), with
   one error naming each failed rank and its message.
"""

from __future__ import annotations

import datetime
import gc
import importlib
import itertools
import traceback

import torch

from .. import _find, _fsdp, _session
from .._errors import ModelError, UsageError
from .._meter import Meter
from .._optimizers import _optimizer_factory
from .._options import _autocast, _bytes
from .._ranks import search_and_agree
from .._step_output import default_loss
from .._trial import call_model, leading_size, make_batch

_ROUNDS = itertools.count()  # each verification has its own store keys
# The meshes' dimension names. Two DeviceMeshes over the same ranks compare and hash equal
# whatever their process groups, unless their names differ, and torch keeps meshes in tables
# keyed by them: an unnamed mesh over the real group got the fake mesh back, so the verification's
# parameters carried the fake group (measured: "Could not resolve the process group registered
# under the name 1" once it was destroyed), and a second find_sharded call in one job got the
# first call's destroyed fake group back the same way. Every mesh of ours has a name of its own.
_MESHES = itertools.count()


def mesh_names(kind):
    """A 1-D mesh's dimension names no other mesh has: ("autobatch_<kind>_<n>",)."""
    return (f"autobatch_{kind}_{next(_MESHES)}",)


def size_on_job(build_on, example_batch, options, device, verify_timeout, job=None):
    """(this rank's Result, the agreed micro-batch), verified by one real step on every rank.
    `build_on(mesh)` -> the model built, sharded on `mesh` and materialized on `device`; `job()`
    what the ranks compare before any trial (_ranks.compare_job)."""
    dist = torch.distributed
    n = dist.get_world_size()
    try:  # registers the "fake" backend
        importlib.import_module("torch.testing._internal.distributed.fake_pg")
    except ImportError as e:
        raise UsageError(
            f"find_sharded needs torch's fake process group "
            f"(torch.testing._internal.distributed.fake_pg), which torch "
            f"{torch.__version__} does not import: {e}"
        ) from None
    fake = dist.new_group(backend="fake")  # every rank calls it: new_group is collective
    try:
        result, agreed = _size_and_agree(build_on, fake, example_batch, options, device, n, job)
    finally:
        dist.destroy_process_group(fake)
        _fsdp.forget_meshes()  # else the verification's parameters would carry the fake mesh
    from torch.distributed.device_mesh import DeviceMesh

    verify(
        lambda group: build_on(
            DeviceMesh.from_group(group, device.type, mesh_dim_names=mesh_names("verify"))
        ),
        example_batch,
        options,
        device,
        agreed,
        verify_timeout,
    )
    return result, agreed


def join_and_raise(error, who="find_sharded"):
    """A rank that refused its own arguments still takes the steps every rank takes before the
    verification (the fake group's creation, which is collective, the job round and the
    agreement), so the
    others are not left waiting in new_group or at the store; the agreement then fails on every
    rank: this one raises `error`, the others an error naming this rank and it."""
    dist = torch.distributed
    importlib.import_module("torch.testing._internal.distributed.fake_pg")
    fake = dist.new_group(backend="fake")

    def search():
        raise error

    # The job round too (its error sent: no rank compares), so that the rounds stay in step.
    try:
        search_and_agree(search, dist.get_world_size(), None, who, job=search)
    finally:
        dist.destroy_process_group(fake)
    raise error  # not reached: the agreement fails with this rank's -1


def _size_and_agree(build_on, fake, example_batch, options, device, n, job=None):
    """This rank's search on its model sharded over the fake group, then the agreement."""
    from torch.distributed.device_mesh import DeviceMesh

    def search():
        model = build_on(
            DeviceMesh.from_group(fake, device.type, mesh_dim_names=mesh_names("fake"))
        )
        try:
            with _session.collectives_never_wait():
                return _find.find(model, example_batch, world_size=n, device=device, **options)
        finally:
            del model
            gc.collect()

    return search_and_agree(search, n, device, "find_sharded", job=job)


def verify(
    build_on,
    example_batch,
    options,
    device,
    micro_batch,
    timeout_s,
    who="find_sharded",
    setup_bytes=None,
):
    """The real lock-step step at `micro_batch` on every rank (see the module's docstring);
    returns when every rank's step ran, else raises the same ModelError on every rank.
    `build_on(group)` -> the model to step, its collectives on `group` (a new group of the job's
    backend); `setup_bytes()`: on the CPU, the bytes the model held before the budget allocator
    was installed (None: the model is built under it)."""
    dist = torch.distributed
    timeout = datetime.timedelta(seconds=timeout_s)
    group = dist.new_group(backend=dist.get_backend(), timeout=timeout)
    error = None
    try:
        _lock_step(
            lambda: build_on(group), example_batch, options, device, micro_batch, setup_bytes
        )
    except Exception as e:  # noqa: BLE001  out of memory, a collective's timeout, the model's
        error = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.clear_frames(e.__traceback__)  # the step's tensors are not kept alive by it
        del e
    finally:
        gc.collect()
    try:
        # the others may wait in a collective up to `timeout` before they write: twice it
        failures = _exchange(error, 2 * timeout)
    finally:
        dist.destroy_process_group(group)
        _fsdp.forget_meshes()
    if failures:
        raise ModelError(
            _failure_message(failures, micro_batch, timeout_s, who), micro_batch=micro_batch
        )


def _failure_message(failures, micro_batch, timeout_s, who):
    """One text for every rank: the ranks whose step failed first, then those that only timed out
    waiting for them in a collective."""
    waited = [(r, why) for r, why in failures if "timed out" in why.lower()]
    failed = [(r, why) for r, why in failures if (r, why) not in waited] or waited
    text = "; ".join(f"rank {r}: {why}" for r, why in failed)
    if failed is not waited and waited:
        text += (
            f"; rank(s) {', '.join(str(r) for r, _ in waited)} timed out waiting for "
            f"{'it' if len(failed) == 1 else 'them'} in a collective"
        )
    memory = any("OutOfMemoryError" in why or "out of memory" in why for _, why in failed)
    advice = (
        "the search's answer does not hold on the real job: the collective backend's own "
        "buffers are not in its figures; give a larger margin="
        if memory
        else "the step raised an error that is not out of memory"
    )
    return (
        f"{who}: the real step at the agreed micro-batch {micro_batch} failed within "
        f"the verification's {timeout_s} s: {text}; {advice}"
    )


def _lock_step(build, example_batch, options, device, micro_batch, setup_bytes=None):
    """`steps_per_trial` training steps of the model `build()` returns at `micro_batch` as
    find()'s trial runs them (precision's autocast around forward and loss, the output kept
    through backward unless keep_output=False, zero_grad as asked), under the CPU budget's memory
    limit on the CPU; `setup_bytes()` as verify() takes it."""
    autocast, _ = _autocast(device, options.get("precision"))
    meter = None
    try:
        if device.type == "cpu":
            meter = Meter.cpu(
                _bytes(options.get("memory_limit"), "memory_limit"),
                _bytes(options.get("reserve"), "reserve"),
            )
            # a model built under it is counted by it; one built before, by what it holds
            meter.finish_setup(setup_bytes() if setup_bytes is not None else 0)
        model = build()
        params = [p for p in model.parameters() if p.requires_grad]
        make_optimizer, _ = _optimizer_factory(options.get("optimizer"), params)
        optimizer = make_optimizer()
        step, loss_fn = options.get("step"), options.get("loss_fn")
        keep_output = options.get("keep_output", True)
        batch = make_batch(example_batch, micro_batch, leading_size(example_batch), device)
        if meter is not None:
            meter.begin()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with torch.enable_grad():
            for _ in range(options.get("steps_per_trial", 2)):
                output = None
                with autocast():
                    if step is not None:
                        loss = step(model, batch)
                    else:
                        output = call_model(model, batch)
                        loss = (
                            loss_fn(output, batch) if loss_fn is not None else default_loss(output)
                        )
                if not keep_output:
                    output = None
                loss.backward()
                del loss, output
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=options.get("zero_grad", "none") == "none")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            _check_cuda_use(device, options)
    finally:
        if meter is not None:
            meter.end()
            meter.remove()


def _check_cuda_use(device, options):
    """On CUDA the real step runs on the whole card, so a memory_limit below it is checked after
    the steps: the device's use at their peak (what its driver holds outside the caching allocator
    now, plus the allocator's peak reserved bytes, as tests/python/helpers/eager_check.py reads
    it) must stay within the limit less the reserve, else the answer does not hold under the limit
    (without it, the collective backend's buffers could take the answer past the limit and the
    check pass). Raises torch.OutOfMemoryError, which verify() reports as
    memory."""
    limit = _bytes(options.get("memory_limit"), "memory_limit")
    if not limit:
        return
    room = limit - _bytes(options.get("reserve"), "reserve")
    free, total = torch.cuda.mem_get_info(device)
    outside = total - free - torch.cuda.memory_reserved(device)
    use = outside + torch.cuda.max_memory_reserved(device)
    if use > room:
        raise torch.OutOfMemoryError(
            f"CUDA out of memory under memory_limit: the real step used {use} bytes of {device} "
            f"({outside} outside the caching allocator, {use - outside} its peak reserved), more "
            f"than the limit less the reserve, {room} bytes"
        )


def _exchange(error, timeout):
    """[(rank, message)] of the ranks whose step failed, from the job's store: this rank writes
    its outcome, then waits for every rank's within `timeout`; a rank that wrote nothing in that
    time is a failure too."""
    dist = torch.distributed
    store = dist.distributed_c10d._get_default_store()  # as _ranks.py: no collective
    rank, n = dist.get_rank(), dist.get_world_size()
    prefix = f"autobatch/verify/{next(_ROUNDS)}/"
    mine = "ok" if error is None else error
    store.set(f"{prefix}{rank}", mine)
    keys = [f"{prefix}{r}" for r in range(n)]
    try:
        store.wait(keys, timeout)
    except RuntimeError:  # DistStoreError: some rank never wrote
        pass
    failures = []
    for r, key in enumerate(keys):
        if not store.check([key]):
            failures.append(
                (
                    r,
                    f"no outcome within {timeout.total_seconds():.0f} s (it died, "
                    "or is still in its step)",
                )
            )
            continue
        outcome = store.get(key).decode()
        if outcome != "ok":
            failures.append((r, outcome))
    return failures


# The longest verify_timeout: gloo refuses a timeout beyond about 1e13 s and datetime one beyond
# 1e14 s, after the whole search; a million seconds (11.6 days) is more than any job waits.
MAX_VERIFY_TIMEOUT_S = 1e6


def check_timeout(verify_timeout):
    """UsageError unless `verify_timeout` is finite seconds in (0, MAX_VERIFY_TIMEOUT_S]."""
    if (
        isinstance(verify_timeout, bool)
        or not isinstance(verify_timeout, (int, float))
        or not 0 < verify_timeout <= MAX_VERIFY_TIMEOUT_S
    ):
        raise UsageError(
            f"verify_timeout: expected seconds > 0 and at most "
            f"{MAX_VERIFY_TIMEOUT_S:.0f} (an int or a float), but got "
            f"{verify_timeout!r}"
        )


def check_job(world_size, ranks):
    """UsageError for arguments that do not fit a running job: the world size is the job's, and
    each rank sizes itself."""
    dist = torch.distributed
    n = dist.get_world_size()
    if world_size not in (None, n):
        raise UsageError(
            f"world_size: this process is rank {dist.get_rank()} of a job of {n} "
            f"ranks, and find_sharded was asked for {world_size!r}; inside a job "
            "pass world_size=None (the job's), or size other world sizes from one "
            "process before the job starts"
        )
    if ranks is not None:
        raise UsageError("ranks: inside a job each rank sizes itself; pass ranks=None")
