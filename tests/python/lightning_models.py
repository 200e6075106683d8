"""Tiny Lightning modules and a datamodule for the AutobatchFinder tests (tests/python/
test_lightning.py and the DDP script lightning_ddp.py): an MLP on 4096 features whose per-sample
memory (about 16 KB) puts the largest micro-batch at a few tens to hundreds under a few MiB."""
import torch
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 4096, 4


class Data(L.LightningDataModule):
    """`batch_size` is what the user's script set; the finder replaces it."""

    def __init__(self, batch_size=4, samples=512):
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def setup(self, stage):
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(self.samples, FEATURES, generator=g),
                                  torch.randint(0, CLASSES, (self.samples,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class Net(L.LightningModule):
    """Records the size of every batch the fit loop gives training_step (`seen`; the finder's
    trials call training_step directly and are not recorded: on_train_batch_start is the loop's)."""

    def __init__(self, lr=1e-3):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, CLASSES))
        self.lr = lr
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)  # raises outside the fit loop unless the finder silences it
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append(len(batch[0]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class ScheduledNet(Net):
    """OneCycleLR over trainer.estimated_stepping_batches: its length depends on the batch size
    and accumulate_grad_batches at the time configure_optimizers is called."""

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        steps = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=int(steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class TwoPassNet(Net):
    """A training_step that runs the network twice (a consistency term): about twice the
    activations of one forward, which only a trial of training_step itself sees."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        return loss + 0.1 * self.net(x.flip(0)).square().mean()


class ManualNet(Net):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


def trainer(*callbacks, **kwargs):
    options = dict(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
    options.update(kwargs)
    return L.Trainer(callbacks=list(callbacks), **options)
