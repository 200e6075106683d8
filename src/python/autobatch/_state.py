"""What the search may change in the user's process, captured before it and put back after it:
parameters and buffers bitwise (BatchNorm running statistics and num_batches_tracked included),
each module's training flag, requires_grad flags, gradients (the same tensor objects), and the CPU
and CUDA random number generators' states. The user's optimizer is never touched: trials build
their own."""
import torch

from . import _core


def _tensors(model):
    seen, out = set(), []
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class ModelState:
    """A host copy of the model's tensors (made inside the budget allocator's untracked scope, so
    it is not counted as the trials' memory, as the C++ runner's weight snapshot) and its flags."""

    def __init__(self, model):
        self.model = model
        self.tensors = _tensors(model)
        with _core.Untracked():
            self.copies = [t.detach().to("cpu", copy=True) for t in self.tensors]
        self.params = list(model.parameters())
        self.grads = [p.grad for p in self.params]
        self.requires_grad = [p.requires_grad for p in self.params]
        self.training = [(m, m.training) for m in model.modules()]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (torch.cuda.get_rng_state_all()
                         if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

    def detach_grads(self):
        """Gradients set to None for the trials (the user's are kept here and put back)."""
        for p in self.params:
            p.grad = None

    def restore_weights(self):
        """Parameters and buffers back to their values before the search (after every trial, so
        each trial starts from the same weights)."""
        with torch.no_grad():
            for t, c in zip(self.tensors, self.copies):
                t.copy_(c)

    def restore(self, device_usable=True):
        """Everything back: weights, gradients, requires_grad, training flags, RNG states.
        `device_usable` False (a fatal CUDA error: every device call would raise it again): the
        weights and the CUDA generators are left as they are, the rest is put back."""
        if device_usable:
            self.restore_weights()
        for p, g, r in zip(self.params, self.grads, self.requires_grad):
            p.grad = g
            p.requires_grad_(r)
        for m, training in self.training:
            m.training = training
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None and device_usable:
            torch.cuda.set_rng_state_all(self.cuda_rng)

    def untracked_bytes(self):
        """Bytes of the distinct CPU storages of the model's tensors that the budget allocator
        does not count (allocated before it was installed): the baseline of every trial."""
        seen, total = set(), 0
        for t in self.tensors:
            if t.device.type != "cpu":
                continue
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr == 0 or ptr in seen or _core.is_tracked(ptr):
                continue
            seen.add(ptr)
            total += s.nbytes()
        return total
