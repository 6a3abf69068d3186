"""Lightning's "boring" demo classes for tasktrain: random data and a tiny module that trains, validates, tests and
predicts with no set-up, as scripts and bug reports written against `lightning.pytorch.demos.boring_classes` expect
them (same shapes, same random draws, same optimizer and scheduler, so the numbers match).

    from tasktrain.demos.boring_classes import BoringModel
    Trainer(max_steps=2).fit(BoringModel())
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.module import TaskModule


class RandomDataset(Dataset):
    """`length` random vectors of `size` values, drawn once."""

    def __init__(self, size: int, length: int):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


class RandomDictDataset(RandomDataset):
    """RandomDataset's vectors as {"a": x, "b": x + 2}."""

    def __getitem__(self, index):
        a = self.data[index]
        return {"a": a, "b": a + 2}


class RandomIterableDataset(IterableDataset):
    """`count` random vectors of `size` values, drawn as they are read (no length)."""

    def __init__(self, size: int, count: int):
        self.size, self.count = size, count

    def __iter__(self):
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(RandomIterableDataset):
    def __len__(self):
        return self.count


class BoringModel(TaskModule):
    """Linear(32, 2) pulled towards ones by an MSE loss; SGD(lr=0.1) with StepLR(step_size=1); each loader is 64
    random vectors, batch size 1. The steps return {"loss": ...} (training), {"x": ...} (validation), {"y": ...}
    (test)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x):
        return self.layer(x)

    def loss(self, preds, labels=None):
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch):
        return self.loss(self(batch))

    def training_step(self, batch, batch_idx):
        return {"loss": self.step(batch)}

    def validation_step(self, batch, batch_idx):
        return {"x": self.step(batch)}

    def test_step(self, batch, batch_idx):
        return {"y": self.step(batch)}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self):
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self):
        return DataLoader(RandomDataset(32, 64))


class ManualOptimBoringModel(BoringModel):
    """BoringModel trained with manual optimisation (one optimizer step per batch)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class BoringDataModule(DataModule):
    """256 random vectors split in four: training, validation, test and prediction (64 each), batch size 1."""

    def __init__(self):
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage):
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 128))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(128, 192))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(192, 256))

    def train_dataloader(self):
        return DataLoader(self.random_train)

    def val_dataloader(self):
        return DataLoader(self.random_val)

    def test_dataloader(self):
        return DataLoader(self.random_test)

    def predict_dataloader(self):
        return DataLoader(self.random_predict)


class BoringDataModuleNoLen(BoringDataModule):
    """BoringDataModule over iterable datasets without a length (512, 128, 256 and 64 vectors)."""

    def __init__(self):
        DataModule.__init__(self)

    def setup(self, stage):
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)


class IterableBoringDataModule(DataModule):
    """Lightning's: each stage a list of two loaders of 4-value vectors, one over a RandomDataset and one over a
    RandomIterableDataset (16 each for training, 32 validation, 64 test, 128 prediction), batch size 1."""

    def setup(self, stage):
        if stage == "fit":
            self.train_datasets = [RandomDataset(4, 16), RandomIterableDataset(4, 16)]
        if stage in ("fit", "validate"):
            self.val_datasets = [RandomDataset(4, 32), RandomIterableDataset(4, 32)]
        if stage == "test":
            self.test_datasets = [RandomDataset(4, 64), RandomIterableDataset(4, 64)]
        if stage == "predict":
            self.predict_datasets = [RandomDataset(4, 128), RandomIterableDataset(4, 128)]

    def train_dataloader(self):
        return [DataLoader(dataset) for dataset in self.train_datasets]

    def val_dataloader(self):
        return [DataLoader(dataset) for dataset in self.val_datasets]

    def test_dataloader(self):
        return [DataLoader(dataset) for dataset in self.test_datasets]

    def predict_dataloader(self):
        return [DataLoader(dataset) for dataset in self.predict_datasets]


class DemoModel(TaskModule):
    """Linear(32, out_dim) + ReLU whose training loss is the sum of its outputs; Adam(lr=learning_rate)."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02):
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x):
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch, batch_nb):
        return self(batch).sum()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """A small MNIST classifier (two convolutions, two linear layers, log-softmax output)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return F.log_softmax(self.fc2(self.dropout2(F.relu(self.fc1(x)))), dim=1)
