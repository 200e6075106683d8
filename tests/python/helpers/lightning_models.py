"""Tiny Lightning modules and a datamodule for the AutobatchFinder tests (tests/python/
test_lightning.py and the DDP script lightning_ddp.py): an MLP on 4096 features whose per-sample
memory (about 16 KB) puts the largest micro-batch at a few tens to hundreds under a few MiB."""
import torch
import lightning.pytorch as L
from torch.utils.data import DataLoader, Dataset, TensorDataset

FEATURES, CLASSES = 4096, 4


class Samples(Dataset):
    """`samples` seeded samples made when read, as a dataset on disk reads them: nothing held in
    memory between reads (a tensor dataset would be memory the job holds outside the model,
    which every trial counts: 8 MiB for 512 samples here)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(FEATURES, generator=g), int(torch.randint(0, CLASSES, (), generator=g))


class Data(L.LightningDataModule):
    """`batch_size` is what the user's script set; the finder replaces it."""

    def __init__(self, batch_size=4, samples=512):
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def setup(self, stage):
        self.data = Samples(self.samples)

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


class SetupNet(L.LightningModule):
    """Net's network and Data's samples, both built in the module's setup (Lightning's documented
    place for what needs the trainer), with no datamodule: before the module's setup it has
    neither layers nor data."""

    def __init__(self, batch_size=4, samples=512):
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def setup(self, stage):
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, CLASSES))
        self.data = Samples(self.samples)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class NoIndexNet(Net):
    """training_step(batch): Lightning passes batch_idx only to a step that takes it."""

    def training_step(self, batch):
        return super().training_step(batch, 0)


class LrLoggingNet(ScheduledNet):
    """A training_step that reads its optimizer and scheduler (the learning rate it logs)."""

    def training_step(self, batch, batch_idx):
        lr = self.lr_schedulers().get_last_lr()[0]
        assert self.optimizers().param_groups[0]["lr"] == lr
        self.log("lr", lr)
        return super().training_step(batch, batch_idx)


class SharedWeightNet(L.LightningModule):
    """One 1024-wide layer applied 8 times (weight sharing, a recurrent block), on 64 features of
    its own data: under autocast with its cache off, as Lightning's mixed precision runs, each use
    casts the weight anew (2 MiB in bf16), which the backward holds."""

    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.block = torch.nn.Linear(64, 1024), torch.nn.Linear(1024, 1024)
        self.head = torch.nn.Linear(1024, CLASSES)
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        # More samples than the memory allows in one batch: the answer is memory's, not the
        # dataset's length (the finder caps at it, as BatchSizeFinder does)
        self.data = TensorDataset(torch.randn(4096, 64, generator=g),
                                  torch.randint(0, CLASSES, (4096,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.inp(x)
        for _ in range(8):
            h = torch.tanh(self.block(h))
        return torch.nn.functional.cross_entropy(self.head(h).float(), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
