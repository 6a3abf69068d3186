"""Loaders that one process reads for all (dispatched) and iterable data sets cut by global batch
(IterableDatasetShard): Accelerate 1.15's DataLoaderConfiguration(dispatch_batches=...), and the Trainer's way to read
an IterableDataset of the user's on several processes.

Where nothing gives each process its own samples (an IterableDataset has no sampler), or where the user asks that
only one process reads (dispatch_batches=True: a data set on one machine's disk, a tokenizer that should run once),
the training data is one of the two TrainData kinds here, under the one PreparedDataLoader (prepared.py) and the
one EpochIterator (epoch.py) that every kind shares:

- dispatched (DispatchData): rank 0 alone iterates the loader. Each step it takes W of its batches (one with
  split_batches=True), joins them into the step's global batch, sends it to every process (strategy.broadcast),
  and each process keeps its run of consecutive samples: rank r the r-th of W equal slices. The other processes
  never touch the data set (not even its len(): rank 0 tells the length when the loader is prepared). The
  Accelerator's default for an IterableDataset, and the Trainer's for an IterableDataset with a batch size
  (data.prepare_train_data): each item is trained once per epoch, whatever the number of processes.
- sharded by global batch (IterableShardData, through IterableDatasetShard): every process reads the whole stream,
  groups it into global batches of B x W items (B with split_batches=True), and keeps its slice of each.

The last global batch, when it does not fill W equal slices, is completed with the first samples of the pass (as
Accelerate does; drop_last=True drops an incomplete step instead), and gather_for_metrics drops those repeats.
`end_of_dataloader` is True while the last batch is used (read one ahead), `remainder` is the real samples of the
last global batch once there (-1 before).

Which kind the Accelerator prepares (`prepare_for_accelerator`), by Accelerate's rules: dispatch_batches=True
dispatches every DataLoader (DataLoaderDispatcher); None (the default) dispatches a DataLoader over an
IterableDataset; False shards an IterableDataset with IterableDatasetShard (IterableShardLoader). A
tasktrain.data.ShardedStream (it shards itself) and a StatefulDataLoader (its own state resumes it) keep their own
kinds (data.py) unless dispatch_batches=True. Map-style data with dispatch_batches None/False is Accelerate's batch
order (shard.py).

Resume: the position is the one every kind saves (prepared.py): the samples of the order consumed. A dispatched
loader resumes exactly on any number of processes: rank 0 skips that many samples of its loader (map-style data
without loading them: rank 0 reads through the Trainer's order of (seed, epoch), data.py; an IterableDataset by
reading and dropping them). With DataLoader workers each worker batches its own items, so the loader's order
depends on its batch size: resume with the same batch size. A stream sharded by global batch resumes on the same
number of processes; on another number the slices of the global batches differ, so that is refused with what to do
(epoch.check_resume).
"""
import collections
import itertools
import math

import torch
from torch.utils.data import DataLoader, IterableDataset

from tasktrain.data import ShardedStream
from tasktrain.strategies.base import move_to_device
from tasktrain.trainer.data import (TrainData, is_stateful_loader, loader_options, prepare_train_data, read_ahead,
                                    samples_per_step)
from tasktrain.trainer.prepared import PreparedDataLoader

__all__ = ["DataLoaderDispatcher", "IterableDatasetShard", "prepare_for_accelerator", "is_prepared_here"]


