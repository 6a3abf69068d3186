"""A training script whose CLI names the model class alone (no datamodule_class), run by
tests/test_cli_beside_lightning.py under LightningCLI (CLI_LIB=lightning) and TaskCLI (CLI_LIB=tasktrain) with the same
command line: `--data=data_group.SubData --data.batch_size=4` picks a DataModule, no --data trains on the model's own
loaders. It prints one JSON line with what ran."""
import json
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

if os.environ["CLI_LIB"] == "lightning":
    from lightning.pytorch import LightningDataModule as DataModule
    from lightning.pytorch import LightningModule as Module
    from lightning.pytorch.cli import LightningCLI as CLI
else:
    from tasktrain import DataModule
    from tasktrain import TaskModule as Module
    from tasktrain.cli import TaskCLI as CLI


def loader(n, batch_size):
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


class Model(Module):
    def __init__(self, hidden: int = 4):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):  # the model's own: 8 samples, 2 batches
        return loader(8, 4)


class SubData(DataModule):
    def __init__(self, batch_size: int = 2, samples: int = 16):
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def train_dataloader(self):
        return loader(self.samples, self.batch_size)


if __name__ == "__main__":
    cli = CLI(Model, save_config_kwargs={"overwrite": True})
    print(json.dumps({"datamodule": type(cli.datamodule).__name__ if cli.datamodule is not None else None,
                      "batch_size": getattr(cli.datamodule, "batch_size", None),
                      "global_step": cli.trainer.global_step, "data_config": cli.config["fit"]["data"] and
                      {"class_path": cli.config["fit"]["data"]["class_path"].rpartition(".")[2],
                       "init_args": dict(cli.config["fit"]["data"]["init_args"])}}))
