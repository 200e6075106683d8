"""The trial: the user's own eager training step at micro-batch B, with its memory measured per
phase (inputs, forward, loss, backward, optimizer-step) as the C++ runner measures its own.

Out of memory (torch.OutOfMemoryError, the budget allocator's error, MemoryError) is caught here,
classified by the library's rules (autobatch/failure.h), turned into a plain record, and its
traceback frames cleared before control returns to the C++ search: a failed step's tensors stay
alive as long as the exception or its frames do.
"""
import logging
import time
import traceback

import torch

from . import _core
from ._errors import ModelError

log = logging.getLogger("autobatch")


# ---- batches --------------------------------------------------------------------------------

def leading_size(example):
    """The example's batch size: the leading dimension of its first tensor (dim >= 1)."""
    if isinstance(example, torch.Tensor):
        return example.shape[0] if example.dim() > 0 else None
    values = example.values() if isinstance(example, dict) else (
        example if isinstance(example, (list, tuple)) else ())
    for v in values:
        n = leading_size(v)
        if n:
            return n
    return None


def make_batch(example, size, n0, device):
    """A batch of `size` samples made from `example` along dimension 0: its samples repeated in
    order (so integer tensors keep their values: token ids, labels, masks), on `device`. Tensors
    whose leading dimension is not the example's batch size, and non-tensors, pass unchanged."""
    if isinstance(example, torch.Tensor):
        if example.dim() == 0 or example.shape[0] != n0:
            return example.to(device)
        index = torch.arange(size, device=example.device) % n0
        return example.index_select(0, index).to(device)
    if isinstance(example, dict):
        return type(example)({k: make_batch(v, size, n0, device) for k, v in example.items()})
    if isinstance(example, (list, tuple)):
        items = [make_batch(v, size, n0, device) for v in example]
        return type(example)(items) if isinstance(example, list) else tuple(items)
    return example


