"""What the search may change in the user's process, captured before it and put back after it:
parameters and buffers bitwise (BatchNorm running statistics and num_batches_tracked included),
tensors the modules hold as plain attributes (a GRU's carried hidden state, a lookup table built
on the first forward) and each module's torch.Generator, each module's training flag,
requires_grad flags, gradients (the same tensor objects), buffers registered during the trials
(removed), the example batch's gradients, and the random number generators' states (CPU, CUDA,
Python's `random`, numpy's global one). The user's optimizer is never touched: trials build their
own."""
import random
import sys
from collections.abc import Mapping

import torch

from . import _core


def _tensors(model):
    seen, out = set(), []
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _held(value, depth=0):
    """The tensors in a module attribute's value: a tensor, or tensors inside lists, tuples and
    dicts (two levels), never parameters (the model's own)."""
    if isinstance(value, torch.Tensor):
        return [] if isinstance(value, torch.nn.Parameter) else [value]
    if depth < 2 and isinstance(value, (list, tuple)):
        return [t for v in value for t in _held(v, depth + 1)]
    if depth < 2 and isinstance(value, Mapping):
        return [t for v in value.values() for t in _held(v, depth + 1)]
    return []


def _example_tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    values = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    return [t for v in values for t in _example_tensors(v)]


class ModelState:
    """A host copy of the model's tensors (made inside the budget allocator's untracked scope, so
    it is not counted as the trials' memory, as the C++ runner's weight snapshot) and its flags."""

    def __init__(self, model, example=None):
        self.model = model
        self.tensors = _tensors(model)
        with _core.Untracked():
            self.copies = [t.detach().to("cpu", copy=True) for t in self.tensors]
        self.params = list(model.parameters())
        self.grads = [p.grad for p in self.params]
        self.requires_grad = [p.requires_grad for p in self.params]
        self.training = [(m, m.training) for m in model.modules()]
        self.buffer_names = [(m, set(m._buffers)) for m in model.modules()]
        self.attribute_names = [(m, set(vars(m))) for m in model.modules()]
        # Plain attributes: every value is put back as it was (a tensor rebound by forward, a
        # generator advanced, a list of cached tensors); generators' states are restored too.
        self.attributes = []
        self.held = []  # (name, tensor) of the tensors the modules hold outside their parameters
        own = {id(t) for t in self.tensors}
        for name, m in model.named_modules():
            for k, v in vars(m).items():
                if k.startswith("_") or k == "training" or isinstance(v, torch.nn.Module):
                    continue
                if isinstance(v, torch.Generator):
                    self.attributes.append((m, k, v, v.get_state()))
                elif _held(v):
                    self.attributes.append((m, k, v, None))
                    self.held += [(f"{name + '.' if name else ''}{k}", t) for t in _held(v)
                                  if id(t) not in own]
        self.example_grads = [(t, t.grad) for t in _example_tensors(example) if t.is_leaf]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (torch.cuda.get_rng_state_all()
                         if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None

    def detach_grads(self):
        """Gradients set to None for the trials (the user's are kept here and put back)."""
        for p in self.params:
            p.grad = None

    def restore_weights(self):
        """Parameters and buffers back to their values before the search (after every trial, so
        each trial starts from the same weights), and the modules' plain attributes."""
        with torch.no_grad():
            for t, c in zip(self.tensors, self.copies):
                t.copy_(c)
        self._restore_attributes()

    def _restore_attributes(self):
        for m, k, v, generator_state in self.attributes:
            setattr(m, k, v)
            if generator_state is not None:
                v.set_state(generator_state)
        for m, names in self.buffer_names:
            for k in [k for k in m._buffers if k not in names]:
                del m._buffers[k]  # registered by a trial (a forward that registers a buffer)
        for m, names in self.attribute_names:
            # Tensors a trial left as new attributes (a cache built on the first forward): gone,
            # so each trial builds them again as the user's fresh job does.
            for k in [k for k, v in vars(m).items() if k not in names and _held(v)]:
                delattr(m, k)

    def restore(self, device_usable=True):
        """Everything back: weights, gradients, requires_grad, training flags, RNG states.
        `device_usable` False (a fatal CUDA error: every device call would raise it again): the
        weights and the CUDA generators are left as they are, the rest is put back."""
        if device_usable:
            self.restore_weights()
        else:
            self._restore_attributes()
        for p, g, r in zip(self.params, self.grads, self.requires_grad):
            p.grad = g
            p.requires_grad_(r)
        for m, training in self.training:
            m.training = training
        for t, g in self.example_grads:
            t.grad = g
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None and device_usable:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            sys.modules["numpy"].random.set_state(self.numpy_rng)

    def held_bytes(self):
        """[(attribute, bytes)] of the distinct storages the modules hold as plain attributes (not
        parameters or buffers), largest first."""
        seen, out = set(), []
        for name, t in self.held:
            s = t.untyped_storage()
            if s.data_ptr() in seen or s.nbytes() == 0:
                continue
            seen.add(s.data_ptr())
            out.append((name, s.nbytes()))
        return sorted(out, key=lambda x: -x[1])

    def untracked_bytes(self):
        """Bytes of the distinct CPU storages of the model's tensors, and of the tensors its
        modules hold as plain attributes, that the budget allocator does not count (allocated
        before it was installed): the baseline of every trial."""
        seen, total = set(), 0
        for t in self.tensors + [t for _, t in self.held]:
            if t.device.type != "cpu":
                continue
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr == 0 or ptr in seen or _core.is_tracked(ptr):
                continue
            seen.add(ptr)
            total += s.nbytes()
        return total
