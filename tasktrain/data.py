"""Streaming data: a data set made of shards, read by every rank and DataLoader worker in disjoint parts, and resumed
mid-epoch on any number of processes and workers without reading what was trained on (docs/data.md).

The contract (`ShardedSource`) is two methods: `shard_sizes()`, the items of each shard, and `read(shard, indices)`,
those items of one shard, in the order asked. `ShardedStream(source)` is the IterableDataset a DataLoader reads; the
Trainer and `Accelerator.prepare` set it up for the run (tasktrain/trainer/data.py: rank, world size, batch size,
the data seed, the epoch, where the epoch resumes).

The order of an epoch, one sequence of N items for all ranks together (the *global order*), is a function of
(seed, epoch) only: the shards in an order drawn from (seed, epoch), each shard's items in an order drawn from
(seed, epoch, shard) (or both as stored, shuffle=False). With B items per batch on each of W ranks, the loop's k-th
batch of an iteration that starts at position s covers positions s + k*B*W .. s + (k+1)*B*W - 1 over all ranks, and
rank r takes the r-th B of them, a contiguous run (a global batch is one window of the order, whatever W is). On a
rank, DataLoader worker w of n produces the rank's batches k = w, w + n, w + 2n, ...: the DataLoader takes its
workers' batches in turn (in_order), so the rank sees its batches in order. A reader reads only its own items, and
never a shard that holds none of them.

So after k loop batches the first s + k*B*W positions of the order are consumed, on any W: that count is the saved
position (the Trainer's `samples_in_epoch`). A resume recomputes the order from (seed, epoch), starts at the count,
and splits the rest over the processes and workers it has now; the shards before it are never opened. With the
same global batch, every optimizer step trains the items of the uninterrupted run.

The end of an epoch: when the rest is not a multiple of B*W, its last global batch has fewer items. drop_last=True
(the DataLoader's) drops them. Otherwise it is padded to a multiple of W with the first items of the epoch's order
(as torch's DistributedSampler and the Trainer's map-style order pad) and split evenly: every rank takes the same
number of batches, its last one of ceil(rest / W) items, so no rank waits on a collective the others never reach.
"""
import bisect
import itertools
import math
from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch
from torch.utils.data import IterableDataset, get_worker_info


@runtime_checkable
class ShardedSource(Protocol):
    """What a streaming data set provides: its shards' sizes, and the items of a shard at given indices."""

    def shard_sizes(self) -> Sequence[int]:
        """The number of items of each shard (the same on every rank and in every epoch)."""

    def read(self, shard: int, indices: Sequence[int]) -> Iterable:
        """The items `indices` of shard `shard`, in that order (a reader asks only for its own)."""


