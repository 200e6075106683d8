"""The data of the loader tests (test_loader.py, loader_epoch.py): a dataset of token sequences of
16 to 512 tokens sorted shortest first (the first batches are short, as a length-sorted corpus
gives them), the collators a job uses (pad to the batch's longest; pack into one row), a
bucketing batch_sampler, an IterableDataset of the same sequences, images of varying height and
width, and a small token model whose memory grows with the tokens of its batch."""
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

VOCAB = 512
SAMPLES = 2000
SHORTEST, LONGEST = 16, 512


def lengths():
    """SAMPLES lengths from SHORTEST to LONGEST, ascending."""
    step = (LONGEST - SHORTEST) / (SAMPLES - 1)
    return [round(SHORTEST + k * step) for k in range(SAMPLES)]


class Tokens(Dataset):
    """Sequence k: lengths()[k] token ids (deterministic), as {"input_ids": LongTensor [T]}."""

    def __init__(self, with_lengths=False):
        self._lengths = lengths()
        if with_lengths:
            self.lengths = list(self._lengths)
        self.loaded = 0  # samples read (the `lengths` path loads only the costliest)

    def __len__(self):
        return len(self._lengths)

    def __getitem__(self, k):
        self.loaded += 1
        t = self._lengths[k]
        return {"input_ids": (torch.arange(t) * (k + 1)) % VOCAB}


class StreamedTokens(IterableDataset):
    """The same sequences as a stream, shortest first."""

    def __iter__(self):
        ds = Tokens()
        for k in range(len(ds)):
            yield ds[k]


def pad(samples):
    """Pads to the batch's longest (DataCollatorWithPadding's rule): input_ids [B, T] and
    attention_mask [B, T]."""
    t = max(s["input_ids"].shape[0] for s in samples)
    ids = torch.zeros(len(samples), t, dtype=torch.long)
    mask = torch.zeros(len(samples), t, dtype=torch.long)
    for i, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        ids[i, :n] = s["input_ids"]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def pack(samples):
    """Packs the batch into one row (a padding-free collator): input_ids [1, sum T]."""
    return {"input_ids": torch.cat([s["input_ids"] for s in samples]).unsqueeze(0),
            "attention_mask": torch.ones(1, sum(s["input_ids"].shape[0] for s in samples),
                                         dtype=torch.long)}


class Buckets(Sampler):
    """A bucketing batch_sampler: samples of similar length together, `size` per batch, buckets
    in order of length (the shortest first)."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __iter__(self):
        for start in range(0, self.n, self.size):
            yield list(range(start, min(start + self.size, self.n)))

    def __len__(self):
        return (self.n + self.size - 1) // self.size


class ShuffledBuckets(Buckets):
    """The buckets in a random order each epoch, drawn from torch's global RNG (as a sampler
    without its own generator draws)."""

    def __iter__(self):
        buckets = list(super().__iter__())
        for k in torch.randperm(len(buckets)).tolist():
            yield buckets[k]


class TokenModel(torch.nn.Module):
    """Embedding, a per-token MLP (memory grows with B x T), masked mean, a classifier; the loss
    is the logits' mean square (a scalar that needs no labels)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                       torch.nn.Linear(256, 64))
        self.head = torch.nn.Linear(64, 8)

    def forward(self, input_ids, attention_mask):
        h = self.mlp(self.embed(input_ids))
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1)).pow(2).mean()


def model():
    torch.manual_seed(0)
    return TokenModel()


def loader(kind="pad", batch_size=8):
    """The job's loader: "pad" (padding collator, sorted, no shuffle), "lengths" (the same with
    the dataset's lengths column), "pack", "buckets" (a bucketing batch_sampler of batch_size),
    "stream" (the IterableDataset)."""
    if kind == "buckets":
        return DataLoader(Tokens(), batch_sampler=Buckets(SAMPLES, batch_size), collate_fn=pad)
    if kind == "stream":
        return DataLoader(StreamedTokens(), batch_size=batch_size, collate_fn=pad)
    collate = pack if kind == "pack" else pad
    return DataLoader(Tokens(with_lengths=kind == "lengths"), batch_size=batch_size,
                      collate_fn=collate)


class Images(Dataset):
    """Images of varying height and width: the tallest is narrow and the widest is short, so
    that no one sample is the largest in both (padded together they are 3 x 96 x 96)."""

    SHAPES = [(32, 32), (96, 24), (24, 96), (48, 48), (64, 40)]

    def __len__(self):
        return len(self.SHAPES)

    def __getitem__(self, k):
        h, w = self.SHAPES[k]
        return torch.full((3, h, w), float(k))


def pad_images(samples):
    h = max(s.shape[1] for s in samples)
    w = max(s.shape[2] for s in samples)
    out = torch.zeros(len(samples), 3, h, w)
    for i, s in enumerate(samples):
        out[i, :, : s.shape[1], : s.shape[2]] = s
    return out
