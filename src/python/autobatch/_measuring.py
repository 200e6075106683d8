"""The shortened measuring trial (docs/search.md, "Measuring trials" and "When a shortened
failure stands"): a first step whose forward and backward see only the first `state_batch`
samples of the size's batch makes the optimizer's state, then one whole step runs at the size.
EagerProbe (_trial.py) takes these methods; the residues that say whether its failure stands for
the full trial's are _residue.py's.
"""

import contextlib

import torch

from ._batches import leading, mirror_removals
from ._replay import EventLog, peak_lines
from ._residue import StepResidue, storage_bytes
from ._vocabulary import FITS, OUTCOME_OUT_OF_MEMORY


class MeasuringTrials:
    """EagerProbe's shortened trials (a mixin: it uses the probe's meter, steps and state)."""

    def measure(self, size, micro_batches):
        """A shortened trial for the search's model (docs/search.md, "Measuring trials"): a first
        step whose forward and backward run on the first `state_batch` samples of this size's
        batch (_make_state) makes the optimizer's state, as a job's first step does (the same
        parameters get gradients); then one whole step at `size`, which sees what every later
        step of a full trial sees (the state, the previous batch while the next is made). On a
        byte-counting allocator its phase peaks are the full trial's. Its fit is not an answer:
        the search confirms that by a full trial. With steps_per_trial 1 there is no later step
        to stand for, and the full trial runs."""
        if self.steps < 2:
            return self(size, micro_batches)
        residue = self._residue()
        if residue.broken:
            # A step left other bytes than another (_residue.py): a shortened trial would not
            # start its whole step from the full trial's memory, so its measurements are not the
            # full trial's (optimistic or not): the full trial runs.
            return self(size, micro_batches)
        self.replay_logs = []
        record = self.trial(
            size, micro_batches, self._measure, label=f"trial {self.count + 1} (measuring)"
        )
        record["shortened"] = True
        if record.get("outcome", FITS) == FITS and len(self.replay_logs) == 2:
            (first, first_size), (second, second_size, start, batch) = self.replay_logs
            record["replayed_peak"] = peak_lines(
                first, first_size, second, second_size, start, batch, 1 << 40
            )
        self.replay_logs = []
        # Only where the meter counts bytes: under the CUDA caching allocator the reserved peak
        # also depends on the order of allocations, which a shortened trial changes.
        if (
            record.get("outcome") == OUTCOME_OUT_OF_MEMORY
            and self.meter.name == "cpu-budget"
            and residue.stands()
        ):
            record["stands_for_full"] = True
        return record

    def _residue(self):
        if self.residue is None or self.residue.state_batch != self.state_batch:
            self.residue = StepResidue(self.state_batch)
        return self.residue

    def _measure(self, size, micro_batches):
        buckets = self.buckets(size)
        done = self._steps(
            size, micro_batches, steps=1, state_batch=min(size, max(1, self.state_batch))
        )
        del buckets
        return done

    def _shortened_start(self, optimizer, size, micro_batches, state_batch, residue):
        """A shortened trial's first step (_make_state), then, where its failure could stand for
        the full trial's, the size shown to the model (_show_size). Returns the held batch. A
        failure in its whole step may stand only one above the largest full fit (the search's
        low + 1: failures far above the answer, of a model that rebuilds a cache on a new size,
        were marked otherwise), on the CPU budget allocator, once full trials showed that a new
        size makes the model do nothing more (_residue.py, new_size_is_plain), and after the
        size was shown."""
        held = self._make_state(optimizer, size, micro_batches, state_batch, residue)
        if residue is not None:
            if (
                residue.stands()
                and self.meter.name == "cpu-budget"
                and size == self.largest_full_fit + 1
                and residue.new_size_is_plain()
            ):
                self._show_size(held, size, residue)
            else:
                residue.comparable = False
        return held

    def _show_size(self, held, size, residue):
        """Between a shortened trial's first step and its whole step: a forward of the whole batch
        in grad mode (its graph freed unused), so that what the model does when the size changes
        from the first step's `state_batch` samples (a plan for small batches switched back, kept
        where the weights' restore does not reach: without this forward, answers 1 or 2 under B*
        at 8 of 21 budgets) happens here, not in the whole step with the optimizer's state
        alive, where the full trial's second step, after a step at the size, does not meet it.
        What it cannot show (work in backward only) the full trials at new sizes show when it is
        the module's (new_size_is_plain). The whole step's failure then stands only if this
        forward left the bytes as they were (a model keeping what the forward made would hold it
        through the whole step); its out of memory is the trial's, which does not stand then (the
        full trial's first step meets the size without the optimizer's state). It runs in grad
        mode: a forward under no_grad kept what a model keeps from a no_grad forward, raised
        from a step that needs grad mode, and left state that only a no_grad call sets (a flag,
        a workspace keyed on grad mode) for the whole step and the next full trials: answers 1
        or 2 under B*."""
        comparable, residue.comparable = residue.comparable, False
        before = self.meter.current_bytes()
        with torch.enable_grad(), _HookCount() as hooks:
            output, loss = self.forward_loss(held, size, 0, 0)
        del output, loss
        # Code that runs in backward only (a hook) is not shown by a forward: a plan it switches
        # back from the first step's small batch would be switched in the whole step, with the
        # optimizer's state alive, where the full trial's second step switches nothing (answers 1
        # or 2 under B*). Such a failure does not stand.
        if (
            self.meter.current_bytes() == before
            and not hooks.registered
            and not backward_hooks_of(self.model)
        ):
            residue.comparable = comparable

    def _make_state(self, optimizer, size, micro_batches, state_batch, residue=None):
        """A measuring trial's first step (measure()), a full trial's first step with the
        forward and backward run on the first `state_batch` samples only: this size's batch is
        made (and held, as the loop holds it, into the next step), forward and backward of each
        micro-batch run on a view of its first samples (no memory of its own: every phase peak
        stays at or below the full first step's; but it shares the batch's storage, so a model
        that keeps it keeps the whole batch, which the residues see: _residue.py), which gives the
        gradients a job's first step
        gives (the same parameters: the optimizer's state is made for exactly those), then the
        optimizer's step with the batch held. Returns that batch. `residue`: told what the step
        left (_residue.py)."""
        self._enter("inputs", size, 0, 0)
        held = self._batch(size)
        made = self.meter.current_bytes() if residue is not None else 0
        # Its forward and backward event by event, for the whole step's replayed peak
        # (_replay.py): one micro-batch, on the budget allocator.
        self.replay_logs = []
        replay = micro_batches == 1 and self.meter.name == "cpu-budget"
        for micro in range(micro_batches):
            small = (
                leading(self.example, held, state_batch, self.n0)
                if self.batches is None
                else self._batch(state_batch)  # a made batch has no rows to view
            )
            with EventLog(self.replay_logs, state_batch) if replay else contextlib.nullcontext():
                output, loss = self.forward_loss(small, size, micro, 0)
                self._check_step_loss(loss)
                mirror_removals(small, held)
                del small
                if not self.keep_output:
                    del output
                    output = None
                self._enter("backward", size, micro, 0)
                (loss / micro_batches).backward()
            del loss, output
        if residue is not None:
            residue.at_optimizer_step()
        self._optimizer_step(optimizer, size, 0)
        self.meter.synchronize()
        if residue is not None:
            residue.first(state_batch, made, self.meter.current_bytes())
        return held

    def _whole_step_log(self, batch, size, state_batch, step):
        """A `with` block around a measuring trial's whole step that logs it event by event, after
        its first step's log (_make_state), with the bytes held at its start and its batch's own
        (_replay.peak_lines); one that does nothing elsewhere."""
        if not (state_batch > 0 and step == 0 and len(self.replay_logs) == 1):
            return contextlib.nullcontext()
        return EventLog(
            self.replay_logs,
            size,
            self.meter.current_bytes(),
            storage_bytes(batch, self.example_ptrs),
        )