class ShardedStream(IterableDataset):
    """An IterableDataset over a `ShardedSource`: each rank and DataLoader worker reads its own items of the epoch's
    global order (see the module's docstring); the Trainer and `Accelerator.prepare` configure it for the run.

    `shuffle`: draw the order of the shards and of each shard's items from (seed, epoch); False reads them as
    stored. Outside the Trainer and the Accelerator, `configure(...)` sets what they set."""

    def __init__(self, source: ShardedSource, shuffle: bool = True):
        if not isinstance(source, ShardedSource):
            raise TypeError(f"ShardedStream needs a ShardedSource (shard_sizes() and read(shard, indices)), got "
                            f"{type(source).__name__}: wrap files with ShardFiles, or define those two methods.")
        self.source, self.shuffle = source, bool(shuffle)
        self.sizes = [int(n) for n in source.shard_sizes()]
        self.num_items = sum(self.sizes)
        # set for the run (configure): who reads, how much a batch is, which epoch, where it starts
        self.rank, self.world_size, self.batch_size, self.drop_last = 0, 1, None, False
        self.seed, self.epoch, self.start = 0, 0, 0

    def configure(self, *, rank=0, world_size=1, batch_size=None, drop_last=False, seed=None):
        """This rank's part: rank of world_size, batch_size items per batch (needed with several ranks or workers),
        the DataLoader's drop_last, and the order's seed."""
        if world_size > 1 and not batch_size:
            raise ValueError("A ShardedStream read by several processes needs the DataLoader's batch_size: each "
                             "process takes its run of each global batch.")
        self.rank, self.world_size, self.batch_size, self.drop_last = int(rank), int(world_size), batch_size, drop_last
        if seed is not None:
            self.seed = int(seed)
        return self

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    # -- the epoch's order ------------------------------------------------------------------------------------------
    def shard_order(self, epoch):
        """The shards in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return list(range(len(self.sizes)))
        return torch.randperm(len(self.sizes), generator=_generator(self.seed, epoch)).tolist()

    def item_order(self, epoch, shard):
        """The indices of shard `shard`'s items in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return range(self.sizes[shard])
        return torch.randperm(self.sizes[shard], generator=_generator(self.seed, epoch, shard + 1)).tolist()

    def global_order(self, epoch):
        """[(shard, index)] of the whole epoch (for tests and tools: a reader computes only its own part)."""
        return [(shard, i) for shard in self.shard_order(epoch) for i in self.item_order(epoch, shard)]

    # -- this rank's part -------------------------------------------------------------------------------------------
    def _layout(self, start):
        """(items per batch, items per global batch, full global batches, items of each rank's last short batch)
        of an iteration starting at `start`."""
        batch = self.batch_size or max(1, self.num_items)
        step = batch * self.world_size
        rest = max(0, self.num_items - start)
        full, left = divmod(rest, step)
        short = math.ceil(left / self.world_size) if left and not self.drop_last else 0  # padded to a multiple of W
        return batch, step, full, short

    def rank_batches(self, start=0):
        """(first, stop) of each of this rank's batches in an iteration starting at `start`, lazily: the global
        positions (past the end they wrap to the epoch's first items: the padding of the last batch)."""
        batch, step, full, short = self._layout(start)
        for k in range(full):
            yield start + k * step + self.rank * batch, start + k * step + (self.rank + 1) * batch
        if short:
            base = start + full * step
            yield base + self.rank * short, base + (self.rank + 1) * short

    def rank_counts(self, start=0):
        """(batches, items) of this rank in an iteration starting at `start`: the same on every rank."""
        batch, _, full, short = self._layout(start)
        return full + bool(short), full * batch + short

    def padding(self, start=0):
        """Items repeated at the end of an iteration starting at `start` (over all ranks) to even out the ranks."""
        _, step, full, short = self._layout(start)
        return short * self.world_size - (max(0, self.num_items - start) - full * step) if short else 0

    def __len__(self):
        """This rank's items in a whole epoch (the DataLoader's length is this over the batch size)."""
        return self.rank_counts(0)[1]

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if workers > 1 and not self.batch_size:
            raise ValueError("A ShardedStream read by several DataLoader workers needs the DataLoader's batch_size "
                             "(each worker produces whole batches): prepare the loader with the Trainer or the "
                             "Accelerator, or call stream.configure(batch_size=...).")
        return self._read(self.epoch, itertools.islice(self.rank_batches(self.start), worker, None, workers))

    def _read(self, epoch, ranges):
        """The items at the positions [first, stop) of the epoch's order, for each range, a shard's part of it at a
        time: only the shards that hold them are read (a position past the end is the epoch's first items)."""
        order, n = self.shard_order(epoch), self.num_items
        ends = list(_cumulative(self.sizes[s] for s in order))  # position just past each shard of the order
        held, items = None, None  # one shard's item order held at a time
        for first, stop in ranges:
            at = first
            while at < stop:
                position = at % n
                slot = bisect.bisect_right(ends, position)
                shard = order[slot]
                offset = position - (ends[slot] - self.sizes[shard])
                count = min(stop - at, ends[slot] - position)  # the range's part in this shard
                if shard != held:
                    held, items = shard, self.item_order(epoch, shard)
                yield from self.source.read(shard, items[offset:offset + count])
                at += count


