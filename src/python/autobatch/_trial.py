"""The trial: the user's own eager training step at micro-batch B, with its memory measured per
phase (inputs, forward, loss, backward, optimizer-step) as the C++ runner measures its own.

Out of memory (torch.OutOfMemoryError, the budget allocator's error, MemoryError) is caught here,
classified by the library's rules (autobatch/vocabulary/failure.h), turned into a plain record, and
its traceback frames cleared before control returns to the C++ search: a failed step's tensors stay
alive as long as the exception or its frames do.
"""

import contextlib
import logging
import time
import traceback

import torch

from . import _core
from ._batches import call_model, leading_size, make_batch  # noqa: F401 (re-exported)
from ._collectives import CollectiveGuard, CollectiveInStep, refuse_collective_modules  # noqa: F401 (re-exported)
from ._errors import ModelError, UsageError
from ._measuring import MeasuringTrials
from ._residue import StepLog, storage_bytes, storage_ptrs
from ._step_errors import check_gradients, check_loss, hint, text_of
from ._step_output import KeptOutput, _check_loss_fn_result, default_loss, state_bytes  # noqa: F401 (re-exported)
from ._vocabulary import FITS, OUT_OF_MEMORY, POSSIBLE_OUT_OF_MEMORY, RETHROW, SIZE_LIMIT

log = logging.getLogger("autobatch")


class _TrialStopped(Exception):
    """Raised between a trial's steps when the search's deadline passed or it was cancelled
    (_core.trial_should_stop); `done` steps of `total_ms` ran whole before it."""

    def __init__(self, done, total_ms):
        super().__init__("trial stopped between steps")
        self.done, self.total_ms = done, total_ms


# ---- ranks that search on their own ------------------------------------------------------------


def _body_key(body):
    """The kind of trial a body runs ("_train", "_evaluate", ...), by name: never the function
    itself, whose closure may hold a trial's optimizer (the evaluation's resident state). A
    measuring trial's body is the training step's kind: an ambiguous failure in one is decided by
    the largest training fit, full or shortened."""
    name = getattr(body, "__name__", type(body).__name__)
    return "_train" if name == "_measure" else name


# ---- the trial ------------------------------------------------------------------------------


def exception_type(error) -> str:
    """The failure rules' name for an exception's type (_core.TrialEvidence.classify):
    torch.OutOfMemoryError "out-of-memory", MemoryError "bad-alloc", else "other"."""
    if isinstance(error, torch.OutOfMemoryError):
        return "out-of-memory"
    if isinstance(error, MemoryError):
        return "bad-alloc"
    return "other"