# -- the pure shard -----------------------------------------------------------------------------------------------------
class IterableDatasetShard(IterableDataset):
    """Process `process_index`'s part of an IterableDataset, as Accelerate's class of the same name: the stream is
    grouped into global batches of `batch_size x num_processes` items (`batch_size` with split_batches=True), and
    this process yields its run of consecutive items of each: items [i*b, (i+1)*b) of every global batch, b being
    `batch_size` (`batch_size // num_processes` with split_batches). So on 2 processes a stream 0..7 with batch_size 4
    gives process 0 [0, 1, 2, 3] and process 1 [4, 5, 6, 7]; with split_batches=True, [0, 1, 4, 5] and [2, 3, 6, 7].

    An incomplete last global batch is dropped with drop_last=True, else completed with the first items of the pass
    (cycled), so every process yields the same number of items, a multiple of b. `padding` tells how many items the
    last pass added (in the process that iterated it: a DataLoader worker's copy keeps its own).

    set_epoch(epoch) passes the epoch on to the data set's set_epoch; a data set without one but with a
    torch.Generator `generator` attribute has it seeded with the epoch at each pass (Accelerate's rule).
    `skip_batches` (tasktrain's): the next pass starts that many global batches in, without yielding them."""

    def __init__(self, dataset, batch_size=1, drop_last=False, num_processes=1, process_index=0, split_batches=False):
        if batch_size is None or int(batch_size) < 1:
            raise ValueError(f"IterableDatasetShard(batch_size={batch_size!r}): a positive number of items per batch "
                             "is needed to cut the stream into global batches.")
        if int(num_processes) < 1 or not 0 <= int(process_index) < int(num_processes):
            raise ValueError(f"IterableDatasetShard(num_processes={num_processes!r}, process_index={process_index!r}):"
                             " process_index must be in 0 .. num_processes - 1.")
        if split_batches and batch_size % num_processes:
            # (Accelerate lets batch_size=1 through and then yields nothing: refused here)
            raise ValueError(f"IterableDatasetShard(split_batches=True): batch_size {batch_size} is cut into "
                             f"{num_processes} equal parts, so it must be a multiple of {num_processes}.")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.split_batches = bool(split_batches)
        self.epoch = 0
        self.skip_batches = 0
        self.padding = 0

    @property
    def global_batch_size(self):
        return samples_per_step(self.batch_size, self.num_processes, self.split_batches)

    @property
    def process_batch_size(self):
        """Items of each global batch this process keeps."""
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self):
        """Items this process yields in a pass (needs len() of the data set)."""
        batches = len(self.dataset) / self.global_batch_size
        return (math.floor(batches) if self.drop_last else math.ceil(batches)) * self.process_batch_size

    def __iter__(self):
        # Read now, not at the first item: a resume sets skip_batches just before the pass starts.
        skip, self.skip_batches = self.skip_batches, 0
        if not hasattr(self.dataset, "set_epoch") and isinstance(getattr(self.dataset, "generator", None),
                                                                 torch.Generator):
            self.dataset.generator.manual_seed(self.epoch)
        return self._items(skip)

    def _items(self, skip):
        size, mine = self.global_batch_size, self.process_batch_size
        start = self.process_index * mine
        self.padding = 0
        first, pending = None, []
        for item in self.dataset:
            pending.append(item)
            if len(pending) < size:
                continue
            if first is None:
                first = pending
            if skip:
                skip -= 1
            else:
                yield from pending[start:start + mine]
            pending = []
        if pending and not self.drop_last and not skip:
            source = first if first is not None else list(pending)
            self.padding = size - len(pending)
            pending += (source * math.ceil(self.padding / len(source)))[:self.padding]
            yield from pending[start:start + mine]


# -- batches: size, join, slice -----------------------------------------------------------------------------------------
def _is_samples(data):
    """A list or tuple of plain items (strings, numbers: what default_collate leaves as a list) is samples; one of
    tensors or containers is a structure whose leaves each hold the batch."""
    return isinstance(data, (list, tuple)) and not hasattr(data, "_fields") and \
        not any(isinstance(item, (torch.Tensor, list, tuple, dict)) for item in data)


