"""DDP steps/s: Trainer(strategy="ddp") against a hand-written torch DDP loop, same model, same data, same world.

    python benchmarks/ddp.py [--repeats 5] [--steps 10] [--warmup 2] [--processes 2] [--quick]

An MLP 1024-4096-4096-10 (21M parameters), batch 128 per rank, SGD, gloo on CPU, one thread per rank.

The two loops are interleaved step by step, because this machine is shared and its load changes within
seconds: during a `trainer.fit`, a callback runs one step of the raw loop (its own DDP model, optimizer and
DataLoader) after each Trainer step. The Trainer's step time is the time from one batch start to the next
minus the raw step run in between, so it includes everything the Trainer does per step (data loading, hooks,
the loop's bookkeeping); the raw step is timed on its own. Each repeat is a fresh fit with `warmup` untimed
steps; the report gives each repeat's steps/s from the mean step times, and the median over the repeats.
Steps per CPU second (this process's CPU time, all threads) are shown too: the work per step, which the
load of other programs on the machine does not change. Target: tasktrain >= 0.97 x the raw loop.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tasktrain import Callback, TaskModule, Trainer


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                               torch.nn.ReLU(), torch.nn.Linear(4096, 10))


class MLP(TaskModule):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RawLoop:
    """The hand-written loop, one step per call."""

    def __init__(self, dataset):
        torch.manual_seed(0)
        self.model = torch.nn.parallel.DistributedDataParallel(mlp())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.batches = iter(DataLoader(dataset, batch_size=128, sampler=DistributedSampler(dataset, seed=0)))

    def step(self):
        x, y = next(self.batches)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def clocks():
    # wall time, and this process's CPU time (all its threads): the work done, whatever else the machine runs
    return time.perf_counter(), time.process_time()


class Lockstep(Callback):
    """After each Trainer step, one raw step; both timed apart, in wall and CPU seconds."""

    def __init__(self, raw, warmup):
        self.raw, self.warmup = raw, warmup
        self.tasktrain_times, self.raw_times = [], []  # (wall, cpu) per step
        self._batch_start, self._raw_time = None, (0.0, 0.0)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        now = clocks()
        if self._batch_start is not None and batch_idx > self.warmup:
            self.tasktrain_times.append(tuple(n - s - r for n, s, r in zip(now, self._batch_start, self._raw_time)))
        self._batch_start = now

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        start = clocks()
        self.raw.step()
        self._raw_time = tuple(e - s for e, s in zip(clocks(), start))
        if batch_idx >= self.warmup:
            self.raw_times.append(self._raw_time)


def one_repeat(dataset, warmup):
    clock = Lockstep(RawLoop(dataset), warmup)
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=dist.get_world_size(), max_epochs=1,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      log_every_n_steps=50, callbacks=[clock])
    torch.manual_seed(0)
    trainer.fit(MLP(), DataLoader(dataset, batch_size=128, shuffle=True))

    def rates(times):  # steps per wall second, steps per CPU second
        return tuple(1 / statistics.mean(column) for column in zip(*times))

    return rates(clock.raw_times), rates(clock.tasktrain_times)


def worker(rank, world, port, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), TASKTRAIN_LAUNCHER="spawn")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    n = world * (args.warmup + args.steps + 1) * 128
    dataset = TensorDataset(torch.randn(n, 1024, generator=g), torch.randint(0, 10, (n,), generator=g))
    raw, ours = [], []
    for repeat in range(args.repeats):
        (raw_rate, raw_cpu), (our_rate, our_cpu) = one_repeat(dataset, args.warmup)
        raw.append((raw_rate, raw_cpu))
        ours.append((our_rate, our_cpu))
        if rank == 0:
            print(f"  repeat {repeat}: raw torch DDP {raw_rate:.3f} steps/s, tasktrain DDP {our_rate:.3f} steps/s "
                  f"(ratio {our_rate / raw_rate:.3f}; per CPU second {our_cpu / raw_cpu:.3f})", flush=True)
    if rank == 0:
        results.put((raw, ours))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--quick", action="store_true", help="one short repeat: checks that the script runs")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 3, 1

    from tasktrain.strategies.launcher import find_free_port

    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    print(f"DDP benchmark: MLP 1024-4096-4096-10, batch 128 per rank, {args.processes} processes (gloo, CPU, "
          f"{args.threads} thread each), {args.repeats} repeats of {args.steps} timed steps, loops interleaved")
    torch.multiprocessing.start_processes(worker, args=(args.processes, find_free_port(), args, results),
                                          nprocs=args.processes, start_method="spawn")
    raw, ours = results.get()
    print(f"{'':16}{'median steps/s':>16}{'min':>10}{'max':>10}{'steps/CPU s':>14}")
    for name, rows in (("raw torch DDP", raw), ("tasktrain DDP", ours)):
        wall = [r[0] for r in rows]
        print(f"{name:16}{statistics.median(wall):16.3f}{min(wall):10.3f}{max(wall):10.3f}"
              f"{statistics.median(r[1] for r in rows):14.3f}")
    ratio = statistics.median(o[0] / r[0] for o, r in zip(ours, raw))
    cpu_ratio = statistics.median(o[1] / r[1] for o, r in zip(ours, raw))
    print(f"tasktrain / raw, median over repeats: {ratio:.3f} in steps/s, {cpu_ratio:.3f} in steps per CPU second "
          f"(target >= 0.97: {'met' if ratio >= 0.97 else 'NOT met'})")


if __name__ == "__main__":
    main()
