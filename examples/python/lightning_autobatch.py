"""A Lightning script with `BatchSizeFinder()` replaced by autobatch's `AutobatchFinder`: the
micro-batch and `accumulate_grad_batches` for an exact effective batch, measured with this
module's own training_step and configure_optimizers (docs/drop-ins.md, "Lightning").

    python examples/python/lightning_autobatch.py --target-batch 2048 --memory-limit 28MiB

The 28 MiB are the whole process's tensors: the 8 MiB dataset this script holds in memory counts
too, as in the job. On a GPU drop --memory-limit (the card's memory is the limit) and pass
--accelerator gpu. Prints
the sizes found and the batch sizes the fit loop gave training_step; exits 3 when nothing fits.
Run by ctest (PythonExampleTest.Lightning).
"""
import argparse
import sys

import torch  # before autobatch (its extension binds to this torch)
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset

import autobatch
from autobatch.lightning import AutobatchFinder


class Data(L.LightningDataModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size  # what the script would use; the finder replaces it

    def setup(self, stage):
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(2048, 1024, generator=g),
                                  torch.randint(0, 10, (2048,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 512), torch.nn.GELU(),
                                       torch.nn.Linear(512, 512), torch.nn.GELU(),
                                       torch.nn.Linear(512, 10))
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append(len(batch[0]))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        # The schedule's length is read after the finder set the size and the accumulation.
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=1e-2, total_steps=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-batch", type=int, default=512)
    p.add_argument("--memory-limit", default=None, help="e.g. 28MiB (default: the device's)")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--max-steps", type=int, default=3)
    a = p.parse_args()
    finder = AutobatchFinder(target_batch=a.target_batch, memory_limit=a.memory_limit)
    trainer = L.Trainer(accelerator=a.accelerator, devices=1, max_steps=a.max_steps,
                        callbacks=[finder], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    model, data = Classifier(), Data()
    try:
        trainer.fit(model, datamodule=data)
    except autobatch.DoesNotFit as e:
        print(f"does not fit: {e}", file=sys.stderr)
        return 3
    assert finder.micro_batch is not None and finder.result is not None  # set by the fit's setup
    print(f"micro-batch {finder.micro_batch} x {trainer.accumulate_grad_batches} accumulation "
          f"steps = {finder.micro_batch * trainer.accumulate_grad_batches} (target "
          f"{a.target_batch}); largest safe micro-batch {finder.result.safe_micro_batch}; "
          f"training_step saw batches of {sorted(set(model.seen))}; {trainer.global_step} "
          "optimizer steps")
    ok = (finder.micro_batch * trainer.accumulate_grad_batches == a.target_batch
          and set(model.seen) == {finder.micro_batch} and trainer.global_step == a.max_steps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