def batch_size_of(batch):
    """Samples in a batch: the first dimension of its first tensor (or the length of a list of samples)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if _is_samples(batch):
        return len(batch)
    if isinstance(batch, dict):
        for value in batch.values():
            return batch_size_of(value)
    if isinstance(batch, (list, tuple)):
        for value in batch:
            return batch_size_of(value)
    raise TypeError(f"A dispatched or sharded loader cuts batches into slices, and a {type(batch).__name__} has no "
                    "batch dimension: yield tensors, or lists, tuples and dicts of them.")


def _join(batches):
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches, dim=0)
    if _is_samples(first):
        return type(first)(itertools.chain.from_iterable(batches))
    if isinstance(first, dict):
        return type(first)((key, _join([b[key] for b in batches])) for key in first)
    if isinstance(first, (list, tuple)):
        items = [_join(list(parts)) for parts in zip(*batches)]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    raise TypeError(f"Cannot join batches of {type(first).__name__} into one global batch.")


def join_batches(batches):
    """The loader's batches of one step, joined along the batch dimension (the step's global batch)."""
    if len(batches) == 1:
        return batches[0]
    try:
        return _join(batches)
    except RuntimeError as error:
        raise RuntimeError("dispatch_batches=True (or an IterableDataset) joins W batches of the loader into one "
                           "global batch, and these have other shapes beyond the batch dimension. Pad them to one "
                           "shape in collate_fn, or pass split_batches=True (rank 0 reads one batch and cuts it), or "
                           "dispatch_batches=False (each process reads its own part).") from error


def slice_batch(batch, part, process_index=None, num_processes=None):
    """`batch[part]` along the batch dimension, in every tensor (and list of samples) of the structure. Takes the
    arguments of Accelerate's slice_fn_for_dispatch."""
    if isinstance(batch, torch.Tensor):
        return batch[part]
    if _is_samples(batch):
        return type(batch)(batch[part])
    if isinstance(batch, dict):
        return type(batch)((key, slice_batch(value, part)) for key, value in batch.items())
    if isinstance(batch, (list, tuple)):
        items = [slice_batch(item, part) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


# -- the world a loader outside an Accelerator uses --------------------------------------------------------------------
class _ProcessGroupWorld:
    """What a DataLoaderDispatcher built by hand needs of the processes: torch.distributed's default group when it is
    initialised, else a world of one. (Prepared by an Accelerator, it uses the Accelerator's strategy.)"""

    watchdog = None

    def __init__(self):
        import torch.distributed as dist

        self._dist = dist if dist.is_available() and dist.is_initialized() else None
        self.global_rank = self._dist.get_rank() if self._dist else 0
        self.world_size = self._dist.get_world_size() if self._dist else 1
        if self._dist is not None and self._dist.get_backend() == "nccl":
            self.root_device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.root_device = torch.device("cpu")

    def broadcast(self, obj, src=0):
        if self._dist is None:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=src)
        return box[0]

    def move_batch(self, batch):
        return move_to_device(batch, self.root_device)


# -- the two kinds of TrainData -------------------------------------------------------------------------------------
class SlicedData(TrainData):
    """What the two kinds here share: every process's batch is its run of consecutive samples of a global batch (rank
    r the r-th of W equal slices), and every process knows the sizes of each step, so gather_for_metrics drops
    exactly the samples repeated to fill the last one (`step_layout`). `remainder` is Accelerate's: the real samples
    of the last global batch once the pass is there (-1 while not known)."""

    interleaved = False
    sliced = True

    def _start_pass(self):
        self._recent = collections.deque(maxlen=4)  # (index in the pass, samples per process, repeats) of steps
        self._last_index = None  # the pass's last step, once read
        self.remainder = self._first_remainder()

    def is_last(self, index):
        """Whether step `index` of the pass in flight is its last (known once it is read)."""
        return index == self._last_index

    def _first_remainder(self):
        return -1

    def step_layout(self, index):
        for at, size, repeated in self._recent:
            if at == index:
                return None if size is None else ([size] * self.num_processes, size * self.num_processes - repeated)
        return None

    def __len__(self):
        steps = self._left(0)
        if steps is None:
            raise TypeError("this prepared loader has no length (its data set has no len())")
        return steps

    def has_len(self):
        return self._left(0) is not None

    def set_epoch(self, epoch):
        self.epoch = int(epoch)


