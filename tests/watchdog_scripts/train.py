"""Helper for tests/test_watchdog.py: two-rank Trainer runs that hang on purpose; the watchdog must end them.

    python train.py OUT CASE [STRATEGY]          # self-launched (devices=2), or under torchrun / tasktrain launch

CASE
  sleep      stall_timeout=3. First a clean fit (sanity check, validation every 2 steps, a checkpoint per epoch)
             and trainer.validate(): no false alarm may come; it writes OUT/clean. Then a second fit, in which
             rank 1 sleeps forever in training_step at step 3.
  slow_save  stall_timeout=5. At step 2 a checkpoint save takes SAVE_SECONDS (12) on rank 0, a long event: no
             false alarm may come. Then rank 1 sleeps forever in training_step at step 3.
  loader     stall_timeout=3. Rank 0's data loader hangs (Dataset.__getitem__ sleeps) fetching the batch of step 3.
  extra      TASKTRAIN_DEBUG_COLLECTIVES=1, stall_timeout=30 (what ends the run must be the check, not the stall).
             Rank 1 alone calls strategy.reduce in training_step at step 3.
  sync_dist  TASKTRAIN_DEBUG_COLLECTIVES=1, stall_timeout=30. Rank 1 alone logs a sync_dist metric; at the next
             log flush the ranks reduce different metrics.
Every rank writes OUT/pid{R}; the rank that hangs writes OUT/stuck (time.time()) just before.
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from tasktrain import ModelCheckpoint, TaskModule, Trainer

out, case = sys.argv[1], sys.argv[2]
strategy = sys.argv[3] if len(sys.argv) > 3 else "ddp"
# 12 s: over twice stall_timeout (5 s) and past the judge's "stopped responding" bound (5 s + 3 ticks of 0.5 s), so
# the other rank, waiting for the save in a collective, would be blamed if long events did not count (20 s before:
# the same check, 8 s longer)
SAVE_SECONDS = float(os.environ.get("SAVE_SECONDS", "12"))
RANK = int(os.environ.get("RANK", "0"))  # the self-launched rank 0 has none yet: it is rank 0


def hang():
    with open(os.path.join(out, "stuck"), "w") as f:
        f.write(repr(time.time()))


class Data(Dataset):
    """32 samples; on rank 0 in case 'loader' the 7th sample read hangs (the batch of step 3, batch size 2)."""

    def __init__(self):
        self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        self.reads = 0

    def __len__(self):
        return 32

    def __getitem__(self, index):
        self.reads += 1
        if case == "loader" and RANK == 0 and self.reads == 7:
            hang()
            time.sleep(10_000)  # rank 0's data loader hangs here
        return self.x[index]


class Model(TaskModule):
    def __init__(self, hang_at=3):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.hang_at = hang_at
        self.saved = False

    def on_train_start(self):
        with open(os.path.join(out, f"pid{self.global_rank}"), "w") as f:
            f.write(str(os.getpid()))

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        if self.global_step == self.hang_at and self.global_rank == 1:
            if case in ("sleep", "slow_save"):
                hang()
                time.sleep(10_000)  # rank 1 hangs here
            if case == "extra":
                hang()
                self.trainer.strategy.reduce(torch.ones(1), op="sum")  # only rank 1 calls this collective
        if case == "sync_dist" and self.global_rank == 1:
            if self.global_step == 3:
                hang()
            self.log("only_on_rank_1", loss, sync_dist=True)
        # (synchronised only in case sync_dist: a sync_dist step value is reduced when logged, Lightning's rule, and
        # the other cases check where rank 0 waits for the hung rank 1: in DDP's backward all-reduce)
        self.log("loss", loss, sync_dist=case == "sync_dist")
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch).pow(2).mean(), sync_dist=True)

    def on_save_checkpoint(self, checkpoint):
        if case == "slow_save" and self.global_rank == 0 and not self.saved:
            self.saved = True
            time.sleep(SAVE_SECONDS)  # a slow filesystem

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(stall_timeout=5, **kwargs):
    options = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, log_every_n_steps=4)
    options.update(kwargs)
    return Trainer(strategy=strategy, accelerator="cpu", devices="auto" if "RANK" in os.environ else 2,
                   stall_timeout=stall_timeout, default_root_dir=out, **options)


if __name__ == "__main__":
    data = DataLoader(Data(), batch_size=2)
    if case == "sleep":
        clean = trainer(3, max_epochs=2, val_check_interval=2, enable_checkpointing=True)
        clean.fit(Model(hang_at=-1), data, DataLoader(Data(), batch_size=4))
        clean.validate(dataloaders=DataLoader(Data(), batch_size=4))
        if clean.is_global_zero:
            open(os.path.join(out, "clean"), "w").close()
        trainer(3, max_epochs=1000).fit(Model(), data)
    elif case == "slow_save":
        saving = ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=2, save_top_k=-1)
        trainer(max_epochs=1000, enable_checkpointing=True, callbacks=[saving]).fit(Model(), data)
    elif case == "loader":
        trainer(3, max_epochs=1000).fit(Model(), data)
    else:
        trainer(30, max_epochs=1000).fit(Model(), data)