class ShardFiles:
    """A ShardedSource over files, one shard each: `load(path)` returns the items of a file as a sequence (default:
    torch.load(path, weights_only=True, mmap=True): a list of items, or a tensor whose rows are the items; mapped,
    so that only what is read is loaded from the disk). `sizes` (items per file) avoids opening every file to
    count them; a reader holds the last file it loaded, so a run of items in one file loads it once."""

    def __init__(self, paths, load=None, sizes=None):
        self.paths = [str(p) for p in paths]
        self.load = load if load is not None else _torch_load
        if sizes is not None and len(sizes) != len(self.paths):
            raise ValueError(f"ShardFiles: {len(sizes)} sizes for {len(self.paths)} files; give one per file.")
        self._sizes = None if sizes is None else [int(n) for n in sizes]
        self._held = (None, None)

    def shard_sizes(self):
        if self._sizes is None:
            self._sizes = [len(self.load(path)) for path in self.paths]
        return self._sizes

    def read(self, shard, indices):
        path, items = self._held
        if path != self.paths[shard]:
            items = self.load(self.paths[shard])
            self._held = (self.paths[shard], items)
        return [items[i] for i in indices]

    def __getstate__(self):  # a worker starts with no file held
        return {**self.__dict__, "_held": (None, None)}


class HuggingFaceShards:
    """A ShardedSource over a Hugging Face `datasets.IterableDataset` (an optional dependency: `pip install
    'tasktrain[datasets]'`; nothing here imports it): the data set's own shards (`n_shards`, each read with
    `shard(num_shards=n_shards, index=i, contiguous=True)`) are ours, so ShardedStream's global order and position
    apply. `sizes`: the examples of each of its shards (a stream does not know them: give them, e.g. from the
    files' metadata; None counts them by reading every shard through once).

    A reader streams through a shard up to the last example it needs, and goes on from there while the next
    examples it is asked for lie further on in the same shard; shuffle=False (examples as stored) keeps reading
    close to what is used. This is what `split_dataset_by_node` and the data set's `state_dict` do, made global:
    see docs/data.md."""

    def __init__(self, dataset, sizes=None, read_batch=64):
        self.dataset, self.read_batch = dataset, int(read_batch)
        shards = dataset.n_shards
        if sizes is None:
            sizes = [sum(1 for _ in self._examples(self._shard(i))) for i in range(shards)]
        if len(sizes) != shards:
            raise ValueError(f"HuggingFaceShards: {len(sizes)} sizes for a data set of {shards} shards; give one "
                             "per shard (dataset.n_shards), or sizes=None to count them.")
        self.sizes = [int(n) for n in sizes]
        self._open = None  # (shard, its examples from `at` on, at): where the last read stopped

    def shard_sizes(self):
        return self.sizes

    def _shard(self, index):
        return self.dataset.shard(num_shards=self.dataset.n_shards, index=index, contiguous=True)

    def _examples(self, part):
        # .iter() rather than iter(part): in a DataLoader worker iter() would split the one shard among the
        # workers again (datasets' own worker split); the worker split here is ShardedStream's
        for batch in part.iter(batch_size=self.read_batch):
            columns = list(batch)
            for i in range(len(batch[columns[0]]) if columns else 0):
                yield {name: batch[name][i] for name in columns}

    def read(self, shard, indices):
        if not indices:
            return []
        wanted = {}
        for at, index in enumerate(indices):
            wanted.setdefault(index, []).append(at)
        out, left = [None] * len(indices), len(wanted)
        held, examples, position = self._open or (None, None, 0)
        if held != shard or min(wanted) < position:  # (re)open the shard: it streams from its start
            examples, position = self._examples(self._shard(shard)), 0
        for example in examples:
            position += 1
            if position - 1 in wanted:
                for at in wanted[position - 1]:
                    out[at] = example
                left -= 1
            if not left:
                break
        self._open = (shard, examples, position)
        return out

    def __getstate__(self):  # a worker starts with no shard open
        return {**self.__dict__, "_open": None}


def _torch_load(path):
    return torch.load(path, weights_only=True, mmap=True)


def _generator(seed, epoch, salt=0):
    generator = torch.Generator()
    # (seed + epoch) for the shards, as the map-style order draws its permutation; a shard's items from a salted one
    generator.manual_seed(int(seed) + int(epoch) + 1_000_003 * int(salt))
    return generator


def _cumulative(values):
    total = 0
    for value in values:
        total += value
        yield total