def backward_hooks_of(model):
    """Whether Python code of the model's runs in backward where a forward cannot show it: a
    backward (pre) hook of one of its modules or of every module (torch.nn.modules.module's
    globals), or a hook on one of its parameters (Tensor.register_hook,
    register_post_accumulate_grad_hook). Hooks that the forward registers are _HookCount's."""
    from torch.nn.modules import module as nn_module

    if getattr(nn_module, "_global_backward_hooks", None) or getattr(
        nn_module, "_global_backward_pre_hooks", None
    ):
        return True
    for m in model.modules():
        if m._backward_hooks or getattr(m, "_backward_pre_hooks", None):
            return True
    return any(
        getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)
        for p in model.parameters()
    )


class _HookCount:
    """Counts the tensor hooks registered inside its block (Tensor.register_hook, which
    torch.autograd.graph.register_multi_grad_hook also calls): a forward that registers one runs
    the user's code in backward. One search runs at a time per process (_find.py), so the class
    attribute is patched for its block only."""

    def __enter__(self):
        self.registered, self._original = 0, torch.Tensor.register_hook
        original = self._original

        def register_hook(tensor, hook):
            self.registered += 1
            return original(tensor, hook)

        torch.Tensor.register_hook = register_hook
        return self

    def __exit__(self, *exc):
        torch.Tensor.register_hook = self._original
        return False
