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