class EagerProbe(MeasuringTrials):
    """The probe the C++ search calls: probe(B, micro_batches_per_step) -> a plain dict."""

    def __init__(
        self,
        model,
        example,
        n0,
        device,
        make_optimizer,
        loss_fn,
        autocast,
        meter,
        state,
        steps_per_trial,
        step=None,
        ddp_bytes=0,
    ):
        self.model, self.example, self.n0, self.device = model, example, n0, device
        self.step, self.ddp_bytes = step, ddp_bytes  # DDP's buckets held by every trial; 0: none
        self.make_optimizer, self.loss_fn, self.autocast = make_optimizer, loss_fn, autocast
        self.meter, self.state, self.steps = meter, state, steps_per_trial
        self.point = ("idle", 0, 0)
        self.interrupted = False
        self.stopped_by = None  # the ModelError that ended the search (stopping_at_model_error)
        # What each kind of trial (_body_key: training and evaluation apart, as the runner's
        # evidence and eval_evidence) taught the next: _core.TrialEvidence, the command's rule
        # (src/probes/trial_evidence.h): the last out of memory and the largest fit, and the
        # verdict on a failure.
        self.evidence = {}
        self.count = 0
        self.optimizer_state_bytes = 0  # the largest seen after a step, for the report
        self.facts = None  # the report's facts (find's), updated after each trial
        self.loss_rule = None  # "model" or "mean": how default_loss took the loss
        self.bar = None  # a tqdm bar (find's progress option), one step per trial
        self.zero_grad = "none"  # "zeros": zero_grad(set_to_none=False), the gradients kept
        self.kept_grads = False  # the evaluation's training state holds the gradients
        self.keep_output = False  # True: the model's output alive through backward
        # Whole steps the running trial finished and their time, ms: a failed trial's record
        # counts them and gives their mean step_ms, as the command's does (trial_runner.cpp,
        # fillTrialResult).
        self.steps_done, self.steps_ms = 0, 0.0
        # The samples a measuring trial's first step runs forward and backward on, which makes the
        # optimizer's state (the search's min_batch; find sets it).
        self.state_batch = 1
        # What the training steps leave beyond their batch: whether a shortened trial's failure
        # stands for the full trial's (_residue.py); made anew at the first trial and the warm-up.
        self.residue = None
        self.replay_logs = []  # a measuring trial's two logs for its replayed peak (_replay.py)
        self.largest_full_fit = 0  # the largest size a full training trial fit (measure's low + 1)
        # The example's own storages, which make_batch passes unchanged into every batch.
        self.example_ptrs = storage_ptrs(example)
        self.sizes_seen = set()  # the batch sizes the model's forward has run on
        self.survivors = None  # _survivors.Survivors: tensors that outlive their trial (find's)
        self.holding = False  # the evaluation's training state is held between trials
        self.survivor_note = None  # its line in the meter's notes
        self.first_step_ms = None  # the running trial's first step, ms (_step_ms)
        self.first_step_excess = []  # (size, ms) of first steps far above the next (compiles)
        self.first_step_note = None
        self.gradients_seen = False  # a trainable parameter had a gradient after a backward
        # batches(size, device) -> a batch, in place of the example's rows repeated: a
        # concatenating collator's costliest samples (_loader.py), the soak's loader batches.
        self.batches = None

    def _batch(self, size):
        """The trial batch of `size` samples on the probe's device: the example's rows repeated
        (_batches.make_batch), or what `batches` makes."""
        if self.batches is not None:
            return self.batches(size, self.device)
        return make_batch(self.example, size, self.n0, self.device)

    def cancel(self):
        return self.interrupted or self.stopped_by is not None

    def stopping_at_model_error(self, size, micro_batches):
        """probe(size, micro_batches) for the search: a ModelError ends the search as a
        cancellation would (its verified sizes kept) and is kept in `stopped_by`, for find() to
        raise with the search's result (issue 40 row 12: ModelError.result was None)."""
        try:
            return self(size, micro_batches)
        except ModelError as e:
            self.stopped_by = e
            return {
                "cancelled": True,
                "memory_limit_bytes": self.meter.limit_bytes(),
                "steps_completed": 0,
                "reason": "the model raised an error",
            }

    def measuring_at_model_error(self, size, micro_batches):
        """stopping_at_model_error for a measuring trial (TrialRequest::measure: the guided
        search's second probe and short-aimed jumps, docs/search.md "Measuring trials")."""
        try:
            return self.measure(size, micro_batches)
        except ModelError as e:
            self.stopped_by = e
            return {
                "cancelled": True,
                "memory_limit_bytes": self.meter.limit_bytes(),
                "steps_completed": 0,
                "reason": "the model raised an error",
                "shortened": self.steps >= 2,
            }

    def _enter(self, name, size, micro=0, step=0):
        self.point = (name, micro, step)
        self.meter.phase(name, size, micro, step)

    def forward_loss(self, batch, size, micro, step=0):
        """The user's forward and loss of one batch in the precision's autocast (phases "forward"
        then "loss"): (output, loss). With step= (the framework's forward and loss in one call)
        the output is the loss. Shared by the training step and the evaluation trial (_eval.py)."""
        self._enter("forward", size, micro, step)
        self.sizes_seen.add(leading_size(batch))  # what a new size is (_residue.py, at_new_size)
        try:
            with self.autocast():
                if self.step is not None:
                    loss = self.step(self.model, batch)
                    self._enter("loss", size, micro, step)
                    if isinstance(loss, KeptOutput):
                        return loss, loss.loss
                    return loss, loss
                output = call_model(self.model, batch)
                self._enter("loss", size, micro, step)
                rule = []
                if self.loss_fn is not None:
                    loss = self.loss_fn(output, batch)
                    _check_loss_fn_result(loss)
                else:
                    loss = default_loss(output, rule)
                self.loss_rule = rule[0] if rule else self.loss_rule
                return output, loss
        finally:
            # The casts of the weights that autocast cached (ours, or the step's own autocast)
            # freed here, as the user's loop frees them when its outermost autocast exits: torch
            # empties the cache only then (torch/amp/autocast_mode.py, __exit__), and the trials
            # run inside find()'s own autocast(enabled=False), which kept every cast alive through
            # backward, the optimizer's step and the next batch (16 MiB more in each phase of two
            # Linear(2048, 2048) under amp-bf16, the casts' bytes).
            torch.clear_autocast_cache()

    def _check_step_loss(self, loss):
        """With step=, what it returned must be the micro-batch's loss (_step_errors.check_loss)."""
        if self.step is not None:
            check_loss(loss, self.step)

    def _steps(self, size, micro_batches, steps=None, keep=None, state_batch=0):
        """The user's step, `steps` (default `self.steps`) times; returns completed steps and
        total ms. `keep`: a list that receives the optimizer (the evaluation's training state).
        `state_batch` > 0: first the measuring trial's state-making step (measure()), not
        counted in the steps or their time."""
        optimizer = self.make_optimizer()
        if keep is not None:
            keep.append(optimizer)
        # The training body's residues (not the evaluation's held training step, `keep`).
        residue = self._residue() if keep is None else None
        if residue is not None:
            residue.begin()
        self.steps_done, self.steps_ms = 0, 0.0
        # A training loop's `x, y` (`for x, y in loader:`): each batch alive through its
        # backward and optimizer step until the next one is made, as the C++ runner holds its
        # inputs (trial_runner.cpp, held_inputs); released with the trial. Dropping it before
        # backward undercounted what the loop holds there and is not saved for backward (the
        # labels after the loss's backward: 8 bytes a sample put an MLP's answer 1 above the
        # plain loop's B*, scripts/bench/race.py).
        # A full trial at a size the model has not seen, after the search's first trial: its
        # first two steps' forward and backward logged, for whether a new size makes the model do
        # more (_residue.py, at_new_size).
        log = (
            StepLog()
            if (
                residue is not None
                and state_batch == 0
                and residue.residue is not None
                and self.meter.name == "cpu-budget"
                and size not in self.sizes_seen
            )
            else None
        )
        try:
            return self._run_steps(size, micro_batches, steps, optimizer, residue, state_batch, log)
        finally:
            if log is not None:
                log.close()  # a step that failed inside its log
            release = getattr(self.make_optimizer, "release_trial", None)
            if release is not None:
                release()  # the trial's optimizer (and its state) no longer held elsewhere

    def _run_steps(self, size, micro_batches, steps, optimizer, residue, state_batch, log):
        held = None  # the batch the loop holds (_steps); only here, so that the next one frees it
        kept = None  # a framework's step output held through the optimizer step (KeptOutput)
        if state_batch > 0:
            held = self._shortened_start(optimizer, size, micro_batches, state_batch, residue)
        done, total_ms = 0, 0.0
        made = 0
        for step in range(self.steps if steps is None else steps):
            if _core.trial_should_stop():  # the search's deadline or cancellation (row 15)
                raise _TrialStopped(done, total_ms)
            t0 = time.perf_counter()
            for micro in range(micro_batches):
                self._enter("inputs", size, micro, step)
                # A later step's (first micro-batch's) letting go of the previous batch, read where
                # the meter counts bytes (_residue.py; the caching allocator rounds them up).
                replacing = (
                    residue is not None
                    and micro == 0
                    and held is not None
                    and self.meter.name == "cpu-budget"
                )
                own = storage_bytes(held, self.example_ptrs) if replacing else 0
                batch = self._batch(size)
                if replacing:
                    made = self.meter.current_bytes()
                held = batch  # the previous batch goes now, after this one is made
                if replacing:
                    residue.replaced(made - self.meter.current_bytes(), own)
                elif micro == 0 and residue is not None and step == 0:
                    made = self.meter.current_bytes()
                if log is not None and micro == 0 and step < 2:
                    log.start()
                with self._whole_step_log(batch, size, state_batch, step):
                    kept = None  # the framework let the previous micro-batch's output go
                    output, loss = self.forward_loss(batch, size, micro, step)
                    self._check_step_loss(loss)
                    del batch
                    if isinstance(output, KeptOutput):  # what the framework holds, as it does
                        kept, output = (output.kept if output.through_step else None, output.kept)
                    elif not self.keep_output:  # dropped before backward, as a training_step does
                        del output
                        output = None
                    self._enter("backward", size, micro, step)
                    (loss / micro_batches).backward()
                del loss, output  # kept: alive through backward, as `out = model(x)` keeps it
            if log is not None and step < 2:
                log.stop()
                if step == 1:
                    residue.at_new_size(*log.steps)
            if not self.gradients_seen:
                self._check_gradients()
            self._optimizer_step(optimizer, size, step)
            kept = None  # noqa: F841  held through the optimizer step, as the framework holds it
            self.meter.synchronize()  # the step's queued kernels, once per step (CUDA)
            total_ms += (time.perf_counter() - t0) * 1000.0
            if done == 0:
                self.first_step_ms = total_ms
            if residue is not None:
                if step == 0 and state_batch == 0:
                    residue.first(size, made, self.meter.current_bytes())
                else:
                    residue.later(size, self.meter.current_bytes())
            done += 1
            self.steps_done, self.steps_ms = done, total_ms
        return done, total_ms

    def _check_gradients(self):
        """After the search's first backward (check_gradients)."""
        check_gradients(self.state.params)
        self.gradients_seen = True

    def _optimizer_step(self, optimizer, size, step):
        """The optimizer's step and zero_grad (or, without an optimizer, zero_grad alone)."""
        if optimizer is not None:
            self._enter("optimizer-step", size, 0, step)
            optimizer.step()
            self.optimizer_state_bytes = max(self.optimizer_state_bytes, state_bytes(optimizer))
            self._enter("idle", size, 0, step)
            optimizer.zero_grad(set_to_none=self.zero_grad == "none")
        else:
            self._enter("idle", size, 0, step)
            for p in self.state.params:
                if self.zero_grad == "none" or p.grad is None:
                    p.grad = None
                else:
                    p.grad.zero_()

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

    def warm_up(self, size, check_collectives=False):
        """One trial at the search's smallest micro-batch before the meter reads its baseline
        (CUDA: the first kernels of each kind load modules and create library handles outside
        the caching allocator; read before them, the outside part would be too small for every
        trial), as the command's runner does. Out of memory here is left to the first real trial;
        a model error leaves at once. `check_collectives`: the step runs under CollectiveGuard
        (ranks of a job searching on their own must not run collectives)."""
        guard = CollectiveGuard(self.model) if check_collectives else contextlib.nullcontext()
        try:
            with guard:
                record = self.trial(size, 1, self._train, label="warm-up")
        except ModelError as e:
            if isinstance(e.__cause__, CollectiveInStep):
                raise UsageError(str(e.__cause__)) from None
            raise
        log.debug("warm-up step at micro-batch %d: %s", size, record.get("outcome", FITS))
        self.count, self.evidence = 0, {}
        self.residue = None  # what a first call builds once (a cache, a lazy module) is no residue
        self.largest_full_fit = 0

    def trial(self, size, micro_batches, body, label=None):
        """One trial: body(size, micro_batches) -> (steps completed, total ms) under the meter,
        its out-of-memory turned into a record (see the module's docstring). What a failure means
        is the command's rule, decided by the same code (_core.TrialEvidence,
        src/probes/trial_evidence.h): after a fatal device error (sticky CUDA error) no device
        call is made, not even to restore the weights, and ModelError says so; an ambiguous
        failure (cuDNN finding no engine) re-runs the largest batch seen to fit: it fits, so the
        failure was memory (the re-run is listed in the record's "classification_rerun")."""
        self.count += 1
        record = {"memory_limit_bytes": self.meter.limit_bytes(), "steps_completed": 0}
        raised, error = None, None
        self.steps_done, self.steps_ms = 0, 0.0
        self.first_step_ms = None
        self.meter.begin()
        try:
            _core.interrupt_active(True)  # CPU allocations of the steps ask the deadline (row 15)
            try:
                done, total_ms = body(size, micro_batches)
            finally:
                _core.interrupt_active(False)
            record["steps_completed"] = done
            record["step_ms"] = self._step_ms(done, total_ms, size)
        except KeyboardInterrupt:
            self.interrupted = True
            record["cancelled"] = True
        except _TrialStopped as e:  # between steps: the steps before it ran whole
            record["cancelled"] = True
            record["steps_completed"] = e.done
            record["step_ms"] = e.total_ms / e.done if e.done else 0.0
        except Exception as e:  # noqa: BLE001  torch.OutOfMemoryError is a RuntimeError
            if _core.trial_interrupted():
                # A CPU allocation refused at the deadline or a cancellation, inside a step: the
                # trial does not count; neither the model's error nor out of memory.
                record["cancelled"] = True
                traceback.clear_frames(e.__traceback__)
                del e
            else:
                if _core.is_fatal(text_of(e)):
                    self.meter.mark_poisoned()
                record["steps_completed"] = self.steps_done
                record["step_ms"] = self.steps_ms / self.steps_done if self.steps_done else 0.0
                # What it was is decided once the peaks are read (the process limit is asked
                # with the trial's peak); the frames go now, and with them the step's tensors.
                raised = (exception_type(e), text_of(e), self.point)
                traceback.clear_frames(e.__traceback__)
                error = e
                del e
                if not self.meter.poisoned():
                    self._drain_autograd()
        finally:
            if not self.kept_grads:
                for p in self.state.params:
                    p.grad = None
            self._enter("idle", size)
        evidence = self.evidence.setdefault(_body_key(body), _core.TrialEvidence())
        peaks_error = self._read_peaks(record)
        failure = None
        if raised is not None and not self.meter.poisoned():
            failure = self._classify(evidence, raised, size, record.get("peak_bytes", 0))
            if failure["kind"] in (OUT_OF_MEMORY, SIZE_LIMIT):
                error = None  # freed before the cleanup
        # a fatal error seen while reading the peaks is the one that leaves (ModelError says so)
        error = (peaks_error or error) if self.meter.poisoned() else (error or peaks_error)
        error = self._clean_up(error)
        self._check_survivors()
        if (
            failure is not None
            and failure["kind"] == POSSIBLE_OUT_OF_MEMORY
            and error is not None
            and not self.meter.poisoned()
        ):
            failure = self._judge(evidence, failure, size, body, record)
            if failure["kind"] != RETHROW:
                error = None
        self._record_outcome(record, failure, evidence, size, micro_batches, body, error)
        if self.facts is not None:
            self.facts["model"]["optimizer_state_bytes"] = self.optimizer_state_bytes
            self.facts["context"].update(self.meter.context())
        if isinstance(error, UsageError):  # ours, from the step (a drop-in's check) or _end
            raise error from None
        if error is not None:
            raise self._model_error(error, size) from error
        self._log(size, micro_batches, record, label)
        return record

    def _record_outcome(self, record, failure, evidence, size, micro_batches, body, error):
        """The verdict into ``record`` (outcome, reason, the failed request and where), and what
        the trial teaches the next ones of its kind (TrialEvidence.learn; an error that leaves
        forgets the last out of memory, as the runner's)."""
        if failure is not None and failure["kind"] in (OUT_OF_MEMORY, SIZE_LIMIT):
            record["outcome"] = failure["kind"]
            record["reason"] = failure["reason"]
            if failure["kind"] == OUT_OF_MEMORY:
                record["failed_request_bytes"] = failure["failed_request_bytes"]
                record["failed_in_use_bytes"] = failure["failed_in_use_bytes"]
                (
                    record["failed_phase"],
                    record["failed_micro_batch_index"],
                    record["failed_step_index"],
                ) = failure["point"]
        if error is not None:
            evidence.forget_out_of_memory()
            return
        evidence.learn(
            size, micro_batches, record.get("outcome", FITS), bool(record.get("cancelled"))
        )
        if (
            "outcome" not in record
            and not record.get("cancelled")
            and getattr(body, "__name__", "") == "_train"
        ):
            self.largest_full_fit = max(self.largest_full_fit, size)

    def _step_ms(self, done, total_ms, size):
        """The trial's step time for the search's time rules and plan speeds: with 2 or more
        steps, the mean of the steps after the first. The first step at a new size also pays for
        what is made once per shape (torch.compile's compilation, cuDNN's autotuning, lazily built
        state): a compiled model's first step at 2129 took minutes, and its mean predicted
        21,208 s for a trial that runs in seconds, so the time budget stopped the search at 1. The
        excess over the later steps is counted apart and said in the warnings when it dominates."""
        if done < 2 or self.first_step_ms is None:
            return total_ms / done if done else 0.0
        later = (total_ms - self.first_step_ms) / (done - 1)
        excess = self.first_step_ms - later
        if excess > max(3.0 * later, 1000.0):  # seconds of work once per size
            self.first_step_excess.append((size, excess))
            self._note_first_steps()
        return later

    def _note_first_steps(self):
        """The warning on first steps that cost far more than the next (compilation per shape)."""
        total = sum(ms for _, ms in self.first_step_excess)
        note = (
            f"the first step at {len(self.first_step_excess)} new size(s) took "
            f"{total / 1000.0:.1f} s more than the steps after it in total (compilation per "
            f"shape, as torch.compile does without dynamic=True, or autotuning); the step "
            f"times that the time limit and the plans use leave it out, and a training job "
            f"pays it again at every new batch shape (a last partial batch, sequence lengths)"
        )
        if self.first_step_note in self.meter.notes:
            self.meter.notes[self.meter.notes.index(self.first_step_note)] = note
        else:
            self.meter.notes.append(note)
        self.first_step_note = note

    def _check_survivors(self):
        """Tensors the trial made that are still alive now that it let go of its own (a step
        that keeps them: _survivors.py): named once in the result's warnings, and updated."""
        if self.survivors is None or self.holding or self.meter.poisoned():
            return
        if not self.survivors.check(self.meter.current_bytes()):
            return
        note = self.survivors.note()
        if self.survivor_note in self.meter.notes:
            self.meter.notes[self.meter.notes.index(self.survivor_note)] = note
        else:
            self.meter.notes.append(note)
        if self.survivor_note is None:  # said once; the result's warning holds the last count
            log.warning("autobatch: %s", note)
        self.survivor_note = note

    def _drain_autograd(self):
        """After a step that failed: autograd's engine keeps a failed backward's queued work (its
        gradient buffers) until the next backward on that thread, so 3.9 MB of a branching
        model's out of memory in backward stayed counted into the next trials and failed them
        (answers 2188 and 5348 for B* 2540 and 5468). A backward of one
        scalar on the CPU and on the model's device runs the engine's queues dry. The scalar is
        ours, outside the budget: under a limit the model's own bytes already fill, its refusal
        would leave find() as a raw OutOfMemoryError, not DoesNotFit."""
        with _core.Untracked():
            for device in {torch.device("cpu"), self.device}:
                leaf = torch.zeros((), device=device, requires_grad=True)
                leaf.backward()
                del leaf

    def _read_peaks(self, record):
        """The trial's peaks into ``record``. Returns the error reading them raised (None when
        none): a fatal one poisons the device; the backend's own refusal after a trial (the
        memory outside the allocator grown past the limit: cuda_backend.cpp, applyFraction),
        which leaves the weights unrestored and the process under the search's fraction, comes
        back as a UsageError."""
        try:
            record.update(self.meter.end())
        except Exception as e:  # noqa: BLE001  a sticky error seen at the first device call
            if _core.is_fatal(text_of(e)):
                self.meter.mark_poisoned()
            elif isinstance(e, _core.Error):
                e = UsageError(str(e))
            return e
        return None

    def _clean_up(self, error):
        """The weights back and the caches emptied, unless the device had a fatal error (then
        nothing touches it). A device call that raises here poisons the device; the trial's own
        ``error``, if any, is the one that leaves (returned)."""
        if self.meter.poisoned():
            return error
        try:
            self.state.restore_weights()
            self.meter.release()
        except Exception as e:  # noqa: BLE001
            self.meter.mark_poisoned()
            error = error or e
        return error

    def _judge(self, evidence, failure, size, body, record):
        """The verdict on an ambiguous failure at ``size`` (possible-out-of-memory), by the
        command's rule (TrialEvidence.judge, src/probes/trial_evidence.h): the largest batch this
        kind of trial saw fit is re-run here as a trial of its own; its record goes into
        ``record["classification_rerun"]`` when it decided the verdict. Returns the failure's
        dict with the verdict's kind and reason (and the point kept)."""
        reran = {}

        def rerun(batch, micro_batches):
            try:
                reran["record"] = self.trial(batch, micro_batches, body, label="re-run to classify")
            except ModelError as e:
                cause = e.__cause__ if e.__cause__ is not None else e
                kind = _core.classify(exception_type(cause), text_of(cause), True, True)["kind"]
                return {"raised": True, "raised_kind": kind}
            reran["record"]["micro_batch_size"] = batch
            reran["record"]["micro_batches_per_step"] = micro_batches
            return {"outcome": reran["record"].get("outcome", FITS)}

        point = failure.pop("point")
        near = failure.pop("process_limit_near")
        verdict = evidence.judge(failure, size, near, self.meter.process_limit_near(0, 1), rerun)
        if verdict["warning"]:
            log.warning("%s", verdict["warning"])
        if verdict["rerun_listed"]:
            reran["record"]["reason"] = verdict["rerun_reason"]
            record["classification_rerun"] = reran["record"]
        return {
            k: verdict[k] for k in ("kind", "reason", "failed_request_bytes", "failed_in_use_bytes")
        } | {"point": point}

    def _model_error(self, error, size):
        if self.meter.poisoned():
            return ModelError(
                f"the device had a fatal error at micro-batch {size} (not out of memory): "
                f"{type(error).__name__}: {_core.classify('other', text_of(error))['reason']}; a "
                "sticky CUDA error leaves the device unusable in this process, so autobatch made "
                "no device call after it: the model's weights and the memory fraction were not "
                "restored. Start a new process (CUDA_LAUNCH_BLOCKING=1 helps find the kernel)",
                micro_batch=size,
            )
        return ModelError(
            f"the model raised an error at micro-batch {size} (not out of "
            f"memory): {type(error).__name__}: {text_of(error)}{hint(error, size)}"
            f"{self._tuple_hint(error)}",
            micro_batch=size,
        )

    def _tuple_hint(self, error):
        """The fix when a tuple example reached the model as model(*batch) and did not fit its
        signature: the usual (inputs, targets) batch of a DataLoader."""
        if (
            self.step is None
            and isinstance(self.example, (tuple, list))
            and isinstance(error, TypeError)
            and "positional argument" in text_of(error)
        ):
            return (
                "; the example batch is a tuple, which the trial passes as model(*batch): "
                "for an (inputs, targets) batch pass step=lambda model, batch: "
                "F.cross_entropy(model(batch[0]), batch[1]) (the forward and loss of one "
                "micro-batch), or loss_fn= with the inputs alone as example_batch"
            )
        return ""

    def _classify(self, evidence, raised, size, peak_bytes):
        """The library's classification of a failed step (autobatch/vocabulary/failure.h) with
        the evidence of the trials before (TrialEvidence.classify: the last out of memory above
        ``size``, the process limit asked with this trial's peak). ``raised``: (exception type,
        text, point). Returns the failure's dict with "point" and "process_limit_near"."""
        kind, message, (name, micro, step) = raised
        failure = evidence.classify(
            kind, message, size, int(peak_bytes), self.meter.process_limit_near
        )
        failure["point"] = (name if name != "idle" else "", micro, step)
        return failure

    def _log(self, size, micro_batches, r, label=None):
        outcome = "cancelled" if r.get("cancelled") else r.get("outcome", FITS)
        where = f" in {r['failed_phase']}" if r.get("failed_phase") else ""
        peak = _core.format_bytes(int(r.get("peak_bytes", 0)))
        log.info(
            "%s: micro-batch %d x%d: %s%s, peak %s",
            label or f"trial {self.count}",
            size,
            micro_batches,
            outcome,
            where,
            peak,
        )
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"B={size} {outcome}{where}, peak {peak}")
