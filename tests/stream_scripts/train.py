"""Runs over streaming data (tasktrain.data.ShardedStream) that stop on one number of processes and DataLoader workers
and resume on another; every rank records the items it trains on, per optimizer step, and every reader the items it
reads.

    python train.py --root DIR --runs '[{"name": "ref", "api": "trainer", "data": "own", "batch": 8}, ...]'
    python -m tasktrain.cli.main launch --num_processes 2 train.py --root DIR --runs '[...]'

Each run, in order, in every process of the launch. A run's keys:
    name     files: DIR/NAME.ids.rank{R}.txt (per step: epoch, step, ids), DIR/NAME.reads.txt (what readers read),
             DIR/NAME/ (the Trainer's checkpoints: last.ckpt after every step), DIR/NAME.state/ (the Accelerator's
             save_state after step `save_at`)
    api      "trainer" or "accelerator";  data: "own" (a ShardedSource of ours: 4 shards of 12 generated items),
             "own45" (the same with 9 in the last shard), "files" (ShardFiles over 6 files of 8, written under DIR),
             "stateful" (torchdata's StatefulDataLoader over an IterableDataset that shards itself, the Trainer)
             or "plain" (an IterableDataset of 48 items that splits itself over DataLoader workers only, not over
             processes: read by rank 0 and dispatched)
    batch    per-process batch size;  workers: DataLoader workers per process (default 1)
    resume   the Trainer: a checkpoint path; the Accelerator: the name of a run whose save_state to load
    kill_at  SIGKILL rank `kill_rank` (default: the last) once step `kill_at` is done and saved
    fork     run it in a child process forked from this one, which waits for its end and goes on with the next run
             (fork such runs first, before this process trains: as a DataLoader forks a worker); under a launch of
             several processes every process forks one, and the children form a world of their own on port `port`
             (its store in rank 0's child): the killed rank's child ends by SIGKILL, the others' fits fail with it
    devices  (the Trainer) its devices, for a plain `python train.py` that the Trainer launches itself (devices=2:
             it starts rank 1, which runs the same runs); default: WORLD_SIZE of the launch (1 without one)
    gather   (the Accelerator) rank 0 writes each step's gather_for_metrics(ids) to DIR/NAME.ids.rankgathered.txt
The items: 48, numbered; a linear model with SGD (the ids are what the tests compare).
"""
import argparse
import json
import os
import signal
import sys
import traceback

import torch
from torch.utils.data import DataLoader

from tasktrain import Accelerator, Callback, ModelCheckpoint, TaskModule, Trainer, seed_everything
from tasktrain.data import ShardedStream, ShardFiles

N, EPOCHS = 48, 2


def item(i):
    x = torch.randn(6, generator=torch.Generator().manual_seed(i))
    return x, x[:2] * torch.tensor([1.5, -2.0]), i


class Generated:
    """A ShardedSource of our own: shard s holds items 12 s .. 12 s + 11, made when read ("own45": the last shard
    holds 9)."""

    def __init__(self, sizes=(12, 12, 12, 12)):
        self.sizes = list(sizes)

    def shard_sizes(self):
        return self.sizes

    def read(self, shard, indices):
        return [item(12 * shard + i) for i in indices]


class Recorded:
    """Any ShardedSource, noting the ids of the items read (by the process reading them: a DataLoader worker)."""

    def __init__(self, source, path):
        self.source, self.path = source, path

    def shard_sizes(self):
        return self.source.shard_sizes()

    def read(self, shard, indices):
        items = list(self.source.read(shard, indices))
        with open(self.path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "ids": [int(it[2]) for it in items]}) + "\n")
        return items


def shard_files(root):
    paths = [os.path.join(root, "shards", f"part-{k}.pt") for k in range(6)]
    if not os.path.exists(paths[-1]):
        os.makedirs(os.path.dirname(paths[0]), exist_ok=True)
        for k, path in enumerate(paths):
            torch.save([item(8 * k + i) for i in range(8)], path + ".tmp")
            os.replace(path + ".tmp", path)
    return paths


class OwnOrder(torch.utils.data.IterableDataset):
    """("stateful") An IterableDataset that shards itself: rank r of W, worker w of n reads items k of 0..47 with
    k % (W n) == r n + w, noting each read; its state (the next item) is what torchdata's StatefulDataLoader saves
    of each worker, so a restored worker goes on from there."""

    def __init__(self, path):
        self.path, self.next = path, None

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        rank, ranks = int(os.environ.get("RANK", "0")), world()
        start, self.next = (rank * workers + worker if self.next is None else self.next), None
        for k in range(start, N, ranks * workers):
            self.next = k + ranks * workers
            with open(self.path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "ids": [k]}) + "\n")
            yield item(k)

    def __len__(self):  # this rank's items
        return N // world()

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


class Plain(torch.utils.data.IterableDataset):
    """("plain") Items 0..47 as a user writes an IterableDataset: split over the DataLoader's workers (worker w of n
    reads items w, w + n, ...), as torch's documentation shows, but not over the processes; every read is noted."""

    def __init__(self, path):
        self.path = path

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for k in range(worker, N, workers):
            with open(self.path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "ids": [k]}) + "\n")
            yield item(k)

    def __len__(self):
        return N


