"""What the search may change in the user's process, captured before it and put back after it:
parameters and buffers bitwise (BatchNorm running statistics and num_batches_tracked included),
tensors the modules hold as plain attributes (a GRU's carried hidden state, a lookup table built
on the first forward) and each module's torch.Generator, each module's training flag,
requires_grad flags, gradients (the same tensor objects), buffers registered during the trials
(removed), the example batch's gradients, and the random number generators' states (CPU, CUDA,
Python's `random`, numpy's global one). The user's optimizer is never touched: trials build their
own."""

import gc
import random
import sys
from collections.abc import Mapping

import torch

from . import _budget, _core, _fsdp


def local_tensor(t):
    """The tensor whose storage holds `t`'s bytes in this process: a DTensor's local shard (an
    FSDP2-sharded parameter, its gradient, optimizer state built from it), else `t` itself. A
    DTensor's own storage is a wrapper's, with no data pointer."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None and type(t).__name__ == "DTensor" else t


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


def _snapshot(value, own):
    """What puts a module attribute's value back (see _put_back): a tensor's values (host copy,
    not for the model's own parameters and buffers), a generator's state, a container's contents
    and the states of the generators in it; None for a value restored by rebinding alone."""
    if isinstance(value, torch.Generator):
        return ("generator", value.get_state())
    if isinstance(value, torch.Tensor):
        if isinstance(value, torch.nn.Parameter) or id(value) in own or value.is_meta:
            return None
        return ("tensor", value.detach().to("cpu", copy=True))
    if isinstance(value, (list, dict, set)):
        items = value.values() if isinstance(value, dict) else value
        gens = [(g, g.get_state()) for g in items if isinstance(g, torch.Generator)]
        return (
            "container",
            type(value)(value) if not isinstance(value, dict) else dict(value),
            gens,
        )
    return None


def _put_back(value, saved, device_usable):
    if saved is None:
        return
    if saved[0] == "generator":
        value.set_state(saved[1])
    elif saved[0] == "tensor":
        if device_usable or value.device.type == "cpu":
            with torch.no_grad():
                if value.shape == saved[1].shape and value.dtype == saved[1].dtype:
                    value.copy_(saved[1])
    else:
        _, contents, gens = saved
        if isinstance(value, list):
            value[:] = contents
        else:
            value.clear()
            value.update(contents)
        for g, state in gens:
            g.set_state(state)


def example_tensors(x, path="example_batch", key=None):
    """[(path, tensor)] for each tensor of an example batch (a tensor, or mappings, lists and
    tuples of them), in order; the path as the user indexes it (`example_batch[0]['ids']`), for
    error messages, or as `key(path, mapping_key)` names a mapping's item (the loader's report
    writes `input_ids`). Other values are skipped."""
    if isinstance(x, torch.Tensor):
        return [(path, x)]
    if isinstance(x, Mapping):
        items = [(key(path, k) if key else f"{path}[{k!r}]", v) for k, v in x.items()]
    elif isinstance(x, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(x)]
    else:
        return []
    return [found for p, v in items for found in example_tensors(v, p, key)]


class ModelState:
    """A host copy of the model's tensors (made inside the budget allocator's untracked scope, so
    it is not counted as the trials' memory, as the C++ runner's weight snapshot) and its flags."""

    def __init__(self, model, example=None):
        self.model = model
        self.fsdp = _fsdp.fsdp_modules(model)  # FSDP2 states, put back after each trial
        self.tensors = _tensors(model)
        with _core.Untracked():
            self.copies = [t.detach().to("cpu", copy=True) for t in self.tensors]
        self.params = list(model.parameters())
        self.grads = [p.grad for p in self.params]
        self.requires_grad = [p.requires_grad for p in self.params]
        self.training = [(m, m.training) for m in model.modules()]
        self.buffer_names = [(m, set(m._buffers)) for m in model.modules()]
        self.attribute_names = [(m, set(vars(m))) for m in model.modules()]
        # The modules' own slots: a buffer or parameter that forward rebinds (self.ema = 0.9 *
        # self.ema + ...) is put back as the same tensor object; a submodule a step replaces
        # (model[2] = nn.Linear(...), else left so after find()), as the same module.
        self.slots = [
            (m, table, k, v)
            for m in model.modules()
            for table in (m._parameters, m._buffers, m._modules)
            for k, v in table.items()
        ]
        self.module_names = [(m, set(m._modules)) for m in model.modules()]
        # Plain attributes, put back as they were: the value itself (a counter, a tensor a forward
        # rebinds), the contents of a list, dict or set it fills in place, a tensor's values, a
        # generator's state (also one held in a list or dict).
        self.attributes = []
        self.held = []  # (name, tensor) of the tensors the modules hold outside their parameters
        own = {id(t) for t in self.tensors}
        with _core.Untracked():
            for name, m in model.named_modules():
                for k, v in vars(m).items():
                    if k.startswith("_") or k == "training" or isinstance(v, torch.nn.Module):
                        continue
                    self.attributes.append((m, k, v, _snapshot(v, own)))
                    self.held += [
                        (f"{name + '.' if name else ''}{k}", t)
                        for t in _held(v)
                        if id(t) not in own
                    ]
        self.example_grads = [(t, t.grad) for _, t in example_tensors(example) if t.is_leaf]
        self.example_ptrs = {p for p in (_storage_ptr(t) for _, t in example_tensors(example)) if p}
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None
        )
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
        _fsdp.reset(self.fsdp)  # first: it registers the sharded parameters again
        self._restore_attributes()
        with torch.no_grad():
            for t, c in zip(self.tensors, self.copies):
                t.copy_(c)

    def _restore_attributes(self, device_usable=True):
        for _module, table, k, v in self.slots:
            if table.get(k) is not v:
                table[k] = v
        for m, k, v, saved in self.attributes:
            setattr(m, k, v)
            _put_back(v, saved, device_usable)
        for m, names in self.buffer_names:
            for k in [k for k in m._buffers if k not in names]:
                del m._buffers[k]  # registered by a trial (a forward that registers a buffer)
        for m, names in self.module_names:
            for k in [k for k in m._modules if k not in names]:
                del m._modules[k]  # added by a trial
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
            self._restore_attributes(device_usable=False)
        for m, names in self.attribute_names:
            # Any other attribute the trials left (a counter a forward made);
            # between trials only the tensors go (_restore_attributes).
            for k in [k for k in vars(m) if k not in names]:
                delattr(m, k)
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
            s = local_tensor(t).untyped_storage()
            if s.data_ptr() in seen or s.nbytes() == 0:
                continue
            seen.add(s.data_ptr())
            out.append((name, s.nbytes()))
        return sorted(out, key=lambda x: -x[1])

    def own_ptrs(self):
        """The data pointers the baseline leaves out: autobatch's own host copies (the weights'
        snapshot, the plain attributes' values, the random number generators' states), which the
        process holds only for the search, and the example batch, which stands for the job's
        batches that every trial makes and counts itself (a drop-in's example is the first batch
        of the job's loader, gone when the job trains: Lightning's own fit held 6,116 bytes less
        than a baseline with the generator's state and that batch in it, one sample of the
        answer)."""
        saved = [t for t in self.copies] + [
            s[1] for *_, s in self.attributes if s is not None and s[0] == "tensor"
        ]
        saved += [self.cpu_rng, *(self.cuda_rng or [])]
        # The user's gradients, set aside for the trials (detach_grads) and put back after: the
        # trials' steps make their own, as a job's first backward after zero_grad does (counted
        # too, they were two sets where the job holds one: a DDP job's rank with its gradients
        # set before find_ddp found nothing under the margin).
        saved += [g for g in self.grads if g is not None]
        saved += [g for _, g in self.example_grads if g is not None]
        return {p for p in map(_storage_ptr, saved) if p} | self.example_ptrs

    def untracked_bytes(self):
        """Bytes of the distinct CPU storages alive in this process that the budget allocator
        does not count (allocated before it was installed): the model's tensors, the tensors its
        modules hold as plain attributes, and every other tensor the process holds (a frozen
        teacher in a step's closure, a reference model, a dataset in RAM, the user's optimizer
        state), each storage once; autobatch's own snapshot left out. The baseline of every
        trial, as the caching allocator's statistics count every live tensor on CUDA."""
        return sum(n for _, n, _ in self._untracked_storages())

    def count_untracked(self, meter):
        """meter.finish_setup() with untracked_bytes() as its baseline, and, under the CPU
        budget, each of those storages watched by the allocator, so that one freed during the
        search (a buffer a step replaces, held by an object outside the model) leaves the count
        as it leaves the process (as the caching allocator's count drops on CUDA). Returns the
        baseline's bytes."""
        rows = self._untracked_storages()
        total = sum(n for _, n, _ in rows)
        meter.finish_setup(total)
        if meter.name == "cpu-budget":
            for _, n, t in rows:
                _budget.watch_external(local_tensor(t).untyped_storage()._weak_ref(), n)
        return total

    def outside_model(self, device):
        """(bytes, count, largest) of the distinct storages on `device` that live tensors hold
        outside the model (neither its parameters and buffers nor its modules' attributes), with
        `largest` a description of the largest tensor ("float32[4096, 4096]"); on the CPU only
        those the budget allocator does not count (made before the search)."""
        own = set()
        for t in self.tensors + [t for _, t in self.held]:
            ptr = _storage_ptr(t)
            if ptr:
                own.add(ptr)
        rows = (
            [(p, n, t) for p, n, t in self._untracked_storages() if p not in own]
            if device.type == "cpu"
            else [(p, n, t) for p, n, t in live_storages(device, self.own_ptrs()) if p not in own]
        )
        if not rows:
            return 0, 0, ""
        _, n, t = max(rows, key=lambda r: r[1])
        dtype = str(t.dtype).replace("torch.", "")
        return sum(r[1] for r in rows), len(rows), f"{dtype}{list(t.shape)} ({n} bytes)"

    def _untracked_storages(self):
        """[(data pointer, bytes, a tensor)] of the distinct untracked CPU storages alive."""
        rows = [
            (p, n, t)
            for p, n, t in _distinct(
                self.tensors + [t for _, t in self.held], torch.device("cpu"), set()
            )
        ]
        seen = {p for p, _, _ in rows}
        rows += [
            (p, n, t)
            for p, n, t in live_storages(torch.device("cpu"), self.own_ptrs())
            if p not in seen
        ]
        return [(p, n, t) for p, n, t in rows if not _budget.is_tracked(p)]


