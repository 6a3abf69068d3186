"""Train a small classifier on scikit-learn's bundled 8x8 digits (no download).

    python examples/digits.py                              # one process
    python examples/digits.py --strategy ddp --devices 2   # two processes (gloo on CPU)
"""
import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import ModelCheckpoint, TaskModule, Trainer, seed_everything


class Classifier(TaskModule):
    def __init__(self, lr=2e-2, hidden=128):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 5, 0.5),
                                                   "interval": "epoch"}}


def digits_loaders(batch_size=64):
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    train_idx, val_idx = perm[:1400], perm[1400:]
    train = DataLoader(TensorDataset(x[train_idx], y[train_idx]), batch_size=batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[val_idx], y[val_idx]), batch_size=256)
    return train, val


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--max_epochs", type=int, default=15)
    parser.add_argument("--root", default="runs/digits")
    args = parser.parse_args()

    seed_everything(0)
    train, val = digits_loaders()
    devices = args.devices if args.devices == "auto" else int(args.devices)
    trainer = Trainer(strategy=args.strategy, devices=devices, precision=args.precision, max_epochs=args.max_epochs,
                      default_root_dir=args.root, log_every_n_steps=10,
                      callbacks=[ModelCheckpoint(monitor="val_acc", mode="max", save_last=True)])
    trainer.fit(Classifier(), train, val)
    if trainer.is_global_zero:
        acc = float(trainer.callback_metrics["val_acc"])
        print(f"final validation accuracy: {acc:.4f}")
        print(f"best checkpoint: {trainer.checkpoint_callback.best_model_path}")
        print(f"TensorBoard logs: {trainer.log_dir}")


if __name__ == "__main__":
    main()