def loader_of(root, run):
    if run["data"] == "plain":
        dataset = Plain(os.path.join(root, f"{run['name']}.reads.txt"))
        return DataLoader(dataset, batch_size=run["batch"], num_workers=run.get("workers", 1))
    if run["data"] == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        dataset = OwnOrder(os.path.join(root, f"{run['name']}.reads.txt"))
        return StatefulDataLoader(dataset, batch_size=run["batch"], num_workers=run.get("workers", 1))
    if run["data"] == "files":
        source = ShardFiles(shard_files(root))
    else:
        source = Generated((12, 12, 12, 9) if run["data"] == "own45" else (12, 12, 12, 12))
    stream = ShardedStream(Recorded(source, os.path.join(root, f"{run['name']}.reads.txt")))
    return DataLoader(stream, batch_size=run["batch"], num_workers=run.get("workers", 1))


def record(root, run, rank, epoch, step, ids):
    with open(os.path.join(root, f"{run['name']}.ids.rank{rank}.txt"), "a") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "ids": ids}) + "\n")


class Net(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(6, 2)

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        self.ids = ids.tolist()
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # after the optimizer step, before the checkpoint: a killed run has recorded what its checkpoint holds
        trainer = self.trainer
        record(self.root, self.run, trainer.global_rank, trainer.current_epoch, trainer.global_step, self.ids)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Kill(Callback):
    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)  # step `step` is done and its checkpoint written


def world():
    return int(os.environ.get("WORLD_SIZE", "1"))


def fit(root, run):
    seed_everything(7)
    devices = run.get("devices", world())
    callbacks = [ModelCheckpoint(dirpath=os.path.join(root, run["name"]), every_n_train_steps=1, save_last=True)]
    if run.get("kill_at") is not None:
        callbacks.append(Kill(run["kill_at"], run.get("kill_rank", devices - 1)))
    trainer = Trainer(strategy="ddp" if devices > 1 else "auto", devices=devices, accelerator="cpu",
                      max_epochs=EPOCHS, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=os.path.join(root, run["name"]))
    module = Net()
    module.root, module.run = root, run
    trainer.fit(module, loader_of(root, run), ckpt_path=run.get("resume"))


def accelerate(root, run):
    seed_everything(7)
    accelerator = Accelerator(cpu=True)
    net = Net()
    model, optimizer, loader = accelerator.prepare(net.layer, net.configure_optimizers(), loader_of(root, run))
    steps = {"value": 0}

    class Steps:  # the loop's step count, saved with the rest
        def state_dict(self):
            return dict(steps)

        def load_state_dict(self, state):
            steps.update(state)

    accelerator.register_for_checkpointing(Steps())
    if run.get("resume"):
        accelerator.load_state(os.path.join(root, f"{run['resume']}.state"))
    while loader.epoch < EPOCHS:
        epoch = loader.epoch
        for x, y, ids in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            steps["value"] += 1
            record(root, run, accelerator.process_index, epoch, steps["value"], ids.tolist())
            if run.get("gather"):  # the step's ids of all processes, without the repeats that even out the end
                gathered = accelerator.gather_for_metrics(ids)
                if accelerator.is_main_process:
                    record(root, run, "gathered", epoch, steps["value"], gathered.tolist())
            if steps["value"] == run.get("save_at", 3) and not run.get("resume"):
                accelerator.save_state(os.path.join(root, f"{run['name']}.state"))
                if run.get("kill_at") == steps["value"] and accelerator.process_index == run.get("kill_rank",
                                                                                                 world() - 1):
                    os.kill(os.getpid(), signal.SIGKILL)
    accelerator.end_training()


def forked(target, root, run):
    """A killed run in a child of this process: a process of its own, SIGKILLed by itself once step `kill_at` is
    saved, without a launch of its own (its interpreter and imports are this one's, already made). Under a launch of
    several processes each of them forks one; the children are a world of their own (their store on the run's port,
    not the launch agent's), and the surviving ranks' children end when their next collective finds the killed rank
    gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            if world() > 1:
                os.environ.update(MASTER_PORT=str(run["port"]), TORCHELASTIC_USE_AGENT_STORE="False")
            target(root, run)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(1)  # (only when the run did not kill it)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if int(os.environ.get("RANK", "0")) == run.get("kill_rank", world() - 1):
        if not killed:
            raise SystemExit(f"run {run['name']} was to end by SIGKILL; its process ended with status {status}")
    elif killed or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 1:
        raise SystemExit(f"run {run['name']}: a rank that was not killed was to fail with its killed peer; its "
                         f"process ended with status {status}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--runs", required=True)
    args = p.parse_args()
    for run in json.loads(args.runs):
        target = fit if run["api"] == "trainer" else accelerate
        if run.get("fork"):
            assert run.get("kill_at") is not None and (world() == 1 or run.get("port")), \
                "fork: a killed run (of several processes: on a port of its own)"
            forked(target, args.root, run)
        else:
            target(args.root, run)


if __name__ == "__main__":
    main()
