"""Exports the real models of autobatch's main job and tests into models/ (ignored by git).

torchvision ResNet-18, ResNet-50, MobileNetV3-Large, ViT-B/16 (random weights: memory does not
depend on their values) and a GPT-style decoder-only language model (vocabulary 32000, context
256, 12 layers of width 768, tied embeddings: about 110M parameters), and a small one of the same
code for the CPU benchmark (decoder_lm_small: vocabulary 8000, context 128, 4 layers of width 256,
about 5.2M parameters), mlp_8x2048 (8 x (Linear(2048, 2048) + ReLU), mean loss: the optimizer
step sets its peak) and vgg11_cifar (a CIFAR-style VGG-11 with BatchNorm at 3x32x32, 9.5M
parameters: the optimizer step sets its peak at small batches, the activations above it). Each
archive carries its input specs and loss (autobatch/inputs.json), so no --input flag is needed.

A model is exported again only when these scripts or torch changed since it was written (a stamp file
per model holds their hash). Run by scripts/bootstrap.sh with the project's Python environment.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from autobatch_export import export  # noqa: E402


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention (GPT-2 layout)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class DecoderLM(nn.Module):
    """GPT-style decoder-only LM: token ids [batch, context] int64 -> logits [batch, context, vocab]."""

    def __init__(self, vocab: int = 32000, context: int = 256, width: int = 768, layers: int = 12,
                 heads: int = 12):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(1, context, width))
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        nn.init.normal_(self.pos, std=1.0 / math.sqrt(width))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _vision(name: str):
    def make():
        import torchvision  # only when a torchvision model is made: the others export without it

        return (getattr(torchvision.models, name)(weights=None),
                (torch.randn(2, 3, 224, 224),), "cross-entropy", None)

    return make


def _mlp_8x2048():
    # Parameter-heavy (33.6M parameters, no activation worth the name at small batches): the
    # optimizer step sets its peak, so the optimizer's implementation decides it (docs/fidelity.md)
    # and the real memory curve is a max of phases (docs/search.md).
    layers = []
    for _ in range(8):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    return (nn.Sequential(*layers), (torch.randn(2, 2048),), "mean", None)


class VggCifar(nn.Module):
    """CIFAR-style VGG-11: conv 3x3 stacks with BatchNorm and ReLU, max-pooling between stages, a
    small classifier: [batch, 3, 32, 32] float32 -> logits [batch, 10]."""

    STAGES = [[64], [128], [256, 256], [512, 512], [512, 512]]

    def __init__(self, classes: int = 10):
        super().__init__()
        layers, width = [], 3
        for stage in self.STAGES:
            for out in stage:
                layers += [nn.Conv2d(width, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
                width = out
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(width, 512), nn.ReLU(),
                                        nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _vgg11_cifar():
    # 9.5M parameters (37 MB): with AdamW the optimizer step sets the peak at small batches and the
    # activations (about 2 MB per sample) above, the shape of issue 28 item 7's VGG case.
    return (VggCifar(), (torch.randn(2, 3, 32, 32),), "cross-entropy", None)


def _decoder_lm():
    return (DecoderLM(), (torch.randint(0, 32000, (2, 256)),), "cross-entropy", {0: 32000})


def decoder_lm_small(context: int = 128):
    """decoder_lm_small at another context (the pt2 fidelity runs it at 1024 tokens too)."""
    model = DecoderLM(vocab=8000, context=context, width=256, layers=4, heads=4)
    return (model, (torch.randint(0, 8000, (2, context)),), "cross-entropy", {0: 8000})


MODELS = {
    "resnet18": _vision("resnet18"),
    "resnet50": _vision("resnet50"),
    "mobilenet_v3_large": _vision("mobilenet_v3_large"),
    "vit_b_16": _vision("vit_b_16"),
    "decoder_lm": _decoder_lm,
    "decoder_lm_small": decoder_lm_small,
    "mlp_8x2048": _mlp_8x2048,
    "vgg11_cifar": _vgg11_cifar,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models"))
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), help="export only these")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    digest = hashlib.sha256()
    import autobatch_export  # the shim: SOURCES are the export's code in the package
    for script in (__file__, *autobatch_export.SOURCES):
        with open(script, "rb") as f:
            digest.update(f.read())
    stamp = digest.hexdigest()[:16] + " torch " + torch.__version__
    torch.manual_seed(0)
    for name in args.only or MODELS:
        path = os.path.join(args.out, f"{name}.pt")
        stamp_path = path + ".stamp"
        if os.path.exists(path) and os.path.exists(stamp_path) and open(stamp_path).read() == stamp:
            continue
        t0 = time.time()
        model, example, loss, int_high = MODELS[name]()
        params = sum(p.numel() for p in model.parameters())
        meta = export(model, path, example, loss=loss, int_high=int_high)
        with open(stamp_path, "w") as f:
            f.write(stamp)
        print(f"export_models: {name}: {params / 1e6:.1f}M parameters, {meta}, "
              f"{time.time() - t0:.1f} s -> {path}")


if __name__ == "__main__":
    main()