def call_model(model, batch):
    """model(**batch) for a dict (as Hugging Face models take it), model(*batch) for a tuple or
    list, model(batch) for a tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(*batch)
    return model(batch)


def default_loss(output, rule=None):
    """The loss when no loss_fn is given: the output's `.loss` (a transformers ModelOutput), its
    ["loss"] (a dict), a scalar output itself, a tuple's first element; else the mean of the
    output tensor (the `autobatch` command's default loss, "mean")."""
    rule = rule if rule is not None else []
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is not None:
        rule.append("model")  # the model computed it (the command's --loss model)
        return loss
    if isinstance(output, (list, tuple)) and output:
        return default_loss(output[0], rule)
    if isinstance(output, torch.Tensor):
        rule.append("model" if output.dim() == 0 else "mean")
        return output if output.dim() == 0 else output.float().mean()
    raise TypeError(
        f"the model returned {type(output).__name__}, from which no loss can be taken: expected "
        "a tensor, a tuple whose first element is one, or an output with .loss / ['loss']; pass "
        "loss_fn=lambda output, batch: ... to autobatch.find")


def state_bytes(optimizer):
    """Bytes of the distinct storages of the optimizer's state tensors (exp_avg, momentum, ...)."""
    seen, total = set(), 0
    for per_param in optimizer.state.values():
        for v in per_param.values():
            if isinstance(v, torch.Tensor) and v.numel() > 0:
                s = v.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    total += s.nbytes()
    return total


def _check_loss(loss, step):
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        what = (type(loss).__name__ if not isinstance(loss, torch.Tensor)
                else f"a tensor of shape {tuple(loss.shape)}, requires_grad={loss.requires_grad}")
        raise TypeError(f"step {getattr(step, '__qualname__', step)!r} returned {what}; expected "
                        "the micro-batch's loss: a scalar tensor that requires grad")


# ---- memory ---------------------------------------------------------------------------------

class CpuMeter:
    """The project's CPU budget allocator, installed in this process for the search: every CPU
    tensor allocated while it is in place is counted, and an allocation above the limit raises
    torch.OutOfMemoryError. Storages allocated before it (the model) enter as baseline bytes."""

    backend = "cpu-budget"

    def __init__(self, limit_bytes, reserve_bytes):
        self.budget = _core.Budget(limit_bytes, reserve_bytes)
        self.reserve_bytes = reserve_bytes

    def finish_setup(self, untracked_bytes):
        self.budget.finish_setup(untracked_bytes)

    def limit_bytes(self):
        return self.budget.limit_bytes() - self.reserve_bytes

    def limit_source(self):
        return self.budget.limit_source()

    def current_bytes(self):
        """Bytes the budget counts now (the baseline included)."""
        return self.budget.current_bytes()

    def begin(self):
        self.budget.begin_trial()

    def phase(self, name, size=0, micro=0, step=0):
        self.budget.set_point(name, size, micro, step)

    def end(self):
        self.budget.set_point("idle")
        return self.budget.end_trial()

    def release(self):
        self.budget.release_caches()

    def process_limit_near(self, peak_bytes, request_bytes):
        return self.budget.process_limit_near(peak_bytes, request_bytes)

    def warnings(self):
        return list(self.budget.limit_warnings())

    def remove(self):
        self.budget.remove()


class CudaMeter:
    """The CUDA caching allocator: peaks per phase from max_memory_allocated / max_memory_reserved
    with reset_peak_memory_stats between phases; a memory limit below the card is emulated with
    set_per_process_memory_fraction, as the C++ runner does (docs/trial_runner.md). Not yet run on
    a GPU (docs/python.md says so)."""

    backend = "cuda-caching"

    def __init__(self, device, limit_bytes, reserve_bytes):
        self.device = torch.device(device)
        self.index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.total = torch.cuda.get_device_properties(self.index).total_memory
        self.limit = limit_bytes or self.total
        self.reserve_bytes = reserve_bytes
        self.outside = 0
        self.fraction = None
        self.source = "memory_limit" if limit_bytes else "the device's total memory"

    def finish_setup(self, untracked_bytes):
        del untracked_bytes
        torch.cuda.synchronize(self.index)
        free, total = torch.cuda.mem_get_info(self.index)
        self.outside = max(0, (total - free) - torch.cuda.memory_reserved(self.index))
        usable = self.limit - self.reserve_bytes - self.outside
        if usable <= 0:
            raise ValueError(f"memory limit: {self.limit} bytes leave nothing for the trials after "
                             f"the reserve and the {self.outside} bytes outside the allocator")
        self.fraction = min(1.0, usable / self.total)
        torch.cuda.set_per_process_memory_fraction(self.fraction, self.index)

    def limit_bytes(self):
        return self.limit - self.reserve_bytes

    def limit_source(self):
        return self.source

    def current_bytes(self):
        """Bytes allocated by tensors on the device now."""
        return torch.cuda.memory_allocated(self.index)

    def begin(self):
        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)
        self.phases, self.current, self.max_reserved = [], None, 0

    def _close(self):
        if self.current is not None:
            torch.cuda.synchronize(self.index)
            peak = torch.cuda.max_memory_allocated(self.index)
            name, micro = self.current
            self.phases.append({"phase": name, "micro_batch_index": micro,
                                "peak_allocated_bytes": peak})
        self.max_reserved = max(self.max_reserved, torch.cuda.max_memory_reserved(self.index))
        torch.cuda.reset_peak_memory_stats(self.index)

    def phase(self, name, size=0, micro=0, step=0):
        del size, step
        self._close()
        self.current = None if name == "idle" else (name, micro)

    def end(self):
        self.phase("idle")
        merged = {}
        for p in self.phases:
            key = (p["phase"], p["micro_batch_index"])
            merged[key] = max(merged.get(key, 0), p["peak_allocated_bytes"])
        phases = [{"phase": k[0], "micro_batch_index": k[1], "peak_allocated_bytes": v}
                  for k, v in merged.items()]
        allocated = max(merged.values(), default=0)
        return {"peak_allocated_bytes": allocated, "peak_reserved_bytes": self.max_reserved,
                "peak_bytes": self.max_reserved + self.outside, "phase_peaks": phases}

    def release(self):
        torch.cuda.empty_cache()

    def process_limit_near(self, peak_bytes, request_bytes):
        del peak_bytes, request_bytes
        return False

    def warnings(self):
        return []

    def remove(self):
        torch.cuda.set_per_process_memory_fraction(1.0, self.index)
        torch.cuda.empty_cache()


