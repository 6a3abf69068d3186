"""Streaming data (docs/data.md): resume latency, and the loader's throughput against a map-style one.

    python benchmarks/stream.py            # 100 shard files x 4096 items of 64 tokens (~105 MB in a temp folder)
    python benchmarks/stream.py --quick    # 20 files x 512 items (smoke run)

- resume latency: a run stopped 90% into an epoch, resumed: the time from building the loader to the first batch
  after the resume point. A ShardedStream (through the Trainer's data layer) starts at the saved global count and
  opens only the shards after it; "skipping by reading" is what a loader whose order is its own must do (and what
  tasktrain did before for an IterableDataset): read the consumed batches in order and drop them.
- tokens/s over one epoch (batches of 32, collated, nothing trained), 0 and 2 DataLoader workers: the ShardedStream
  over the files against a map-style loader (a TensorDataset of the same tokens held in memory, shuffled through the
  Trainer's sampler), the usual map-style set-up. With workers, the time includes starting them (once per epoch).
Each measurement is the median of `--repeats` runs; the OS file cache is warm after the first (as on a second run).
"""
import argparse
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tasktrain.data import ShardedStream, ShardFiles
from tasktrain.trainer.data import prepare_train_data

TOKENS, BATCH = 64, 32


def write_shards(folder, files, items):
    paths = []
    generator = torch.Generator().manual_seed(0)
    for k in range(files):
        path = os.path.join(folder, f"part-{k:05d}.pt")
        torch.save(torch.randint(0, 50_000, (items, TOKENS), generator=generator, dtype=torch.int32), path)
        paths.append(path)
    return paths


class InOrder(IterableDataset):
    """The same files read in order: a plain IterableDataset (its order is its own)."""

    def __init__(self, paths):
        self.paths = paths

    def __iter__(self):
        for path in self.paths:
            yield from torch.load(path, weights_only=True)


def first_batch_after(data):
    start = time.perf_counter()
    next(iter(data))
    return time.perf_counter() - start


def resume_latency(paths, items, repeats):
    total = len(paths) * items
    consumed = (int(total * 0.9) // BATCH) * BATCH
    ours, reading = [], []
    for _ in range(repeats):
        stream = ShardedStream(ShardFiles(paths, sizes=[items] * len(paths)))
        data = prepare_train_data(DataLoader(stream, batch_size=BATCH), 1, 0, seed=0)
        data.skip_samples(consumed)
        ours.append(first_batch_after(data))
        plain = prepare_train_data(DataLoader(InOrder(paths), batch_size=BATCH), 1, 0, seed=0)
        plain.skip(consumed // BATCH)  # read and drop the consumed batches (the warning says so)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reading.append(first_batch_after(plain))
    return consumed, total, statistics.median(ours), statistics.median(reading)


def tokens_per_second(data, items):
    start = time.perf_counter()
    count = 0
    for batch in data:
        count += (batch[0] if isinstance(batch, (list, tuple)) else batch).shape[0]
    seconds = time.perf_counter() - start
    assert count == items, (count, items)
    return count * TOKENS / seconds


def throughput(paths, items, repeats):
    total = len(paths) * items
    tokens = torch.cat([torch.load(p, weights_only=True) for p in paths])
    results = {}
    for name in ("map-style, in memory, 0 workers", "stream, files, 0 workers", "map-style, in memory, 2 workers",
                 "stream, files, 2 workers"):
        runs = []
        workers = int(name.split(", ")[2][0])
        for _ in range(repeats):
            if name.startswith("map"):
                loader = DataLoader(TensorDataset(tokens), batch_size=BATCH, shuffle=True, num_workers=workers)
            else:
                loader = DataLoader(ShardedStream(ShardFiles(paths, sizes=[items] * len(paths))), batch_size=BATCH,
                                    num_workers=workers)
            runs.append(tokens_per_second(prepare_train_data(loader, 1, 0, seed=0), total))
        results[name] = statistics.median(runs)
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args()
    files, items = (20, 512) if args.quick else (100, 4096)
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        paths = write_shards(folder, files, items)
        consumed, total, ours, reading = resume_latency(paths, items, repeats)
        print(f"stream: {files} files x {items} items x {TOKENS} tokens ({total * TOKENS / 1e6:.1f}M tokens)")
        print(f"resume latency, {consumed} of {total} items consumed (90%): ShardedStream {ours * 1e3:.1f} ms, "
              f"skipping by reading {reading * 1e3:.1f} ms ({reading / ours:.0f}x)")
        for name, rate in throughput(paths, items, repeats).items():
            print(f"tokens/s, {name}: {rate / 1e6:.2f}M")


if __name__ == "__main__":
    main()
