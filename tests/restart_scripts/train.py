"""A run that loses a rank three times and restarts itself (issue 29); run under
`tasktrain launch --num_processes 2 --max_restarts 3 --use_cpu train.py ...` (or without --kills for the
uninterrupted reference), or plainly with --trainer-restarts N (Trainer(max_restarts=N) starts the elastic agent).

    python train.py --strategy ddp|zero2|fsdp --root DIR --out OUT [--kills STEP:RANK:WHEN,...]
    python train.py --runs '[["ref-ddp", "ddp", ""], ["killed-ddp", "ddp", "STEP:RANK:WHEN,..."], ...]' --root DIR \
        --out OUT   # several runs in turn in the same processes, each NAME into DIR/NAME and OUT-NAME

Kill number i (0-based) fires in attempt i of the launch (TORCHELASTIC_RESTART_COUNT == i), so a run with three
kills is restarted three times and its fourth attempt ends the fit. With --runs, a run's kills fire in the attempts
after the kills of the runs before it (the attempt that ends one run starts the next), and a restarted attempt skips
the runs whose results are written: three runs of three kills each need --max_restarts 9. WHEN is
- "step": SIGKILL right after optimizer step STEP (its background save has started);
- "write": the save of step STEP is made slow on every rank (its files are written after a pause) and rank RANK
  dies inside it: from its own background write, half-way through a file (a rank that writes nothing of that save,
  DDP's rank 1, dies at the next batch while rank 0 is writing).
Each attempt appends (global_step, rank, sample ids) per optimizer step to DIR/samples.rank{R}.jsonl; at the end
every rank writes OUT.rank{R}.pt: the whole weights, its optimizer state, and the samples of the final trajectory
(for each step, what the last attempt that ran it saw).
"""
import argparse
import io
import json
import os
import signal
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

from tasktrain import Callback, ModelCheckpoint, TaskModule, Trainer, seed_everything

ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ.get("RANK", "0"))


class Indexed(Dataset):
    def __init__(self, n=48):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x[:, :2].sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Net(TaskModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                                        torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


class Samples(Callback):
    """The sample ids of every optimizer step of this rank, appended to a file that outlives the attempt."""

    def __init__(self, path):
        self.path, self.ids = path, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ids.extend(int(i) for i in batch[2])
        with open(self.path, "a") as f:
            f.write(json.dumps([trainer.global_step, ATTEMPT, self.ids]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.ids = []


class Kill(Callback):
    def __init__(self, step, rank, when, writes):
        self.step, self.rank, self.when, self.writes = step, rank, when, writes
        self.armed = False  # the slow save of `step` is in flight (WHEN "write")

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.rank != RANK:
            return
        if self.when == "step" and trainer.global_step == self.step:  # step STEP is done, its save started
            os.kill(os.getpid(), signal.SIGKILL)
        if self.armed and not self.writes:
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0 is inside its (slowed) background write now

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # (ModelCheckpoint, the last callback, saves after this hook: the save of STEP is the slow one)
        if trainer.global_step == self.step and self.when == "write":
            self.armed = True
            SLOW["on"] = True


SLOW = {"on": False, "victim": False}
_torch_save = torch.save


def _slow_save(obj, f, *args, **kwargs):
    """torch.save as the background writers call it; when armed, after a pause, and on the victim half a file and
    then SIGKILL (a process killed during a background write)."""
    if threading.current_thread() is threading.main_thread() or not SLOW["on"]:
        return _torch_save(obj, f, *args, **kwargs)
    time.sleep(1.0)
    if SLOW["victim"]:
        buffer = io.BytesIO()
        _torch_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return _torch_save(obj, f, *args, **kwargs)


torch.save = _slow_save  # only background threads' calls change, and only in the armed attempt


def strategy_of(name):
    if name == "zero2":
        from tasktrain import DeepSpeed

        return DeepSpeed(stage=2, gradient_clipping=0.0)  # torch's Adam from configure_optimizers: nothing compiles
    return name


def local_tensors(obj):
    """The tensors of an optimizer state, in order, as this rank holds them (a DTensor's local shard)."""
    if isinstance(obj, torch.Tensor):
        return [obj.to_local() if hasattr(obj, "to_local") else obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in local_tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in local_tensors(v)]
    return []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy")
    p.add_argument("--runs", help="JSON [[name, strategy, kills], ...]: the runs in turn (see above)")
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kills", default="")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trainer-restarts", type=int, default=0, help="Trainer(max_restarts=N), for a plain `python "
                   "train.py` (the Trainer starts torch's elastic agent)")
    args = p.parse_args()
    if not args.runs:
        return run(args)
    # Several runs in one launch (the processes and their imports start once per attempt, not once per run and
    # attempt): each is the same run as in a fresh process (seeded, its own folder), as the tests check bit for bit.
    first_attempt = 0  # the attempt in which this run's first kill fires
    for name, strategy, kills in json.loads(args.runs):
        root, out = os.path.join(args.root, name), f"{args.out}-{name}"
        count = len([k for k in kills.split(",") if k])
        done = all(os.path.exists(f"{out}.rank{r}.pt") for r in range(2))  # (both ranks wrote before a next run)
        if not done:
            os.makedirs(root, exist_ok=True)
            run(argparse.Namespace(**dict(vars(args), strategy=strategy, root=root, out=out, kills=kills)),
                first_attempt)
        first_attempt += count


def run(args, first_attempt=0):
    callbacks = [Samples(os.path.join(args.root, f"samples.rank{RANK}.jsonl")),
                 ModelCheckpoint(dirpath=os.path.join(args.root, "ckpt"), every_n_train_steps=1, save_top_k=2,
                                 monitor="step", mode="max",
                                 save_last=True, async_save=True)]
    kills = [k.split(":") for k in args.kills.split(",") if k]
    SLOW["victim"] = False
    if 0 <= ATTEMPT - first_attempt < len(kills):
        step, rank, when = kills[ATTEMPT - first_attempt]
        writes = not (args.strategy == "ddp" and int(rank) != 0)  # DDP's rank 0 alone writes
        callbacks.append(Kill(int(step), int(rank), when, writes))
        SLOW["victim"] = when == "write" and int(rank) == RANK and writes

    seed_everything(1234)
    train = DataLoader(Indexed(), batch_size=4, shuffle=True)
    trainer = Trainer(max_epochs=args.epochs, strategy=strategy_of(args.strategy), devices=2, callbacks=callbacks,
                      logger=False, enable_progress_bar=False, default_root_dir=args.root, log_every_n_steps=1,
                      enable_model_summary=False, max_restarts=args.trainer_restarts)
    module = Net()
    trainer.fit(module, train)  # no ckpt_path: a restarted attempt resumes from the newest complete checkpoint

    weights = trainer.strategy.full_state_dict()
    optimizer = trainer.optimizers[0]
    final = {}
    with open(os.path.join(args.root, f"samples.rank{RANK}.jsonl")) as f:
        for line in f:
            step, attempt, ids = json.loads(line)
            final[step] = ids  # a later attempt's line for the same step replaces an earlier one
    _torch_save({"weights": {k: v.detach().clone() for k, v in weights.items()},
                "optimizer": [t.detach().clone() for t in local_tensors(optimizer.state_dict())],
                "samples": [final[s] for s in sorted(final)], "global_step": trainer.global_step,
                "attempt": ATTEMPT}, f"{args.out}.rank{RANK}.pt")


if __name__ == "__main__":
    main()