class DispatchData(SlicedData):
    """One process reads, every process gets its slice (see the module's docstring): `reader` (a TrainData of the
    loader on one process, or None on the processes that receive) yields the loader's batches; each step joins
    `num_processes` of them (one with split_batches), `broadcast` sends the step to every process, and process
    `process_index` keeps its slice. `length` and `dataset_length` are the reader's batches and samples per epoch,
    told by the reader (None: not known). The position is the samples of the reader's order consumed: that order
    does not depend on the number of processes, so a resume on any number continues it exactly."""

    kind = "dispatched"
    # The reader reads one step ahead, so that the pass's last step is known as it is yielded (Accelerate's
    # end_of_dataloader and remainder). The Trainer on one process turns it off: its loop reads a loader without a
    # length one batch ahead itself, as Lightning's fetcher, and a second read-ahead would read (and stop the workers
    # of) one batch more than Lightning's does.
    reads_ahead = True

    def __init__(self, loader, reader, num_processes, process_index, broadcast, *, split_batches=False,
                 drop_last=False, slice_fn=None, skip_batches=0, length=None, dataset_length=None, seed=0):
        self.reader = reader  # (before TrainData's init: its seed goes to the reader)
        self.batch_size = check_dispatch(loader, num_processes, split_batches)
        super().__init__(loader, None, None, seed)
        self.num_processes, self.process_index = int(num_processes), int(process_index)
        self.broadcast = broadcast
        self.split_batches, self.drop_last = bool(split_batches), bool(drop_last)
        self.slice_fn = slice_fn or slice_batch
        self.skip_batches = int(skip_batches)  # the first steps of every pass are read but not yielded (by hand)
        self.length, self.dataset_length = length, dataset_length
        self.epoch = 0
        self._skip_reader = 0  # the reader's batches to skip at the next pass
        self._start_pass()

    @property
    def seed(self):
        return self._seed

    @seed.setter
    def seed(self, value):
        """The order's seed (a resume sets the saved run's): the reader's order of (seed, epoch) follows it."""
        self._seed = value
        reader = self.reader
        if reader is not None and value is not None:
            reader.seed = value
            if reader.sampler is not None and hasattr(reader.sampler, "seed"):
                reader.sampler.seed = value

    @property
    def resumes_on_any_world_size(self) -> bool:
        return self.batch_size is not None

    @property
    def batched_order(self):
        """DataLoader workers each make whole batches of their own items of an IterableDataset: the reader's order
        then depends on the batch size."""
        loader = self.loader
        return isinstance(loader.dataset, IterableDataset) and not isinstance(loader.dataset, ShardedStream) and \
            loader.num_workers > 0

    @property
    def num_samples(self):
        return self.dataset_length if self.resumes_on_any_world_size else None

    @property
    def total_batch_size(self):
        return samples_per_step(self.batch_size, self.num_processes, self.split_batches)

    def samples_per_batch(self, world_size):
        return samples_per_step(self.batch_size, world_size, self.split_batches)

    def _per_step(self):
        """The reader's batches in one step."""
        return 1 if self.split_batches else self.num_processes

    def _left(self, consumed):
        """Steps left in a pass once `consumed` batches of the reader are done (None: not known)."""
        if self.length is None:
            return None
        rest, per_step = max(0, self.length - consumed), self._per_step()
        steps = rest // per_step if self.drop_last else math.ceil(rest / per_step)
        return max(0, steps - (self.skip_batches if consumed == 0 else 0))

    def _reader_batches(self, num_samples):
        return math.ceil(max(0, int(num_samples)) / self.batch_size)

    def batches_from(self, num_samples: int):
        return self._left(self._reader_batches(num_samples)) if self.resumes_on_any_world_size else None

    def skip(self, num_batches: int):
        """Start the next pass `num_batches` steps in."""
        steps = max(0, int(num_batches))
        self._skip_reader = (steps + (self.skip_batches if steps else 0)) * self._per_step()

    def skip_samples(self, num_samples: int):
        self._skip_reader = self._reader_batches(num_samples)

    def __iter__(self):
        skip, self._skip_reader = self._skip_reader, 0
        self._start_pass()
        return self._steps(skip)

    def _global_batches(self, skip):
        """The reader: (global batch, its batches of the loader, whether it is the pass's last) of each step."""
        reader = self.reader
        reader.set_epoch(self.epoch)
        dataset = reader.loader.dataset
        if isinstance(dataset, IterableDataset) and not isinstance(dataset, ShardedStream) and \
                hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.epoch)  # a stream of the user's that reshuffles by epoch (Accelerate's call)
        if skip:
            reader.skip(skip)
        iterator, per_step = iter(reader), self._per_step()

        def steps():
            while True:
                group = list(itertools.islice(iterator, per_step))
                if not group or (len(group) < per_step and self.drop_last):
                    return
                yield join_batches(group), len(group)
                if len(group) < per_step:
                    return

        if not self.reads_ahead:
            for batch, count in steps():
                yield batch, count, False
            return
        for (batch, count), last in read_ahead(steps()):
            yield batch, count, last

    def _steps(self, skip):
        rank, size, slice_fn = self.process_index, self.num_processes, self.slice_fn
        source = self._global_batches(skip) if self.reader is not None else None
        dropped = self.skip_batches if skip == 0 else 0
        first = None  # the pass's first samples: what completes an uneven last step
        index = 0
        while True:
            payload = next(source, None) if source is not None else None
            if size > 1:
                payload = self.broadcast(payload)  # every process calls it as often: the reader says when it ends
            if payload is None:
                return
            batch, count, last = payload
            if size == 1:  # nothing to cut
                real = batch_size_of(batch) if self.batch_size else None  # (batch_size=None: items, not batches)
                mine, per_process, repeated = batch, real, 0
            else:
                real = batch_size_of(batch)
                if first is None and not self.drop_last:
                    first = slice_fn(batch, slice(0, size), process_index=rank, num_processes=size)
                per_process, repeated = real // size, 0
                if real % size and not self.drop_last:
                    per_process += 1
                    repeated = per_process * size - real
                    batch = join_batches([batch] + _cycled(first, repeated))
                mine = slice_fn(batch, slice(rank * per_process, (rank + 1) * per_process), process_index=rank,
                                num_processes=size)
            if dropped:
                dropped -= 1
            else:
                self._recent.append((index, per_process, repeated))
                if last:
                    self._last_index = index
                    if real is not None:
                        self.remainder = real
                index += 1
                yield mine
            if last:
                return


