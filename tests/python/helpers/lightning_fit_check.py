"""Lightning's own fit as the truth for AutobatchFinder, in a fresh process on the CPU
(test_doors.py): a module whose training_step returns {"loss": ..., "logits": ...}, which
Lightning keeps whole through backward and the optimizer's step.

    python lightning_fit_check.py find LIMIT      prints {"max": B} (the finder, margin 0)
    python lightning_fit_check.py fit LIMIT B     prints {"outcome": "fits" | "out-of-memory"}

`fit` installs the budget allocator before anything is built (the data and the module count),
then runs Lightning's trainer.fit for 2 optimizer steps at batch size B, without autobatch."""
import json
import sys

import torch
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset

from fresh_budget import print_outcome

FEATURES, CLASSES, SAMPLES = 64, 1024, 8192  # 3 full batches at the sizes tried


class Data(L.LightningDataModule):
    def __init__(self, batch_size):
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g),
                                  torch.randint(0, CLASSES, (SAMPLES,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class DictNet(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, CLASSES))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, y), "logits": logits}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def trainer(*callbacks, steps):
    return L.Trainer(callbacks=list(callbacks), accelerator="cpu", max_steps=steps, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


def main():
    mode, limit = sys.argv[1], int(sys.argv[2])
    if mode == "find":
        import autobatch.lightning as abl
        finder = abl.AutobatchFinder(memory_limit=limit, margin=0)
        trainer(finder, steps=1).fit(DictNet(), datamodule=Data(4))
        print(json.dumps({"max": finder.result.max_micro_batch}))
        return
    b = int(sys.argv[3])
    print_outcome(limit, lambda: trainer(steps=2).fit(DictNet(), datamodule=Data(b)))

if __name__ == "__main__":
    main()
