"""What a checkpoint stalls training with async_save (issue 29), against the synchronous save of the same state.

    python benchmarks/async_checkpoint.py            # an MLP of 85M parameters + Adam (1 GB of state), ~3 min
    python benchmarks/async_checkpoint.py --quick    # a smoke run (~3 MB of state)

One process, one Trainer fit (single device, fp32, Adam). A callback saves the run's checkpoint (Trainer.dump_
checkpoint: module, optimizer, loop state, RNG) at fixed steps, alternating:
- sync: `trainer.save_checkpoint(path)` (torch.save to a temporary name, flush, fsync, rename, "last" pointer);
- async: `trainer.strategy.save_checkpoint_async(checkpoint, path)` (what ModelCheckpoint(async_save=True) calls):
  the stall is the time until it returns, i.e. the staging copy into CPU memory; the write is timed by the
  writer's thread until the file is renamed into place.
Before each save the previous background write is waited for (outside the timed part), so that sync and async
saves never share the disk. The "stall ratio" is the median async stall / the median sync save, both of the same
state in the same run (target: at most 0.2x). The disk's sequential write speed is measured in the same run: the
same byte count written in 64 MiB chunks to the same folder, then fsync (like `dd conv=fsync`); the sync save's
throughput is printed as a fraction of it. The median time of the steps that ran while a background write was in
flight, next to the others', says what the writer's thread takes from training on a machine with few cores (the
write is not free: torch.save serialises on a CPU core, the kernel copies the pages).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tasktrain import Callback, TaskModule, Trainer  # noqa: E402


class MLP(TaskModule):
    def __init__(self, width, depth):
        super().__init__()
        layers = [torch.nn.Linear(64, width)]
        for _ in range(depth):
            layers += [torch.nn.ReLU(), torch.nn.Linear(width, width)]
        layers += [torch.nn.ReLU(), torch.nn.Linear(width, 1)]
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class Saves(Callback):
    def __init__(self, directory, every, count):
        self.directory, self.every, self.count = directory, every, count
        self.sync, self.stall, self.write, self.bytes = [], [], [], 0
        self.step_times = {"writing": [], "idle": []}
        self._last = None
        self._write_started = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._last = time.perf_counter()
        self._overlaps = trainer.strategy.checkpoint_writer.in_flight

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        writer = trainer.strategy.checkpoint_writer
        now = time.perf_counter()
        overlaps = self._overlaps or writer.in_flight  # a background write ran during (part of) this step
        self.step_times["writing" if overlaps else "idle"].append(now - self._last)
        step = trainer.global_step
        if step % self.every or len(self.sync) + len(self.stall) >= 2 * self.count:
            return
        self._finish(writer)  # outside the timed part: the two kinds never share the disk
        path = os.path.join(self.directory, f"step={step}.ckpt")
        if len(self.sync) <= len(self.stall):
            start = time.perf_counter()
            trainer.save_checkpoint(path)
            self.sync.append(time.perf_counter() - start)
            self.bytes = os.path.getsize(path)
        else:
            start = time.perf_counter()
            checkpoint = trainer.dump_checkpoint()
            trainer.strategy.save_checkpoint_async(checkpoint, path, on_complete=self._written)
            self.stall.append(time.perf_counter() - start)
            self._write_started = start

    def _written(self):  # the writer's thread, once the file is in place
        self.write.append(time.perf_counter() - self._write_started)

    def _finish(self, writer):
        writer.wait()
        for name in os.listdir(self.directory):
            os.remove(os.path.join(self.directory, name))

    def on_train_end(self, trainer, module):
        self._finish(trainer.strategy.checkpoint_writer)


def disk_write_speed(directory, nbytes):
    """Bytes per second of a sequential write of nbytes (64 MiB chunks) plus fsync, in `directory`."""
    chunk = os.urandom(1 << 20) * 64
    path = os.path.join(directory, "dd.bin")
    start = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    os.remove(path)
    return nbytes / seconds


def _list(seconds):
    return ", ".join(f"{s:.3f}" for s in seconds) + " s"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder in the working dir)")
    args = p.parse_args()
    torch.set_num_threads(1)
    width, depth, saves = (256, 2, 2) if args.quick else (3072, 9, 4)
    every = 4
    steps = every * 2 * saves + 2
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * 8, 64), torch.randn(steps * 8, 1))
    base = args.dir or os.getcwd()
    with tempfile.TemporaryDirectory(dir=base, prefix="async-ckpt-bench-") as directory:
        module = MLP(width, depth)
        params = sum(p.numel() for p in module.parameters())
        saver = Saves(directory, every, saves)
        trainer = Trainer(max_steps=steps, callbacks=[saver], logger=False, enable_progress_bar=False,
                          enable_checkpointing=False, enable_model_summary=False, default_root_dir=directory)
        trainer.fit(module, DataLoader(data, batch_size=8))
        speed = disk_write_speed(directory, saver.bytes)

    sync, stall, write = statistics.median(saver.sync), statistics.median(saver.stall), statistics.median(saver.write)
    mb = saver.bytes / 1e6
    writing, idle = saver.step_times["writing"], saver.step_times["idle"]
    print(f"state: {params / 1e6:.1f}M parameters + Adam, {mb:.1f} MB per checkpoint file; {len(saver.sync)} sync "
          f"and {len(saver.stall)} async saves in one fit")
    print()
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| sync save (training waits for it) | {sync:.3f} s |")
    print(f"| async save: training stall (staging) | {stall:.3f} s |")
    print(f"| async save: background write until renamed | {write:.3f} s |")
    print(f"| stall ratio (async stall / sync save) | {stall / sync:.3f}x |")
    print(f"| disk sequential write (same bytes, fsync) | {speed / 1e6:.1f} MB/s |")
    print(f"| sync save throughput | {mb / sync:.1f} MB/s |")
    print(f"| sync save throughput / disk write speed | {saver.bytes / sync / speed:.3f}x |")
    print(f"| steps timed: without / during a background write | {len(idle)} / {len(writing)} |")
    print(f"| each sync save / async stall / background write | {_list(saver.sync)} / {_list(saver.stall)} / "
          f"{_list(saver.write)} |")
    if writing and idle:
        print(f"| median step, no write in flight | {statistics.median(idle) * 1e3:.1f} ms |")
        print(f"| median step during a background write | {statistics.median(writing) * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