def check_dispatch(loader, num_processes, split_batches):
    """The batch size a dispatched loader cuts by, checked (on every process alike, before anything is read)."""
    batch_size = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size",
                                                                                  None)
    if num_processes > 1 and batch_size is None:
        raise ValueError("A dispatched loader cuts each batch into one part per process, and this DataLoader has "
                         "no batch_size (batch_size=None, or a batch sampler without one): give it batch_size.")
    if split_batches and batch_size is not None and batch_size > 1 and batch_size % num_processes:
        raise ValueError(f"split_batches=True cuts each batch of {batch_size} samples into {num_processes} "
                         f"equal parts: use a batch_size that is a multiple of {num_processes}.")
    return batch_size


def dispatch_data(loader, num_processes, process_index, seed, broadcast, reads, split_batches=False, shuffle=None):
    """The DispatchData of `loader` for this process: the process that `reads` (global rank 0; every process when
    there is one shard) reads it through the order of (seed, epoch) where the loader allows it (a plain DataLoader
    over map-style data: a resume skips without loading) and tells the others its length. Every process calls it."""
    check_dispatch(loader, num_processes, split_batches)
    reader, length, dataset_length = None, None, None
    if reads or num_processes == 1:
        reader = prepare_train_data(loader, 1, 0, seed, shuffle)
        length = len(reader) if reader.has_len() else None
        dataset_length = _length(loader.dataset)
    if num_processes > 1:
        length, dataset_length = broadcast((length, dataset_length))
    return DispatchData(loader, reader, num_processes, process_index, broadcast, split_batches=split_batches,
                        drop_last=loader.drop_last, length=length, dataset_length=dataset_length, seed=seed)


def _cycled(first, count):
    """`count` samples taken from `first` (a batch), cycled, as a list of batches to join."""
    size = batch_size_of(first)
    parts, left = [], count
    while left > 0:
        take = min(left, size)
        parts.append(slice_batch(first, slice(0, take)))
        left -= take
    return parts


def _length(obj):
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None


