"""A run to interrupt and resume: dropout, shuffled data, gradient accumulation, a step-interval scheduler.

    python train.py --root DIR --out params.pt [--stop exception|sigterm|sigkill --at STEP --rank R]
                    [--resume] [--devices 2]
    python train.py --cases '[{"root": DIR, "out": params.pt, "stop": "exception", "at": 3}, ...]'
"""
import argparse
import json
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Callback, ModelCheckpoint, TaskModule, Trainer, seed_everything


class Net(TaskModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3),
                                        torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.body(x), y)
        self.log("loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.body(x), y), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Interrupt(Callback):
    def __init__(self, how, at, rank):
        self.how, self.at, self.rank = how, at, rank
        self.fired = False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # once, right after optimizer step `at` (with accumulation, several batches end at the same step)
        if trainer.global_step != self.at or trainer.global_rank != self.rank or self.fired:
            return
        self.fired = True
        if self.how == "exception":
            raise RuntimeError(f"interrupted at step {self.at}")
        if self.how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)


def fit(root, out, stop=None, at=-1, rank=0, resume=False, devices=1, epochs=3):
    seed_everything(1234)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(44, 6, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(44, 1, generator=g)
    train = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=4, shuffle=True)
    val = DataLoader(TensorDataset(x[40:], y[40:]), batch_size=4)
    callbacks = [ModelCheckpoint(every_n_train_steps=1, save_last=True, save_top_k=1)]
    if stop:
        callbacks.append(Interrupt(stop, at, rank))
    trainer = Trainer(max_epochs=epochs, accumulate_grad_batches=2, callbacks=callbacks, logger=False,
                      enable_progress_bar=False, default_root_dir=root, log_every_n_steps=2,
                      strategy="ddp" if devices > 1 else "auto", devices=devices,
                      num_sanity_val_steps=1)
    module = Net()
    trainer.fit(module, train, val, ckpt_path="last" if resume else None)
    if trainer.is_global_zero:
        torch.save({"params": {k: v.detach().clone() for k, v in module.state_dict().items()},
                    "global_step": trainer.global_step, "epoch": trainer.current_epoch,
                    "val_loss": float(trainer.callback_metrics["val_loss"])}, out)


def forked(case):
    """fit(**case) in a child of this process, which its SIGKILL must end (as the process of a run of its own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            fit(**case)
        finally:
            sys.stderr.flush()
            os._exit(1)  # (only when the run did not kill it)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise SystemExit(f"{case}: the run was to end by SIGKILL; its process ended with status {status}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root")
    p.add_argument("--out")
    p.add_argument("--stop", default=None)
    p.add_argument("--at", type=int, default=-1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    # Several one-process runs one after the other in this process (the imports once, not once per run): a JSON list
    # of fit()'s keyword arguments. An "exception" stop is caught here and its message written to ROOT/raised.txt
    # (fit raised it out; the test reads which), and each case's stderr begins with a line
    # "[case N]"; anything else that raises ends the process. A "sigkill" stop runs in a child forked from this
    # process (a process of its own that the kill ends, without an interpreter and imports of its own); put it first,
    # before this process trains (forking after OpenMP ran can hang the child).
    p.add_argument("--cases", default=None)
    args = p.parse_args()
    if args.cases is None:
        fit(args.root, args.out, args.stop, args.at, args.rank, args.resume, args.devices, args.epochs)
        return
    for number, case in enumerate(json.loads(args.cases)):
        print(f"[case {number}]", file=sys.stderr, flush=True)  # where each case's warnings begin
        if case.get("stop") == "sigkill":
            forked(case)
            continue
        if case.get("stop") != "exception":
            fit(**case)
            continue
        try:
            fit(**case)
        except RuntimeError as err:
            with open(os.path.join(case["root"], "raised.txt"), "w") as f:
                f.write(str(err))
        else:
            raise SystemExit(f"{case}: fit returned; the interruption did not raise")


if __name__ == "__main__":
    main()
