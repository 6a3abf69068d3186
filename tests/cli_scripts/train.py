"""A Lightning-style CLI script (LightningCLI -> TaskCLI): the module's own loaders, an EarlyStopping from the
config, the results as one JSON line for the test to read."""
import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule
from tasktrain.cli import TaskCLI


class Regressor(TaskModule):
    def __init__(self, lr: float = 0.1, hidden: int = 4, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def _data(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.hparams.batch_size)

    train_dataloader = val_dataloader = test_dataloader = _data


class CLI(TaskCLI):
    def report(self):
        print("RESULT " + json.dumps({
            "subcommand": self.subcommand, "global_step": self.trainer.global_step,
            "max_epochs": self.trainer.max_epochs, "lr": self.model.hparams.lr, "hidden": self.model.hparams.hidden,
            "callbacks": [type(c).__name__ for c in self.trainer.callbacks],
            "seed": self.config[self.subcommand]["seed_everything"], "first_random": torch.rand(1).item(),
            "metrics": {k: float(v) for k, v in self.trainer.callback_metrics.items()},
            "log_dir": self.trainer.log_dir,
        }), flush=True)

    after_fit = after_test = report


if __name__ == "__main__":
    CLI(Regressor, args=sys.argv[1:])
