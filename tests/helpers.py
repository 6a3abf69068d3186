"""Tiny models and data shared by the tests."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule


def regression_data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


def loader(n=32, batch_size=8, shuffle=False, seed=0):
    return DataLoader(regression_data(n, seed), batch_size=batch_size, shuffle=shuffle)


class Linear(TaskModule):
    def __init__(self, lr=0.1):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def quiet(**kwargs):
    """Trainer keyword arguments for tests that do not test logging, progress or checkpointing."""
    base = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
    base.update(kwargs)
    return base


def outcome(make):
    """'ok', or the name of the exception's class (MisconfigurationException is one name for both frameworks):
    what the beside-Lightning tests compare for a configuration each framework accepts or refuses."""
    try:
        make()
    except Exception as error:  # noqa: BLE001 (the type is the result)
        return type(error).__name__
    return "ok"
