"""What each training step leaves behind beyond its batch: the evidence on which a shortened
measuring trial's out of memory stands for the full trial's (docs/search.md, "When a shortened
failure stands").

A shortened trial (EagerProbe.measure) runs a first step whose forward and backward see only the
first `state_batch` samples of the size's batch, then one whole step at the size. Its whole step
starts from what the first step left: the optimizer's state, the gradients zero_grad keeps, the
held batch, and whatever the model or the step keeps (a buffer of the batch's size, a cache, state
made only for the parameters some samples reach). A full trial's second step starts from what a
first step at the whole size left. When the two are the same bytes, the whole step runs the full
trial's second step from the same memory, so on an allocator that counts bytes (the CPU budget
allocator: no caching, no fragmentation) it fails where the full trial fails.

A step's residue: the bytes held at its end (after the optimizer's step and zero_grad) less those
held right after its (first micro-batch's) batch was made. Every trial's first step must leave one
and the same residue, whether its forward saw `state_batch` samples or more; every later step,
once its batch is made, must free by letting the previous one go the bytes of that batch's own
storages (less means something still holds them, e.g. a model keeping a view of its input, which
in a shortened trial's first step pins the whole batch), and must leave the bytes where the step
before did. One step that does otherwise (a buffer kept at the
batch's size, optimizer state made for the experts some samples reach, an input kept) breaks the
evidence for the rest of the search.

A shortened trial's whole step is also the model's first step at its size, and comes after a
forward on `state_batch` samples, where a full trial's second step is its second at the size.
What a model does when the size changes (a cache rebuilt beside the old one, in forward, only in
grad mode, or in a backward hook; a plan for small batches switched back) the full trial does in
its first step, without the optimizer's state, and the whole step with it. Two pieces of evidence
stand against it. A full trial at a size the model had never seen (not the search's first trial,
which meets what a process does once) must run its first step's forward and backward with the
same allocations as its second (bytes and count) and rise no higher above the step's start
(`at_new_size`, read from the budget allocator's allocation log); one that does otherwise ends
it for the search. And the shortened trial shows the size to the model by a forward of the whole
batch in grad mode before its whole step (_measuring.py, _show_size), which must leave the bytes
as they were (its out of memory is the trial's, not standing). Each alone was measured wrong: a
forward under no_grad missed a cache rebuilt only in grad mode or in backward (answers 444 for
448), kept what a model
keeps from a no_grad forward (503 for 508), raised from a step that needs grad mode and left
state only a no_grad call sets; the full trials' evidence missed a plan switched by the first
step's small forward and kept where the weights' restore does not reach (1 or 2 under B* at 8 of
21 budgets). Not seen by either: such a plan switched only in backward (1 or 2 under B* at 3 of
9 budgets).
"""

from collections.abc import Mapping

import torch

from . import _budget


def _storages(batch):
    """The storages of the tensors in `batch` (tensors, mappings, lists and tuples, nested)."""
    todo = [batch]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            yield item.untyped_storage()
        elif isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)


def storage_ptrs(batch):
    """The data pointers of the storages in `batch`."""
    return frozenset(storage.data_ptr() for storage in _storages(batch))


def storage_bytes(batch, skip=frozenset()):
    """Bytes of the distinct storages of the tensors in `batch`, those whose data pointer is in
    `skip` (storage_ptrs of the example, whose tensors make_batch passes unchanged) left out."""
    seen, total = set(skip), 0
    for storage in _storages(batch):
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class StepResidue:
    """The residues seen in one search (trials of the training body only)."""

    def __init__(self, state_batch):
        self.state_batch = state_batch  # the samples a shortened trial's first step runs on
        self.residue = None  # bytes every first step so far left beyond its batch
        self.small = False  # a step whose forward saw <= state_batch samples left it
        self.large = False  # a step whose forward saw more left it
        self.broken = False  # a step left other bytes: no shortened trial stands for a full one
        # The running shortened trial has so far held what the full trial holds: its first step
        # reached the optimizer's step (which holds what a full first step's does: the same
        # gradients, the whole batch), and left the residue if it ended.
        self.comparable = False
        self._end = None  # bytes held at the end of the running trial's last step
        # A full trial at a new size ran its first step like its second (at_new_size); one did not.
        self.size_seen = False
        self.size_work = False

    def begin(self):
        """A trial starts."""
        self.comparable = False
        self._end = None

    def at_optimizer_step(self):
        """A shortened trial's first step reaches its optimizer's step."""
        self.comparable = True

    def first(self, samples, made, end):
        """A trial's first step ended, its forward on `samples` samples: `made` bytes were held
        right after its batch was made, `end` at its end."""
        residue = end - made
        if self.residue is None:
            self.residue = residue
        if residue == self.residue:
            self._seen(samples)
        else:
            self.broken = True
            self.comparable = False
        self._end = end

    def replaced(self, freed, own):
        """A later step made its (first micro-batch's) batch and let the previous one go, which
        freed `freed` bytes; `own`: the bytes of that batch's own storages (storage_bytes). Why
        this evidence: a model that kept its input when it was small (`self.kept =
        x.detach()`) kept, in a shortened trial, a view of the first step's whole batch through
        the next forward (one batch more than the full trial there; answers up to 22 under the
        full trials' at 8 of 20 budgets), where the residues at the steps' ends were equal."""
        if freed != own:
            self.broken = True
            self.comparable = False

    def later(self, samples, end):
        """A later step of the trial ended (its forward on `samples` samples), `end` bytes held."""
        if self._end is not None and end == self._end:
            self._seen(samples)
        else:
            self.broken = True
        self._end = end

    def _seen(self, samples):
        if samples > self.state_batch:
            self.large = True
        else:
            self.small = True

    def new_size_is_plain(self):
        """True when a full trial at a size the model had not seen ran its first step as its
        second (at_new_size) and none did otherwise: a shortened trial's whole step, the model's
        first at its size, runs as a full trial's second."""
        return self.size_seen and not self.size_work

    def at_new_size(self, first, second):
        """A full trial at a size the model had not seen ran its first and second steps' forward
        and backward; `first`, `second`: (rise, allocated, allocations) of each, from the start of
        its forward (the batch made) to its optimizer's step (_budget.stop_allocation_log)."""
        rise_1, allocated_1, count_1 = first
        rise_2, allocated_2, count_2 = second
        if allocated_1 == allocated_2 and count_1 == count_2 and rise_1 <= rise_2:
            self.size_seen = True
        else:
            self.size_work = True

    def stands(self):
        """True when the running shortened trial's out of memory is the full trial's: it failed in
        its first step's optimizer step (what the full first step's holds) or in its whole step,
        which runs from the memory a full trial's second step runs from (the residue is the same
        after a forward on state_batch samples and on more, and no step left other bytes) and,
        where the shortened trial let it start (_measuring.py), as a second step runs
        (new_size_is_plain)."""
        return not self.broken and self.small and self.large and self.comparable


class StepLog:
    """The budget allocator's log of full trials' first two steps' forward and backward, for
    StepResidue.at_new_size: (rise, allocated, allocations) of each
    (_budget.stop_allocation_log)."""

    def __init__(self):
        self.steps, self.running = [], False

    def start(self):
        _budget.start_allocation_log()
        self.running = True

    def stop(self):
        self.steps.append(_budget.stop_allocation_log())
        self.running = False

    def close(self):
        if self.running:
            self.stop()
