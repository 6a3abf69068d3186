"""Helper for tests/test_lightning_ddp.py: issue 25's Lightning scripts on 2 DDP processes (self-launched, gloo):
a GAN with two optimizers under manual optimisation (training_step without batch_idx), and torchmetrics Metric
objects given to self.log. main() runs first in extras_ddp.py's launch; the tests import fit_gan and Scored for their
one-process references.

    python lightning_compat_ddp.py OUT STRATEGY     # writes OUT/rank{R}.json with what each rank saw
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule, Trainer

try:
    from ddp_scripts import common  # imported by the test (the one-process reference)
except ImportError:
    import common  # run as a script


class GAN(TaskModule):
    """Lightning's basic GAN shape: the generator's step with the discriminator toggled off, then the
    discriminator's; the noise is a function of the batch so that a one-process reference can repeat it."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.generator = torch.nn.Linear(3, 3)
        self.discriminator = torch.nn.Linear(3, 1)

    def training_step(self, batch):  # no batch_idx: Lightning reads the signature
        real, _ = batch
        noise = real.flip(1)
        opt_g, opt_d = self.optimizers()
        self.toggle_optimizer(opt_g)
        g_loss = -self.discriminator(self.generator(noise)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        d_loss = self.discriminator(self.generator(noise).detach()).mean() - self.discriminator(real).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self):
        return (torch.optim.SGD(self.generator.parameters(), lr=0.1),
                torch.optim.SGD(self.discriminator.parameters(), lr=0.1))


def fit_gan(batch_size, sampler=None, **trainer_args):
    x, y = common.regression_data()  # 32 samples
    gan = GAN()
    trainer = Trainer(max_epochs=2, **trainer_args)
    trainer.fit(gan, DataLoader(TensorDataset(x, y), batch_size=batch_size, sampler=sampler))
    return trainer, [p.detach().flatten().tolist() for p in gan.parameters()]


class Scored(TaskModule):
    """A classifier whose validation accuracy is a torchmetrics Metric given to self.log."""

    def __init__(self):
        super().__init__()
        import torchmetrics

        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 3)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

    def forward(self, x):
        return self.layer(x)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc(self(x), y)
        self.log("val_acc", self.val_acc)


def class_data():
    x, _ = common.regression_data()
    x = x[:21]  # 21 samples: 11 and 10 per rank in batches of 3 (unequal shards and last batches)
    return x, (x.sum(1) > 0).long() + (x[:, 0] > 0.5).long()


class _Regression(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def checkpoint_writes(out, **trainer_args):
    """The files this rank writes under ModelCheckpoint's folder (every open for writing, rename, link and copy
    into it) during a fit with top-k, last as a file and last as a link."""
    import builtins
    import shutil

    from tasktrain import ModelCheckpoint

    folder = os.path.join(out, "ckpt")
    written = []

    def recorded(name, target_arg):
        real = getattr(os, name) if name != "open" else builtins.open

        def call(*args, **kwargs):
            target = str(args[target_arg]) if len(args) > target_arg else ""
            mode = args[1] if name == "open" and len(args) > 1 else kwargs.get("mode", "r")
            if target.startswith(folder) and (name != "open" or any(c in mode for c in "wax")):
                written.append(os.path.basename(target))
            return real(*args, **kwargs)
        return real, call

    patched = {name: recorded(name, arg) for name, arg in (("open", 0), ("replace", 1), ("rename", 1), ("link", 1),
                                                           ("symlink", 1))}
    copy = shutil.copyfile
    shutil.copyfile = lambda src, dst, **kw: (written.append(os.path.basename(str(dst))), copy(src, dst, **kw))[1]
    for name, (_, call) in patched.items():
        setattr(builtins if name == "open" else os, name, call)
    try:
        x, y = common.regression_data()
        for save_last in (True, "link"):
            checkpoint = ModelCheckpoint(folder, save_top_k=-1, save_last=save_last, every_n_train_steps=2)
            Trainer(max_epochs=1, callbacks=[checkpoint], **{**trainer_args, "enable_checkpointing": True}).fit(
                _Regression(), DataLoader(TensorDataset(x, y), batch_size=8))
    finally:
        for name, (real, _) in patched.items():
            setattr(builtins if name == "open" else os, name, real)
        shutil.copyfile = copy
    return written, sorted(os.listdir(folder))


class Orders(TaskModule):
    """Records the dataset indices each rank trains and validates on, per epoch; logs epoch values with and without
    sync_dist."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.train_seen, self.val_seen = [], []

    def training_step(self, batch, batch_idx):
        self.train_seen.append([self.current_epoch, batch[0].tolist()])
        loss = self.layer(batch[0].float().unsqueeze(1)).pow(2).mean()
        self.log("train_loss", loss, on_epoch=True)  # an epoch value without sync_dist: Lightning warns
        self.log("train_step_only", loss)  # a step value: no warning
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_seen.append([self.current_epoch, batch[0].tolist()])
        self.log("val_idx", batch[0].float().mean())  # (an evaluation value is an epoch value: Lightning warns)
        self.log("val_synced", batch[0].float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def orders(**trainer_args):
    """A shuffling training loader without seed_everything: Lightning's DistributedSampler seed is 0 then."""
    torch.manual_seed(1234)  # (torch's seed is not the sampler's: only seed_everything's is)
    import warnings

    module = Orders()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(max_epochs=2, **trainer_args).fit(
            module, DataLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True),
            DataLoader(TensorDataset(torch.arange(11)), batch_size=2, shuffle=True))
    words = ("It is recommended to use `self.log(", "sampler has shuffling enabled")
    return {"train": module.train_seen, "val": module.val_seen,
            "warnings": [str(w.message) for w in caught if any(word in str(w.message) for word in words)]}


def main(out, strategy):
    # no seed_everything in this script: not even one a Lightning test of the pytest process left in the environment
    os.environ.pop("PL_GLOBAL_SEED", None)
    common_args = dict(strategy=strategy, devices=2, accelerator="cpu", enable_progress_bar=False, logger=False,
                       enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0)
    facts = {}
    trainer, facts["gan"] = fit_gan(4, **common_args)  # 4 batches of 4 per rank: of 8 over both
    facts["rank"] = trainer.global_rank
    facts["global_step"] = trainer.global_step
    x, y = class_data()
    results = Trainer(**common_args).validate(Scored(), DataLoader(TensorDataset(x, y), batch_size=3), verbose=False)
    facts["val_acc"] = results[0]["val_acc"]
    facts["checkpoint_writes"], facts["checkpoint_files"] = checkpoint_writes(out, **common_args)
    facts["orders"] = orders(**common_args)
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
