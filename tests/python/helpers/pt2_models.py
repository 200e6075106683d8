"""The tiny models of pt2_export_test.py (the pt2 export against eager PyTorch, issues 19 and
26); the check that uses each says what wrong export it catches with it."""
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


class TiedLM(torch.nn.Module):
    """Token ids [B, T] -> logits [B, T, V]; the head shares the embedding's weight (GPT-2)."""

    def __init__(self, vocab=32, width=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mix(self.emb(ids))))


class RotaryLike(torch.nn.Module):
    """What a Hugging Face Llama adds to a plain model: a non-persistent buffer
    (``rotary_emb.inv_freq``, left out of ``state_dict``) and a tensor made in forward (lifted by
    torch.export as a constant)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 16), persistent=False)

    def forward(self, x):
        scale = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0,
                              1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5])
        return self.lin(x * torch.cos(self.inv_freq) * scale)


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
            return self.l(x)
        return -self.l(x)


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 1)  # 1x1, stride 1: where ATen's backend choice reads the batch
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        return self.fc(torch.relu(self.c2(x)).mean(dim=(2, 3)))


class Attention(torch.nn.Module):
    """Causal self-attention over [B, T, 16] with 2 heads, then a 4-class head per token."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 2, c // 2).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y.transpose(1, 2).reshape(b, t, c))


class HeavyHead(torch.nn.Module):
    """Activations near the input, parameters near the output: a ConvNeXt in small (issue 26).
    Backward makes the head's weight gradients first and frees the conv's activations last, so
    the eager step's peak holds both; a package that makes its weight gradients at the end of the
    step (Inductor's locality pass) holds them one after the other, and peaks lower."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32, 512)
        # a module name that is no Python identifier, as torchvision's RegNet has ("block1-0"):
        # the accumulating program named its gradient buffer after it, and FX's generated code
        # failed to compile (SyntaxError: invalid decimal literal)
        self.add_module("fc-2", torch.nn.Linear(512, 512))
        self.fc3 = torch.nn.Linear(512, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x)).mean((2, 3))
        return self.fc3(torch.relu(getattr(self, "fc-2")(torch.relu(self.fc1(x)))))


HEAVY_HEAD_EXAMPLE = (8, 3, 32, 32)


class GeluMlp(torch.nn.Module):
    """GPT-2's MLP in small: a tanh GELU written in Python (transformers' NewGELUActivation: eight
    ATen ops, each result a tensor in eager), then dropout. Without the dropout this step peaks
    in the backward of the GELU's last multiply, where eager keeps both factors until both
    gradients are made and the package frees each after its last use: under at batch 8, and
    refused by the memory check (docs/formats.md, "Known gaps")."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 512)
        self.drop = torch.nn.Dropout(0.1)
        self.down = torch.nn.Linear(512, 10)

    def forward(self, x):
        h = self.up(x)
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.down(self.drop(h))


class DropoutMlp(GeluMlp):
    """A dropout whose saved noise is alive where the step peaks (the head's backward)."""

    def forward(self, x):
        return self.down(self.drop(torch.relu(self.up(x))))


class PooledMlp(torch.nn.Module):
    """An average pooling whose input nothing else saves, as in DenseNet's transitions (issue
    26): eager's autograd keeps the pooling's input for its backward, and Inductor's lowering of
    avg_pool2d_backward reads only its sizes, so without _eager_lifetimes the package freed the
    up projection's output right after the forward's pooling (avg_pool1d is avg_pool2d on a
    view)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 512)
        self.down = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.down(torch.nn.functional.avg_pool1d(self.up(x), 2))


EAGER_BUFFER_MODELS = {"fused": GeluMlp, "mask": DropoutMlp, "lifetimes": PooledMlp}


EAGER_BUFFER_EXAMPLE = (8, 16, 64)


class PermutedNorm(torch.nn.Module):
    """ConvNeXt's pattern without torchvision: a stem conv, LayerNorm over channels done as
    permute / layer_norm / permute (torchvision's LayerNorm2d), and a block whose branch runs
    its Linear on the channels-last view and is added back in place (CNBlock with
    stochastic_depth_prob=0, where the stochastic depth returns its input)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.norm = torch.nn.LayerNorm(16, eps=1e-6)
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        x = self.norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        branch = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        branch += x
        return self.head(branch.mean((2, 3)))
