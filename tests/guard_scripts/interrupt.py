"""A run to press Ctrl-C in: writes READY once training is under way, then trains slowly until interrupted.

    python interrupt.py --root DIR [--devices 2]
"""
import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Callback, OnExceptionCheckpoint, TaskModule, Trainer


class Net(TaskModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)  # slow enough that the signal lands inside the loop
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Report(Callback):
    def __init__(self, root):
        self.root = root

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            open(os.path.join(self.root, f"ready{trainer.global_rank}"), "w").close()

    def on_exception(self, trainer, module, exception):
        with open(os.path.join(self.root, f"on_exception{trainer.global_rank}"), "w") as f:
            f.write(type(exception).__name__)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--devices", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    callbacks = [Report(args.root)]
    if args.devices == 1:  # (OnExceptionCheckpoint refuses several processes: Report records their hooks)
        callbacks.append(OnExceptionCheckpoint(dirpath=args.root))
    trainer = Trainer(max_epochs=1000, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False, default_root_dir=args.root,
                      strategy="ddp" if args.devices > 1 else "auto", devices=args.devices, accelerator="cpu")
    trainer.fit(Net(), data)
    print("fit returned", flush=True)  # never: Ctrl-C ends the process with code 130


if __name__ == "__main__":
    main()
