"""Tiny models for the soak's tests (test_soak.py) and their plain loop (soak_loop.py): an MLP whose
forward hook keeps what it sees from a given forward on (the leak of issue 67 item 4c), and one
that fills a cache once at a given forward (growth that stops). Built from a seed, CPU."""
import torch

FEATURES, HIDDEN, CLASSES = 256, 512, 10


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(FEATURES, HIDDEN)
        self.b = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def hook_store(start=0):
    """An Mlp whose forward hook on its first layer appends the layer's output (kept with its
    graph) to `model.kept` from the `start`-th forward on, as a user's activation logger does."""
    torch.manual_seed(0)
    model = Mlp()
    model.kept, model.calls = [], 0

    def store(module, inputs, output):
        model.calls += 1
        if model.calls > start:
            model.kept.append(output)

    model.a.register_forward_hook(store)
    return model


KEPT = []  # what global_store's hook keeps: a module's global, which outlives any one soak


def global_store():
    """An Mlp whose forward hook appends its first layer's output to the global list KEPT (made
    empty here): unlike hook_store's list, nothing puts it back between two soaks."""
    torch.manual_seed(0)
    model = Mlp()
    KEPT.clear()
    model.a.register_forward_hook(lambda module, inputs, output: KEPT.append(output))
    return model


class CacheOnce(Mlp):
    """An Mlp that, at its `at`-th forward, makes a buffer of `nbytes` and keeps it for good (a
    lookup table built on first use): growth that stops."""

    def __init__(self, at=5, nbytes=1 << 20):
        super().__init__()
        self.at, self.nbytes, self.calls, self.cache = at, nbytes, 0, None

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            self.cache = torch.zeros(self.nbytes // 4)
        return super().forward(x)


def cache_once():
    torch.manual_seed(0)
    return CacheOnce()


def plain():
    torch.manual_seed(0)
    return Mlp()


class Running:
    """A running statistic kept as a tensor (a user's logging of the activations' energy)."""

    total = 0.0


RUNNING = Running()


def running_step(model, batch):
    """The user's step with a running statistic kept as a tensor: the `+=` keeps each step's
    graph, never backwarded, and with it the saved input of pow: the step's hidden activations
    (64 KiB at micro-batch 32). `.item()` would keep a number."""
    h = torch.relu(model.a(batch))
    RUNNING.total += h.pow(2).mean()
    return model.b(h).mean()


def running():
    """A plain Mlp; its step is running_step (STEPS), and the running total starts at 0."""
    RUNNING.total = 0.0
    return plain()


MODELS = {"hook_store": hook_store, "late_hook_store": lambda: hook_store(start=30),
          "global_store": global_store,
          "cache_once": cache_once, "plain": plain, "running": running}
STEPS = {"running": running_step}  # a model's own step (else `step`)


def example():
    torch.manual_seed(1)
    return torch.randn(1, FEATURES)


def step(model, batch):
    """The user's step: the mean of the logits as the loss."""
    return model(batch).mean()


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)
