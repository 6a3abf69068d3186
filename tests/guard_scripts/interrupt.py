"""A run to press Ctrl-C in: writes ready<rank> once training is under way, then trains slowly until interrupted.

    python interrupt.py --root DIR [--devices 2]

With --devices 2 a first, short fit checks the non-finite rule across ranks on the same processes (one launch): the
loss is NaN on rank 1 only, at step 3, with finite gradients; both ranks must refuse that step's save together
(FloatingPointError on each, recorded in fpe<rank>), leaving the checkpoints of steps 1-2; then the same NaN with no
checkpoint to save and a log step at every step: the loop's loss check stops both ranks with one error (fpe_log<rank>).
"""
import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Callback, ModelCheckpoint, OnExceptionCheckpoint, TaskModule, Trainer


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


class NaNOnRank1(Net):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        nan = self.trainer.global_rank == 1 and self.trainer.global_step == 2
        # NaN as the reported loss, zero gradient through it: the weights stay finite, only rank 1 knows
        return torch.where(torch.tensor(nan), torch.tensor(float("nan")), loss)


def fit_with_nan_on_rank_1(root, folder, record, **trainer_args):
    """A short 2-process fit of NaNOnRank1 in root/folder; the FloatingPointError each rank gets goes to
    root/<record><rank>."""
    trainer = Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=os.path.join(root, folder), strategy="ddp", devices=2, accelerator="cpu",
                      **trainer_args)
    try:
        trainer.fit(NaNOnRank1(), DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4))
    except FloatingPointError as err:
        with open(os.path.join(root, f"{record}{trainer.global_rank}"), "w") as f:
            f.write(str(err))


def nonfinite_on_one_rank(root):
    """Every step saved: the save of step 3 is refused on both ranks together."""
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root, "nan"), every_n_train_steps=1, save_top_k=-1,
                                 save_last=True)
    fit_with_nan_on_rank_1(root, "nan", "fpe", callbacks=[checkpoint], log_every_n_steps=50)


def nonfinite_loss_on_one_rank_without_saves(root):
    """No checkpoint to refuse: the loop's own loss check at the log step (every step here) must stop both ranks
    with the same error naming rank 1, not rank 1 alone while rank 0 waits in its next collective."""
    fit_with_nan_on_rank_1(root, "nan_log", "fpe_log", enable_checkpointing=False, log_every_n_steps=1)


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
    if args.devices > 1:
        nonfinite_on_one_rank(args.root)
        nonfinite_loss_on_one_rank_without_saves(args.root)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    callbacks = [Report(args.root)]
    if args.devices == 1:  # (OnExceptionCheckpoint refuses several processes: Report records their hooks)
        callbacks.append(OnExceptionCheckpoint(dirpath=args.root))
    trainer = Trainer(max_epochs=1000, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_checkpointing=args.devices == 1, enable_model_summary=False, default_root_dir=args.root,
                      strategy="ddp" if args.devices > 1 else "auto", devices=args.devices, accelerator="cpu")
    trainer.fit(Net(), data)
    print("fit returned", flush=True)  # never: Ctrl-C ends the process with code 1


if __name__ == "__main__":
    main()