# ---- the trial ------------------------------------------------------------------------------

class EagerProbe:
    """The probe the C++ search calls: probe(B, micro_batches_per_step) -> a plain dict."""

    def __init__(self, model, example, n0, device, make_optimizer, loss_fn, autocast, meter,
                 state, steps_per_trial, step=None, ddp_bytes=0):
        self.model, self.example, self.n0, self.device = model, example, n0, device
        self.step, self.ddp_bytes = step, ddp_bytes  # DDP's buckets held by every trial; 0: none
        self.make_optimizer, self.loss_fn, self.autocast = make_optimizer, loss_fn, autocast
        self.meter, self.state, self.steps = meter, state, steps_per_trial
        self.point = ("idle", 0, 0)
        self.interrupted = False
        self.largest_oom = 0
        self.model_error = None  # a step's error that is not out of memory, raised as ModelError
        self.count = 0
        self.optimizer_state_bytes = 0  # the largest seen after a step, for the report
        self.facts = None  # the report's facts (find's), updated after each trial
        self.loss_rule = None  # "model" or "mean": how default_loss took the loss
        self.bar = None  # a tqdm bar (find's progress option), one step per trial
        self.zero_grad = "none"  # "zeros": zero_grad(set_to_none=False), the gradients kept
        self.kept_grads = False  # the evaluation's training state holds the gradients

    def cancel(self):
        return self.interrupted

    def _enter(self, name, size, micro=0, step=0):
        self.point = (name, micro, step)
        self.meter.phase(name, size, micro, step)

    def forward_loss(self, batch, size, micro, step=0):
        """The user's forward and loss of one batch in the precision's autocast (phases "forward"
        then "loss"): (output, loss). With step= (the framework's forward and loss in one call)
        the output is the loss. Shared by the training step and the evaluation trial (_eval.py)."""
        self._enter("forward", size, micro, step)
        with self.autocast():
            if self.step is not None:
                loss = self.step(self.model, batch)
                self._enter("loss", size, micro, step)
                return loss, loss
            output = call_model(self.model, batch)
            self._enter("loss", size, micro, step)
            rule = []
            loss = (self.loss_fn(output, batch) if self.loss_fn is not None
                    else default_loss(output, rule))
            self.loss_rule = rule[0] if rule else self.loss_rule
            return output, loss

    def _steps(self, size, micro_batches, steps=None, keep=None):
        """The user's step, `steps` (default `self.steps`) times; returns completed steps and
        total ms. `keep`: a list that receives the optimizer (the evaluation's training state)."""
        optimizer = self.make_optimizer()
        if keep is not None:
            keep.append(optimizer)
        done, total_ms = 0, 0.0
        for step in range(self.steps if steps is None else steps):
            t0 = time.perf_counter()
            for micro in range(micro_batches):
                self._enter("inputs", size, micro, step)
                batch = make_batch(self.example, size, self.n0, self.device)
                output, loss = self.forward_loss(batch, size, micro, step)
                if self.step is not None:
                    _check_loss(loss, self.step)
                del output, batch  # dropped before backward, as a training_step returns the loss
                self._enter("backward", size, micro, step)
                (loss / micro_batches).backward()
                del loss
            if optimizer is not None:
                self._enter("optimizer-step", size, 0, step)
                optimizer.step()
                self.optimizer_state_bytes = max(self.optimizer_state_bytes,
                                                 state_bytes(optimizer))
                self._enter("idle", size, 0, step)
                optimizer.zero_grad(set_to_none=self.zero_grad == "none")
            else:
                self._enter("idle", size, 0, step)
                for p in self.state.params:
                    if self.zero_grad == "none" or p.grad is None:
                        p.grad = None
                    else:
                        p.grad.zero_()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            total_ms += (time.perf_counter() - t0) * 1000.0
            done += 1
        return done, total_ms

    def buckets(self, size):
        """DDP's gradient buckets (None without ddp): counted, and able to fail the trial."""
        if not self.ddp_bytes:
            return None
        self._enter("inputs", size)
        return torch.empty(self.ddp_bytes, dtype=torch.uint8, device=self.device)

    def _train(self, size, micro_batches):
        buckets = self.buckets(size)  # freed with the trial, as DDP's would be with the job
        done = self._steps(size, micro_batches)
        del buckets
        return done

    def __call__(self, size, micro_batches):
        return self.trial(size, micro_batches, self._train)

    def trial(self, size, micro_batches, body):
        """One trial: body(size, micro_batches) -> (steps completed, total ms) under the meter,
        its out-of-memory turned into a record (see the module's docstring)."""
        self.count += 1
        record = {"memory_limit_bytes": self.meter.limit_bytes(), "steps_completed": 0}
        failure = None
        self.meter.begin()
        try:
            done, total_ms = body(size, micro_batches)
            record["steps_completed"] = done
            record["step_ms"] = total_ms / done if done else 0.0
        except KeyboardInterrupt:
            self.interrupted = True
            record["cancelled"] = True
        except Exception as e:  # noqa: BLE001  torch.OutOfMemoryError is a RuntimeError
            failure = self._failure(e)
            traceback.clear_frames(e.__traceback__)
            if failure["kind"] not in ("out-of-memory", "size-limit"):
                self.model_error = e
            del e
        finally:
            if not self.kept_grads:
                for p in self.state.params:
                    p.grad = None
            self._enter("idle", size)
        peaks = self.meter.end()
        record.update(peaks)
        if failure is not None and failure["kind"] in ("out-of-memory", "size-limit"):
            record["outcome"] = failure["kind"]
            record["reason"] = failure["reason"]
            if failure["kind"] == "out-of-memory":
                record["failed_request_bytes"] = failure["failed_request_bytes"]
                record["failed_in_use_bytes"] = failure["failed_in_use_bytes"]
                record["failed_phase"], record["failed_micro_batch_index"], \
                    record["failed_step_index"] = failure["point"]
                self.largest_oom = max(self.largest_oom, size)
        self.state.restore_weights()
        self.meter.release()
        if self.facts is not None:
            self.facts["model"]["optimizer_state_bytes"] = self.optimizer_state_bytes
        if self.model_error is not None:
            error, self.model_error = self.model_error, None
            raise ModelError(f"the model raised an error at micro-batch {size} (not out of "
                             f"memory): {type(error).__name__}: {error}", micro_batch=size) from error
        self._log(size, micro_batches, record)
        return record

    def _failure(self, e):
        """The library's classification of a failed step (autobatch/failure.h)."""
        name, micro, step = self.point
        if isinstance(e, torch.OutOfMemoryError):
            kind = "out-of-memory"
        elif isinstance(e, MemoryError):
            kind = "bad-alloc"
        else:
            kind = "other"
        message = str(e)
        first = _core.classify(kind, message, True, True)
        near = self.meter.process_limit_near(0, first["failed_request_bytes"])
        c = _core.classify(kind, message, near, self.largest_oom > 0)
        c["point"] = (name if name != "idle" else "", micro, step)
        return c

    def _log(self, size, micro_batches, r):
        outcome = "cancelled" if r.get("cancelled") else r.get("outcome", "fits")
        where = f" in {r['failed_phase']}" if r.get("failed_phase") else ""
        peak = _core.format_bytes(int(r.get("peak_bytes", 0)))
        log.info("trial %d: micro-batch %d x%d: %s%s, peak %s", self.count, size, micro_batches,
                 outcome, where, peak)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"B={size} {outcome}{where}, peak {peak}")
