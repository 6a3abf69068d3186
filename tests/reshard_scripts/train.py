"""Runs that stop on one number of processes and resume on another; every rank records the samples it trains on.

    python train.py --root DIR --runs '[{"name": "ref2", "devices": 2, "batch": 4}, ...]'

Each run is one fit, in order, in this process (a Trainer with devices=2 self-launches rank 1, which runs the same
list). A run's keys:
    name        files: DIR/NAME/ (default_root_dir), DIR/NAME.ids.rank{R}.txt (appended to), DIR/NAME.out.pt
    devices     1 or 2;  batch: the per-process batch size;  strategy: "ddp" (default), "fsdp" or a DeepSpeed name
    resume      a checkpoint path to resume from
    kill_at     SIGKILL rank `kill_rank` (default 1) when step `kill_at` is done and its checkpoint written
    epochs      (default 2)
Every run checkpoints after every optimizer step (all kept: epoch=E-step=S.ckpt), so a later run can resume from
any step of an earlier one as if it had been killed right there.

The data: 48 samples, the id of each in the batch; a small MLP without dropout and AdamW with two param groups
(no weight decay on biases), so that a resume with the same global batch (per-process batch scaled) can be
compared with an uninterrupted run up to the order of fp32 reductions.
"""
import argparse
import json
import os
import signal

import torch
from torch.utils.data import DataLoader, Dataset

from tasktrain import Callback, ModelCheckpoint, TaskModule, Trainer, seed_everything

N = 48


class Numbered(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 6, generator=g)
        self.y = self.x[:, :2] * torch.tensor([1.5, -2.0]) + 0.1 * torch.randn(N, 2, generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Net(TaskModule):
    def __init__(self, lr=0.02):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        self.ids_prefix = None

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        self.seen = ids.tolist()
        return torch.nn.functional.mse_loss(self.body(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # after the optimizer step, before the checkpoint callback: a run killed later has recorded exactly the
        # batches its last checkpoint holds
        with open(f"{self.ids_prefix}.ids.rank{self.trainer.global_rank}.txt", "a") as f:
            f.write(json.dumps({"epoch": self.trainer.current_epoch, "step": self.trainer.global_step,
                                "ids": self.seen}) + "\n")

    def configure_optimizers(self):
        weights = [p for n, p in self.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in self.named_parameters() if n.endswith("bias")]
        return torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 0.01}],
                                 lr=self.hparams.lr, weight_decay=0.05)


class Kill(Callback):
    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        # the step `step` is done and its checkpoint written; the next batch has not started
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


def strategy_of(run):
    name = run.get("strategy", "ddp")
    if name.startswith("deepspeed"):
        from tasktrain import DeepSpeed

        return DeepSpeed(stage=int(name[-1]), gradient_clipping=0.0)
    if name == "fsdp":
        return name  # on one process too: a world of one, DCP resharding the 2-process checkpoint onto it
    # DDP on one process too: Lightning's DistributedSampler order of (seed, epoch) on every world size, which these
    # runs compare across 1 and 2 processes (a single-device fit draws each epoch's order as Lightning's
    # RandomSampler does: docs/checkpointing.md)
    return name


def fit(root, run):
    seed_everything(7)
    name = run["name"]
    # its own folder, also when resuming from another run's checkpoint (which would keep writing into that one's)
    callbacks = [ModelCheckpoint(dirpath=os.path.join(root, name, "checkpoints"), every_n_train_steps=1,
                                 save_top_k=-1, save_last=True)]
    if run.get("kill_at") is not None:
        callbacks.append(Kill(run["kill_at"], run.get("kill_rank", 1)))
    trainer = Trainer(strategy=strategy_of(run), devices=run["devices"], accelerator="cpu",
                      max_epochs=run.get("epochs", 2), callbacks=callbacks, logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=0, default_root_dir=os.path.join(root, name))
    module = Net()
    loader = DataLoader(Numbered(), batch_size=run["batch"], shuffle=True)
    module.ids_prefix = os.path.join(root, name)
    trainer.fit(module, loader, ckpt_path=run.get("resume"))
    if run.get("strategy") == "fsdp":
        # the module and the optimizer hold shards (DTensors): every rank gathers, rank 0 writes them as the others do
        params, optimizer = _fsdp_full_state(trainer, module)
        if trainer.is_global_zero:
            torch.save({"params": params, "optimizer": optimizer, "global_step": trainer.global_step},
                       os.path.join(root, f"{name}.out.pt"))
        return
    if trainer.is_global_zero and not run.get("strategy", "ddp").startswith("deepspeed"):
        # DeepSpeed: the final checkpoint (checkpoints/last.ckpt) holds the weights and the optimizer state
        optimizer = trainer.optimizers[0]
        torch.save({"params": {k: v.detach().clone() for k, v in module.state_dict().items()},
                    "optimizer": optimizer.state_dict(), "global_step": trainer.global_step},
                   os.path.join(root, f"{name}.out.pt"))


def _fsdp_full_state(trainer, module):
    """The whole weights, and the optimizer's state in optimizer.state_dict()'s layout (keyed by parameter number
    over the groups, in order), gathered from the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    params = trainer.strategy.full_state_dict(module)
    optimizer = trainer.optimizers[0]
    full = get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True))
    names = [name for group in full["param_groups"] for name in group["params"]]
    number = {name: i for i, name in enumerate(names)}
    state = {number[name]: {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in s.items()}
             for name, s in full["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in full["param_groups"]]
    return params, {"state": state, "param_groups": groups}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--runs", required=True)
    args = p.parse_args()
    for run in json.loads(args.runs):
        fit(args.root, run)


if __name__ == "__main__":
    main()