def _storage_ptr(t):
    """The data pointer of the storage behind `t` (a DTensor's local shard), or 0 where it has
    none that holds bytes here (meta, fake and sparse tensors, wrapper subclasses)."""
    try:
        s = local_tensor(t).untyped_storage()
        return s.data_ptr() if s.nbytes() > 0 else 0
    except Exception:  # noqa: BLE001  sparse, nested, fake or functional tensors have none
        return 0


def _distinct(tensors, device, skip):
    """[(data pointer, bytes, tensor)] of the distinct storages of `tensors` on `device` (its
    type; on CUDA its index too), those in `skip` left out."""
    out, seen = [], set(skip)
    for t in tensors:
        try:
            where = t.device
        except Exception:  # noqa: BLE001  a wrapper subclass without a device
            continue
        if where.type != device.type or (
            device.type == "cuda" and device.index is not None and where.index != device.index
        ):
            continue
        ptr = _storage_ptr(t)
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        out.append((ptr, local_tensor(t).untyped_storage().nbytes(), t))
    return out


def live_storages(device, skip=()):
    """[(data pointer, bytes, tensor)] of the distinct storages on `device` behind every tensor
    Python's collector tracks (gc.get_objects(): the tensors any Python object refers to), those
    in `skip` left out. Not seen: tensors only C++ holds (an autograd graph's saved tensors, a
    TorchScript module's attributes) and objects frozen out of the collector (gc.freeze)."""
    # type(), not isinstance(): isinstance reads an object's __class__, which a lazy module
    # proxy resolves (torch.distributed's deprecated reduce_op warned from here).
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    return _distinct(tensors, device, skip)