class IterableShardData(SlicedData):
    """Every process reads the stream through IterableDatasetShard and keeps its slice of each global batch, as
    Accelerate's DataLoaderShard over IterableDatasetShard (on one process the loader as it is, as Accelerate leaves
    it). The position is the global batches done: it continues on the same number of processes and batches only
    (each process skips them); on another one the slices differ, and the epoch iterator refuses it."""

    kind = "iterable shard"

    def __init__(self, loader, num_processes, process_index, split_batches, seed=0):
        self.batch_size, self.drop_last = loader.batch_size, bool(loader.drop_last)
        self.num_processes, self.process_index = int(num_processes), int(process_index)
        self.split_batches = bool(split_batches)
        self.dataset_length = _length(loader.dataset)
        self.shard = None
        base = loader
        if self.num_processes > 1:
            if loader.batch_size is None:
                raise ValueError("An IterableDataset prepared with dispatch_batches=False is cut into global batches "
                                 "of batch_size x processes items, and this DataLoader has batch_size=None: give it "
                                 "batch_size, or leave dispatch_batches None (rank 0 reads, the others receive).")
            self.shard = IterableDatasetShard(loader.dataset, batch_size=loader.batch_size,
                                              drop_last=loader.drop_last, num_processes=self.num_processes,
                                              process_index=self.process_index, split_batches=split_batches)
            base = DataLoader(self.shard, **loader_options(loader), batch_size=self.shard.process_batch_size,
                              drop_last=loader.drop_last)
        super().__init__(base, None, None, seed)
        self.epoch = 0
        self._skip = 0  # global batches to skip at the next pass
        self._start_pass()

    @property
    def resumes_on_any_world_size(self) -> bool:
        return False

    @property
    def total_batch_size(self):
        return self.batch_size if self.shard is None else self.shard.global_batch_size

    def samples_per_batch(self, world_size):
        return self.total_batch_size

    def _first_remainder(self):
        if self.dataset_length is None or self.drop_last or not self.total_batch_size:
            return -1
        return self.dataset_length % self.total_batch_size

    def _left(self, consumed):
        if self.shard is None:
            length = _length(self.loader)
            return None if length is None else max(0, length - consumed)
        if self.dataset_length is None:
            return None
        batches = self.dataset_length / self.shard.global_batch_size
        total = math.floor(batches) if self.drop_last else math.ceil(batches)
        return max(0, total - consumed)

    def skip(self, num_batches: int):
        self._skip = max(0, int(num_batches))

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self._start_pass()
        return self._steps(skip)

    def _steps(self, skip):
        shard, index = self.shard, 0
        if shard is None:  # one process: the loader as it is (its own set_epoch, if any, is the data set's)
            dataset = self.loader.dataset
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(self.epoch)
            for index, batch in enumerate(itertools.islice(iter(self.loader), skip, None)):
                self._recent.append((index, batch_size_of(batch) if self.batch_size else None, 0))
                yield batch
            return
        shard.set_epoch(self.epoch)
        shard.skip_batches = skip
        iterator = iter(self.loader)
        shard.skip_batches = 0  # (a worker took its copy already; one pass only)
        in_process, size = self.loader.num_workers == 0, shard.global_batch_size
        for index, (batch, last) in enumerate(read_ahead(iterator)):
            repeated = 0
            if last and not self.drop_last:
                # the pass's end is read already: the shard knows its padding (a worker's copy: from the length)
                repeated = shard.padding if in_process else (
                    -self.dataset_length % size if self.dataset_length is not None else 0)
            self._recent.append((index, shard.process_batch_size, repeated))
            if last:
                self._last_index = index
            yield batch


# -- the Accelerator's prepared loaders of these kinds (the one PreparedDataLoader, Accelerate's names) ------------
class _SlicedLoader(PreparedDataLoader):
    """Accelerate's names of a dispatched or sharded-by-global-batch loader, over the PreparedDataLoader."""

    @property
    def batch_size(self):
        return self._data.batch_size

    @property
    def split_batches(self):
        return self._data.split_batches

    @property
    def total_dataset_length(self):
        return self._data.dataset_length


