"""Tiny real models for the Python package's tests, built from configs (nothing downloaded), each
from a fixed seed so that a fresh process builds the same one (fresh_check.py)."""
import torch

TOKENS = 64  # sequence length of the language models' example batch


def resnet18():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10), torch.randn(1, 3, 32, 32)


def _ids(vocab):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, TOKENS), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    return LlamaForCausalLM(config), _ids(512)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config), _ids(512)


MODELS = {"resnet18": resnet18, "llama": llama, "gpt2": gpt2}


def mlp():
    """An MLP whose evaluation needs far less per sample than its training (no saved
    activations): 256 -> 1024 -> 1024 -> 10, 1.32 M parameters (issue 31's Python tests)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    return model, torch.randn(1, 256)


MODELS["mlp"] = mlp


def amp_mlp():
    """(model, (x, y)): a 1024-wide MLP whose weights' autocast casts (2 MiB each in bf16) are
    large beside a sample's activations, for the autocast cache's test (test_find.py)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    return model, (torch.randn(1, 1024), torch.randint(0, 10, (1,)))


def amp_mlp_step(model, batch):
    """The loop's forward and loss (its output dropped inside, as step= does)."""
    return torch.nn.functional.cross_entropy(model(batch[0]).float(), batch[1])


# ---- sharded (FSDP2) models for find_sharded (issue 43): a constructor to run on the meta device
# and the job's fully_shard calls.

class _Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class ShardedMlp(torch.nn.Module):
    """A pre-norm MLP stack with a classification head, width 257: no world size above 1 divides
    it, so the last ranks own fewer rows than the first (FSDP2 pads their storage)."""

    def __init__(self, d=257, depth=3, classes=10):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(d) for _ in range(depth))
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def sharded_mlp_batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 257, generator=g), torch.randint(0, 10, (1,), generator=g))


def sharded_mlp_step(model, batch):
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def sharded_llama():
    """A tiny Llama from a config (no download); its decoder layers are the units."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=503, hidden_size=96, intermediate_size=250, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def shard_units(model, mesh):
    """The job's sharding: every unit (the MLP's blocks, the Llama's decoder layers), then the
    root, with fully_shard's defaults."""
    from torch.distributed.fsdp import fully_shard
    layers = model.model.layers if hasattr(model, "model") else model.layers
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def adamw(params):
    return torch.optim.AdamW(params, foreach=False)
