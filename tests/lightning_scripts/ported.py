"""A Lightning 2.x script ported by renames alone; tests/test_lightning.py runs it on 1 and 2 processes.

The renames (docs/lightning.md):
    import lightning.pytorch as pl                         ->  import tasktrain as pl
    pl.LightningModule, pl.LightningDataModule             ->  pl.TaskModule, pl.DataModule
    lightning.pytorch.callbacks / .utilities / .loggers    ->  tasktrain.callbacks / .utilities / .loggers

    python ported.py OUT --devices N      # writes OUT/rank{R}.json with what each rank saw
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

import tasktrain as pl
from tasktrain.callbacks import Callback, ModelCheckpoint
from tasktrain.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from tasktrain.utilities import rank_zero_info, rank_zero_only
from tasktrain.utilities.types import STEP_OUTPUT

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=1)
args = parser.parse_args()
DATA_DIR = os.path.join(args.out, "data")
STRATEGY = "ddp" if args.devices > 1 else "auto"


# -- the autoencoder example, with a DataModule ------------------------------------------------------------------------
class SyntheticData(pl.DataModule):
    def __init__(self, data_dir, batch_size=8):
        super().__init__()
        self.data_dir, self.batch_size = data_dir, batch_size
        self.stages = []

    def prepare_data(self):
        # the "download": once per machine, the other ranks wait for it before setup
        os.makedirs(self.data_dir, exist_ok=True)
        with open(os.path.join(self.data_dir, "prepare_calls"), "a") as f:
            f.write("x")
        path = os.path.join(self.data_dir, "data.pt")
        if not os.path.exists(path):
            torch.save(torch.randn(64, 8, generator=torch.Generator().manual_seed(0)), path + ".tmp")
            os.replace(path + ".tmp", path)

    def setup(self, stage):
        data = TensorDataset(torch.load(os.path.join(self.data_dir, "data.pt")))
        self.train_set, self.val_set = random_split(data, [48, 16], generator=torch.Generator().manual_seed(1))
        self.stages.append(stage)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def state_dict(self):
        return {"batch_size": self.batch_size}

    def load_state_dict(self, state_dict):
        self.batch_size = state_dict["batch_size"]


class LitAutoEncoder(pl.TaskModule):
    def __init__(self, hidden=4, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(8, hidden), nn.ReLU())
        self.decoder = nn.Linear(hidden, 8)
        self.batches_moved = 0

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx) -> STEP_OUTPUT:
        (x,) = batch
        loss = F.mse_loss(self(x), x)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", F.mse_loss(self(x), x), sync_dist=True)

    def test_step(self, batch, batch_idx):
        (x,) = batch
        self.log("test_loss", F.mse_loss(self(x), x), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.batches_moved += 1
        return batch

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        self.total_steps = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# -- a classifier with two validation loaders ---------------------------------------------------------------------------
class LitClassifier(pl.TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, 3)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)
        # (one loader per unsuffixed name, Lightning's rule: each loader counts under a name of its own)
        self.log(f"val_batches_{dataloader_idx}", 1.0, reduce_fx=torch.sum, add_dataloader_idx=False, sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):  # (x, label) pairs: the default gives forward both
        return self(batch[0])

    def configure_callbacks(self):
        return [EarlyStopping("val_acc/dataloader_idx_0", mode="max", patience=1, verbose=False)]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # no progress: EarlyStopping runs out of patience


def classification(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()), batch_size=4)


# -- a callback with hooks from each family ---------------------------------------------------------------------------
class Counter(Callback):
    def __init__(self):
        self.events = {}

    def _count(self, name):
        self.events[name] = self.events.get(name, 0) + 1

    def on_fit_start(self, trainer, pl_module):
        self._count("on_fit_start")

    def on_train_epoch_start(self, trainer, pl_module):
        self._count("on_train_epoch_start")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._count(f"on_validation_batch_end[{dataloader_idx}]")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._count("on_before_optimizer_step")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._count("on_save_checkpoint")

    def on_test_end(self, trainer, pl_module):
        self._count("on_test_end")


@rank_zero_only
def mark_rank_zero(out):
    open(os.path.join(out, f"rank_zero_only_ran_on_{rank_zero_only.rank}"), "w").close()
    rank_zero_info("rank zero only")


common = dict(accelerator="cpu", devices=args.devices, strategy=STRATEGY, enable_progress_bar=False, logger=False)
facts = {}

# 1. autoencoder: fit / validate / test / predict on the DataModule, resume from its checkpoint
data = SyntheticData(DATA_DIR)
counter = Counter()
checkpoint = ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), save_top_k=-1, save_last=True)
trainer = pl.Trainer(max_epochs=2, callbacks=[counter, checkpoint], default_root_dir=args.out, **common)
model = LitAutoEncoder()
trainer.fit(model, datamodule=data)
facts["fit"] = {"global_step": trainer.global_step, "current_epoch": trainer.current_epoch,
                "total_steps": model.total_steps, "num_training_batches": trainer.num_training_batches,
                "batches_moved": model.batches_moved, "datamodule_is_trainers": trainer.datamodule is data}
facts["validate"] = trainer.validate(model, datamodule=data)
facts["test"] = trainer.test(model, datamodule=data)
facts["predict_rows"] = sum(p.shape[0] for p in trainer.predict(model, datamodule=data))
facts["stages"] = data.stages
facts["events"] = counter.events
saved = torch.load(os.path.join(args.out, "ckpt", "last.ckpt"), weights_only=False)
facts["datamodule_state"] = saved.get("SyntheticData")
data.batch_size = 99  # the checkpoint's DataModule state puts it back
first_epoch = sorted(f for f in os.listdir(os.path.join(args.out, "ckpt")) if f.startswith("epoch=0"))[0]
resumed = pl.Trainer(max_epochs=2, default_root_dir=args.out, enable_checkpointing=False, **common)
resumed.fit(LitAutoEncoder(), datamodule=data, ckpt_path=os.path.join(args.out, "ckpt", first_epoch))
facts["resumed"] = {"batch_size": data.batch_size, "global_step": resumed.global_step}
mark_rank_zero(args.out)

# 2. classifier with two validation loaders, EarlyStopping from configure_callbacks
classifier = LitClassifier()
trainer = pl.Trainer(max_epochs=6, enable_checkpointing=False, **common)
trainer.fit(classifier, classification(32, 0), [classification(16, 1), classification(8, 2)])
stopper = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
facts["classifier"] = {
    "metrics": sorted(k for k in trainer.callback_metrics if k.startswith("val_")),
    "val_batches": [float(trainer.callback_metrics[f"val_batches_{i}"]) for i in (0, 1)],
    "num_val_batches": trainer.num_val_batches,
    "stopping_reason": stopper.stopping_reason.name, "stopped_epoch": stopper.stopped_epoch,
    "current_epoch": trainer.current_epoch,
    "validate": trainer.validate(classifier, [classification(16, 1), classification(8, 2)]),
}
assert stopper.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED

# 3. each rank reads the whole loader with use_distributed_sampler=False
trainer = pl.Trainer(use_distributed_sampler=False, **common)
facts["unsharded_predict_rows"] = sum(p.shape[0] for p in trainer.predict(classifier, classification(16, 1)))

# 4. last (it fails before training on every rank alike): SyncBatchNorm has no CPU kernel
try:
    # a whole epoch and two validation loaders: its EarlyStopping's "val_acc/dataloader_idx_0" must be logged, or
    # the check at the epoch end raises (as Lightning's does)
    pl.Trainer(max_epochs=1, sync_batchnorm=True, enable_checkpointing=False, **common).fit(
        LitClassifier(), classification(8, 0), [classification(8, 1), classification(8, 2)])
    facts["sync_batchnorm"] = "ran"
except ValueError as err:
    facts["sync_batchnorm"] = str(err)

with open(os.path.join(args.out, f"rank{rank_zero_only.rank}.json"), "w") as f:
    json.dump(facts, f)