class DataLoaderDispatcher(_SlicedLoader):
    """A loader that only rank 0 iterates; every process gets its slice of each step's batch by broadcast
    (Accelerate's DataLoaderDispatcher; see the module's docstring).

    Built by hand with Accelerate's arguments: `dataset` and the DataLoader's keyword arguments (`**kwargs`: batch_size,
    shuffle, sampler, collate_fn, num_workers, ...) make the loader rank 0 reads; `split_batches` (False: each step
    joins W of its batches and each process gets batch_size samples; True: each step cuts one batch into W parts);
    `skip_batches` (the first steps of every pass are read but not yielded); `use_stateful_dataloader` (rank 0 reads
    a torchdata StatefulDataLoader); `_drop_last` (an incomplete last step is dropped rather than completed with the
    pass's first samples); `_non_blocking` (host-to-device copies are non-blocking here already, pinned memory or
    not: both values are accepted); `slice_fn` (cuts a process's part: `slice_fn(batch, slice, process_index=,
    num_processes=)`); `torch_device_mesh` (refused: tensor-parallel meshes are not supported); `iteration` (the
    epoch of the first pass). `strategy` (ours): the tasktrain strategy whose broadcast to use; default
    torch.distributed's default group if initialised, else one process. Prepared by an Accelerator, it is built for
    you (Accelerator.prepare with DataLoaderConfiguration(dispatch_batches=True), or an IterableDataset)."""

    def __init__(self, dataset, split_batches=False, skip_batches=0, use_stateful_dataloader=False, _drop_last=False,
                 _non_blocking=False, slice_fn=None, torch_device_mesh=None, iteration=0, strategy=None, **kwargs):
        if torch_device_mesh is not None:
            raise ValueError("DataLoaderDispatcher(torch_device_mesh=...): tensor-parallel device meshes are not "
                             "supported; every process of the data-parallel world gets its own slice.")
        if use_stateful_dataloader:
            from torchdata.stateful_dataloader import StatefulDataLoader

            base = StatefulDataLoader(dataset, **kwargs)
        else:
            base = DataLoader(dataset, **kwargs)
        world = strategy if strategy is not None else _ProcessGroupWorld()
        # built by hand: every process asks the lengths, as Accelerate's
        data = DispatchData(base, TrainData(base) if world.global_rank == 0 else None, world.world_size,
                            world.global_rank, world.broadcast, split_batches=split_batches, drop_last=_drop_last,
                            slice_fn=slice_fn, skip_batches=skip_batches, length=_length(base),
                            dataset_length=_length(dataset))
        super().__init__(data, None, world=world)
        self.position.epoch = int(iteration)

    @classmethod
    def _prepared(cls, loader, accelerator, split_batches):
        """The Accelerator's: rank 0 reads through tasktrain's order of (seed, epoch) where the loader allows it (a
        plain DataLoader over map-style data: resumes skip without loading), and tells the others the length."""
        strategy = accelerator.strategy
        data = dispatch_data(loader, strategy.world_size, strategy.global_rank, accelerator._data_seed,
                             strategy.broadcast, strategy.global_rank == 0, split_batches=split_batches)
        return cls._over(data, accelerator, loader)

    @classmethod
    def _over(cls, data, accelerator, source):
        self = cls.__new__(cls)
        PreparedDataLoader.__init__(self, data, accelerator, source=source)
        return self

    @property
    def _reader(self):
        return self._data.reader

    @property
    def skip_batches(self):
        return self._data.skip_batches

    def __reduce__(self):
        raise TypeError("A DataLoaderDispatcher holds its process's place in the world and cannot be pickled: build "
                        "it (or prepare the DataLoader) in each process.")


class IterableShardLoader(_SlicedLoader):
    """An Accelerator's prepared loader over an IterableDataset with dispatch_batches=False (IterableShardData)."""

    def __init__(self, loader, accelerator, split_batches):
        strategy = accelerator.strategy
        data = IterableShardData(loader, strategy.world_size, strategy.global_rank, split_batches,
                                 accelerator._data_seed)
        super().__init__(data, accelerator, source=loader)
        self.shard = data.shard


# -- the Accelerator's hook ------------------------------------------------------------------------------------------------
def is_prepared_here(obj) -> bool:
    """Whether `obj` is a loader this module prepared (Accelerator.prepare passes it through)."""
    return isinstance(obj, _SlicedLoader)


def prepare_for_accelerator(loader, accelerator):
    """The prepared loader for `loader` when it is dispatched or sharded by global batch (see the module's
    docstring), else None (the Accelerator's PreparedDataLoader over another kind takes it). Every process calls it
    (rank 0 tells the others the length)."""
    dispatch = accelerator.dispatch_batches
    if not isinstance(loader, DataLoader):
        if dispatch:
            raise TypeError(f"DataLoaderConfiguration(dispatch_batches=True) dispatches torch DataLoaders, and this "
                            f"is a {type(loader).__name__}: prepare a torch.utils.data.DataLoader.")
        return None
    iterable = isinstance(loader.dataset, IterableDataset)
    own_path = isinstance(loader.dataset, ShardedStream) or is_stateful_loader(loader)
    split = accelerator.split_batches
    if dispatch or (dispatch is None and iterable and not own_path):
        return DataLoaderDispatcher._prepared(loader, accelerator, split)
    if iterable and not own_path:
        return IterableShardLoader(loader, accelerator, split)
    if own_path and iterable and split:
        raise ValueError("split_batches=True with a ShardedStream or a StatefulDataLoader over an IterableDataset: "
                         "these shard themselves by whole batches. Divide the batch size by the number of processes "
                         "instead, or pass dispatch_batches=True.")
    return None
