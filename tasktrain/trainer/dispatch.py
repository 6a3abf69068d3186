"""Loaders that one process reads for all (DataLoaderDispatcher) and iterable data sets cut by global batch
(IterableDatasetShard): Accelerate 1.15's DataLoaderConfiguration(dispatch_batches=...) for prepared loaders.

Where the Accelerator cannot give each process its own samples through a sampler (an IterableDataset has none), or
where the user asks that only one process reads (dispatch_batches=True: a data set on one machine's disk, a
tokenizer that should run once), a prepared loader is one of the two kinds here:

- dispatched (DataLoaderDispatcher): rank 0 alone iterates the loader. Each step it takes W of its batches (one
  with split_batches=True), joins them into the step's global batch, sends it to every process (strategy.broadcast),
  and each process keeps its run of consecutive samples: rank r the r-th of W equal slices. The other processes
  never touch the data set (not even its len(): rank 0 tells the length when the loader is prepared).
- sharded by global batch (IterableDatasetShard): every process reads the whole stream, groups it into global
  batches of B x W items (B with split_batches=True), and keeps its slice of each.

The last global batch, when it does not fill W equal slices, is completed with the first samples of the pass (as
Accelerate does; drop_last=True drops an incomplete step instead), and gather_for_metrics drops those repeats.
`end_of_dataloader` is True while the last batch is used (read one ahead), `remainder` is the real samples of the
last global batch once there (-1 before).

Which kind applies (`prepare_for_accelerator`), by Accelerate's rules: dispatch_batches=True dispatches every
DataLoader; None (the default) dispatches a DataLoader over an IterableDataset; False shards an IterableDataset with
IterableDatasetShard. A tasktrain.data.ShardedStream (it shards itself) and a StatefulDataLoader (its own state
resumes it) keep their own path (tasktrain/trainer/data.py) unless dispatch_batches=True. Map-style data with
dispatch_batches None/False is the sampler-sharded PreparedDataLoader's (tasktrain/trainer/accelerator.py).

Resume: save_state records the batches of the reader consumed (rank 0's loader batches when dispatched, the global
batches of the stream when sharded). A dispatched loader resumes exactly on any number of processes: rank 0 skips
that many batches of its loader (map-style data without loading them: rank 0 reads through the Trainer's order of
(seed, epoch), tasktrain/trainer/data.py). A sharded stream resumes on the same number of processes; on another
number the slices of the global batches differ, so that is refused with what to do.
"""
import itertools
import math

import torch
from torch.utils.data import DataLoader, IterableDataset

from tasktrain.data import ShardedStream
from tasktrain.strategies.base import move_to_device
from tasktrain.strategies.watchdog import watched_batches
from tasktrain.trainer.data import TrainData, is_stateful_loader, loader_options, prepare_train_data
from tasktrain.trainer.epoch import warn_global_batch_change

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
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

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

    def batch_to_device(self, batch):
        return move_to_device(batch, self.root_device)


# -- what the two prepared kinds share ---------------------------------------------------------------------------------
class _CountedLoader:
    """The bookkeeping of a prepared loader here: the epoch, the steps yielded and the reader's batches consumed in it
    (what save_state records), the pass's length, and what gather_for_metrics and accumulate() ask of the loader.
    Subclasses give `_steps(skip)`, yielding (batch of this process, samples per process, repeats in the global
    batch, reader batches it consumed, real samples of the global batch, whether it is the last step)."""

    interleaved = False  # rank r holds the r-th run of consecutive samples of each global batch

    def _setup(self, accelerator, world, split_batches, drop_last, epoch=0):
        self._accelerator = accelerator  # None: built by hand
        self._world = world
        self.split_batches = bool(split_batches)
        self._drop_last = bool(drop_last)
        self._epoch = int(epoch)
        self._steps_done = 0  # batches yielded in the epoch (skipped ones included)
        self._consumed = 0  # the reader's batches consumed in the epoch
        self._pending = None  # (reader batches to skip, steps they make): where the next pass starts
        self._pass_length = None
        self._pass_ended = False
        self.at_last_batch = False
        self.remainder = -1
        self._size = None  # samples per process in the batch last yielded
        self._repeated = 0  # repeats in the global batch last yielded

    # Accelerate's names
    @property
    def end_of_dataloader(self):
        """True while the last batch of the pass is used (and after it, until the next pass)."""
        return self.at_last_batch

    @property
    def epoch(self):
        """The epoch the next full pass runs."""
        return self._epoch

    @property
    def iteration(self):
        return self._epoch

    @property
    def batches_seen(self):
        return self._steps_done

    @property
    def epoch_length(self):
        """Steps of the pass in flight (a resumed one: done + left); None without a length."""
        return self._pass_length if self._pass_length is not None else self._full_length()

    @property
    def num_processes(self):
        return self._world.world_size

    @property
    def process_index(self):
        return self._world.global_rank

    def set_epoch(self, epoch):
        self._epoch = int(epoch)

    def skip(self, num_batches):
        """The next pass starts `num_batches` batches (steps) in (skip_first_batches)."""
        steps = max(0, int(num_batches))
        self._pending = (steps * self._reader_batches_per_step(), steps)

    def __len__(self):
        length = self._full_length()
        if length is None:
            raise TypeError("this prepared loader has no length (its data set has no len())")
        return length

    def _left(self, consumed):
        """Steps left in a pass once `consumed` reader batches are done (None: not known)."""
        raise NotImplementedError

    def _full_length(self):
        return self._left(0)

    def _reader_batches_per_step(self):
        return 1

    def _first_remainder(self):
        """`remainder` while the pass runs, until its last batch may tell it (Accelerate's: -1 when not known)."""
        return -1

    # -- the pass ------------------------------------------------------------------------------------------------------
    def __iter__(self):
        accelerator, world = self._accelerator, self._world
        consumed, start = self._pending or (0, 0)
        self._pending = None
        left = self._left(consumed)
        self._pass_length = None if left is None else start + left
        self._steps_done, self._consumed = start, consumed
        self.at_last_batch, self.remainder, self._pass_ended = False, self._first_remainder(), False
        self._size, self._repeated = None, 0
        if accelerator is not None:
            if accelerator._rng_types and accelerator.use_distributed:
                accelerator._synchronize_rng_states()
            accelerator._active_loaders.append(self)
        watchdog = accelerator._watchdog if accelerator is not None else None
        if watchdog is not None:
            watchdog.arm(accelerator.stall_timeout)
        try:
            steps = ((index, *step) for index, step in enumerate(self._steps(consumed), start))
            for index, batch, size, repeated, used, real, last in watched_batches(
                    watchdog, steps, "the loop's body", _no_step, start):
                # counted before the body runs: a save_state inside it resumes after this batch
                self._steps_done, self._consumed = index + 1, self._consumed + used
                self._size, self._repeated = size, repeated
                self.at_last_batch = last
                if last:
                    self._pass_ended = True
                    if real is not None:
                        self.remainder = real
                yield world.batch_to_device(batch)
            self._epoch += 1
            self._steps_done = self._consumed = 0
            self._pass_length = None
        finally:
            if watchdog is not None:
                watchdog.disarm()
            if accelerator is not None and self in accelerator._active_loaders:
                accelerator._active_loaders.remove(self)

    # -- for gather_for_metrics ------------------------------------------------------------------------------------------
    @property
    def current_batch_size(self):
        """Samples per process in the batch last yielded (the same on every process)."""
        return self._size

    def repeated_in_batch(self):
        """Samples of the current global batch that repeat the pass's first ones only to fill the slices."""
        return self._repeated if self.at_last_batch else 0

    def shard_step(self):
        """(every rank's batch size, real samples) of the step of the batch last yielded: rank r held the r-th run
        of it, so the ranks' parts in rank order, cut to the real samples, are the step's data (None: no step)."""
        if self._size is None:
            return None
        return [self._size] * self.num_processes, self._size * self.num_processes - self.repeated_in_batch()

    # -- resume ---------------------------------------------------------------------------------------------------------
    def state_dict(self):
        epoch, steps, consumed = self._epoch, self._steps_done, self._consumed
        if self._pass_ended:  # saved after the last batch, before the loop ended
            epoch, steps, consumed = epoch + 1, 0, 0
        return {"kind": self._kind, "epoch": epoch, "batches_seen": steps, "reader_batches": consumed,
                "world_size": self.num_processes, "split_batches": self.split_batches,
                "batch_size": self._batch_size, "samples_seen": None,
                "accumulation": self._accelerator.gradient_accumulation_steps if self._accelerator else 1}

    def load_state_dict(self, state):
        self._epoch = int(state["epoch"])
        steps = int(state.get("batches_seen", 0))
        self._pending = None
        if not steps:
            return
        if state.get("kind") != self._kind:
            raise ValueError(f"This loader's state stopped in the middle of epoch {self._epoch} in a prepared loader "
                             f"of another kind ({state.get('kind') or 'sharded by sampler'}; this one is {self._kind}):"
                             " prepare the loader with the same DataLoaderConfiguration(dispatch_batches=..., "
                             "split_batches=...) as the run that saved it, or resume from a checkpoint taken at the "
                             "end of an epoch.")
        if state.get("batch_size") != self._batch_size:
            raise ValueError(f"This loader's state stopped in the middle of epoch {self._epoch} with batch_size "
                             f"{state.get('batch_size')}, and this loader's is {self._batch_size}: its batches "
                             "counted there are not this loader's. Resume with the same batch_size, or from a "
                             "checkpoint taken at the end of an epoch.")
        self._pending = self._resume_point(state, steps, int(state["reader_batches"]))

    def _resume_point(self, state, steps, consumed):
        raise NotImplementedError


def _no_step():
    return -1


def _read_ahead(iterator):
    """(item, whether it is the last) for each item: one read ahead so that the last is known while it is used."""
    item = next(iterator, _END)
    while item is not _END:
        upcoming = next(iterator, _END)
        yield item, upcoming is _END
        item = upcoming


_END = object()


# -- dispatched ----------------------------------------------------------------------------------------------------------
class DataLoaderDispatcher(_CountedLoader):
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

    _kind = "dispatched"

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
        self._start(base, TrainData(base) if world.global_rank == 0 else None, None, world, split_batches,
                    _drop_last, slice_fn, int(skip_batches), epoch=iteration, length=None)

    @classmethod
    def _prepared(cls, loader, accelerator, split_batches):
        """The Accelerator's: rank 0 reads through tasktrain's order of (seed, epoch) where the loader allows it (a
        plain DataLoader over map-style data: resumes skip without loading), and tells the others the length."""
        self = cls.__new__(cls)
        strategy = accelerator.strategy
        reader = None
        if strategy.global_rank == 0:
            reader = prepare_train_data(loader, 1, 0, accelerator._data_seed)
            length = len(reader) if reader.has_len() else None
            dataset_length = _length(loader.dataset)
        else:
            length = dataset_length = None
        if strategy.world_size > 1:
            length, dataset_length = strategy.broadcast((length, dataset_length))
        self._start(loader, reader, accelerator, strategy, split_batches, loader.drop_last, None, 0, epoch=0,
                    length=length, dataset_length=dataset_length)
        return self

    def _start(self, base, reader, accelerator, world, split_batches, drop_last, slice_fn, skip_batches, epoch,
               length, dataset_length=None):
        batch_size = base.batch_size if base.batch_size is not None else getattr(base.batch_sampler, "batch_size",
                                                                                  None)
        if world.world_size > 1 and batch_size is None:
            raise ValueError("A dispatched loader cuts each batch into one part per process, and this DataLoader has "
                             "no batch_size (batch_size=None, or a batch sampler without one): give it batch_size.")
        if split_batches and batch_size is not None and batch_size > 1 and batch_size % world.world_size:
            raise ValueError(f"split_batches=True cuts each batch of {batch_size} samples into {world.world_size} "
                             f"equal parts: use a batch_size that is a multiple of {world.world_size}.")
        self._setup(accelerator, world, split_batches, drop_last, epoch)
        self.base_dataloader = base
        self._reader = reader  # rank 0 only
        self._batch_size = batch_size
        self._slice_fn = slice_fn or slice_batch
        self.skip_batches = skip_batches
        self._length = length  # the base loader's batches in an epoch (the Accelerator's: told by rank 0)
        self._dataset_length = dataset_length

    # Accelerate's names
    @property
    def dataset(self):
        return self.base_dataloader.dataset

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def sampler(self):
        return self.base_dataloader.sampler

    @property
    def batch_sampler(self):
        return self.base_dataloader.batch_sampler

    @property
    def total_batch_size(self):
        """Samples of one global batch (all processes' slices together)."""
        if self._batch_size is None:
            return None
        return self._batch_size if self.split_batches else self._batch_size * self.num_processes

    @property
    def total_dataset_length(self):
        if self._dataset_length is None and self._accelerator is None:
            self._dataset_length = _length(self.dataset)
        return self._dataset_length

    def _reader_batches_per_step(self):
        return 1 if self.split_batches else self.num_processes

    def _base_length(self):
        if self._length is None and self._accelerator is None:
            self._length = _length(self.base_dataloader)  # built by hand: every process asks, as Accelerate's
        return self._length

    def _left(self, consumed):
        length = self._base_length()
        if length is None:
            return None
        rest = max(0, length - consumed)
        per_step = self._reader_batches_per_step()
        steps = rest // per_step if self._drop_last else math.ceil(rest / per_step)
        return max(0, steps - (self.skip_batches if consumed == 0 else 0))

    def _global_batches(self, skip):
        """Rank 0: (global batch, loader batches in it, whether it is the last) of each step of the pass."""
        reader = self._reader
        reader.set_epoch(self._epoch)
        dataset = reader.loader.dataset
        if isinstance(dataset, IterableDataset) and not isinstance(dataset, ShardedStream) and \
                hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self._epoch)  # a stream of the user's that reshuffles by epoch (Accelerate's call)
        if skip:
            reader.skip(skip)
        iterator, per_step = iter(reader), self._reader_batches_per_step()

        def steps():
            while True:
                group = list(itertools.islice(iterator, per_step))
                if not group or (len(group) < per_step and self._drop_last):
                    return
                yield join_batches(group), len(group)
                if len(group) < per_step:
                    return

        for (batch, count), last in _read_ahead(steps()):
            yield batch, count, last

    def _steps(self, skip):
        world, slice_fn = self._world, self._slice_fn
        rank, size = world.global_rank, world.world_size
        source = self._global_batches(skip) if rank == 0 else None
        first = None  # the pass's first samples: what completes an uneven last step
        index = 0
        while True:
            payload = next(source, None) if rank == 0 else None
            if size > 1:
                payload = world.broadcast(payload)  # every process calls it as often: rank 0 says when it ends
            if payload is None:
                return
            batch, count, last = payload
            keep = index >= self.skip_batches
            index += 1
            if size == 1:  # nothing to cut
                real = batch_size_of(batch) if self._batch_size else None  # (batch_size=None: items, not batches)
                if keep:
                    yield batch, real, 0, count, real if last else -1, last
                if last:
                    return
                continue
            real = batch_size_of(batch)
            if first is None and not self._drop_last:
                first = slice_fn(batch, slice(0, size), process_index=rank, num_processes=size)
            per_process, repeated = real // size, 0
            if real % size and not self._drop_last:
                per_process += 1
                repeated = per_process * size - real
                batch = join_batches([batch] + _cycled(first, repeated))
            mine = slice_fn(batch, slice(rank * per_process, (rank + 1) * per_process), process_index=rank,
                            num_processes=size)
            if keep:
                yield mine, per_process, repeated, count, real, last
            if last:
                return

    def load_state_dict(self, state):
        accelerator, reader = self._accelerator, self._reader
        if accelerator is not None and accelerator._data_seed is not None and reader is not None:
            # the saved run's order of (seed, epoch) (load_state restores the seed before the loaders)
            reader.seed = accelerator._data_seed
            if reader.sampler is not None and hasattr(reader.sampler, "seed"):
                reader.sampler.seed = accelerator._data_seed
        super().load_state_dict(state)

    def _resume_point(self, state, steps, consumed):
        saved_world = int(state.get("world_size", self.num_processes))
        per_step = self._reader_batches_per_step()
        if saved_world == self.num_processes and bool(state.get("split_batches")) == self.split_batches:
            return consumed, steps
        # Rank 0's loader order does not depend on the number of processes: skipping the batches it consumed
        # continues the epoch exactly; only the global batch (the samples per step) changes.
        accelerator = self._accelerator
        saved_per_step = 1 if state.get("split_batches") else saved_world
        saved, now = self._batch_size * saved_per_step, self._batch_size * per_step
        if saved != now and (accelerator is None or accelerator.is_main_process):
            warn_global_batch_change("This dispatched loader", saved, now,
                                     f"{per_step} loader batch{'es' if per_step > 1 else ''} of {self._batch_size} "
                                     "per step", consumed * self._batch_size)
        return consumed, math.ceil(consumed / per_step)

    def __reduce__(self):
        raise TypeError("A DataLoaderDispatcher holds its process's place in the world and cannot be pickled: build "
                        "it (or prepare the DataLoader) in each process.")


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
    except TypeError:
        return None


# -- sharded by global batch -----------------------------------------------------------------------------------------
class IterableShardLoader(_CountedLoader):
    """An Accelerator's prepared loader over an IterableDataset with dispatch_batches=False: every process reads the
    stream through IterableDatasetShard and yields its slice of each global batch, as Accelerate's DataLoaderShard
    over IterableDatasetShard does (on one process the loader as it is, as Accelerate leaves it). Resumes on the same
    number of processes (each skips the global batches done). `remainder` is Accelerate's: the data set's length
    modulo the global batch, -1 without a length or with drop_last."""

    _kind = "iterable shard"

    def __init__(self, loader, accelerator, split_batches):
        strategy = accelerator.strategy
        self._setup(accelerator, strategy, split_batches, loader.drop_last)
        self._batch_size = loader.batch_size
        self._dataset_length = _length(loader.dataset)
        self.shard = None
        self.base_dataloader = loader
        if strategy.world_size == 1:
            return
        if loader.batch_size is None:
            raise ValueError("An IterableDataset prepared with dispatch_batches=False is cut into global batches of "
                             "batch_size x processes items, and this DataLoader has batch_size=None: give it "
                             "batch_size, or leave dispatch_batches None (rank 0 reads, the others receive).")
        self.shard = IterableDatasetShard(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                                          num_processes=strategy.world_size, process_index=strategy.global_rank,
                                          split_batches=split_batches)
        kwargs = dict(loader_options(loader), batch_size=self.shard.process_batch_size, drop_last=loader.drop_last)
        self.base_dataloader = DataLoader(self.shard, **kwargs)

    @property
    def dataset(self):
        return self.shard if self.shard is not None else self.base_dataloader.dataset

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def total_batch_size(self):
        if self.shard is None:
            return self._batch_size
        return self.shard.global_batch_size

    @property
    def total_dataset_length(self):
        return self._dataset_length

    def _first_remainder(self):
        if self._dataset_length is None or self._drop_last or not self.total_batch_size:
            return -1
        return self._dataset_length % self.total_batch_size

    def _left(self, consumed):
        if self.shard is None:
            length = _length(self.base_dataloader)
            return None if length is None else max(0, length - consumed)
        if self._dataset_length is None:
            return None
        batches = self._dataset_length / self.shard.global_batch_size
        total = math.floor(batches) if self._drop_last else math.ceil(batches)
        return max(0, total - consumed)

    def _steps(self, skip):
        shard = self.shard
        if shard is None:  # one process: the loader as it is (its own set_epoch, if any, is the data set's)
            dataset = self.base_dataloader.dataset
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(self._epoch)
            for batch, last in _read_ahead(itertools.islice(iter(self.base_dataloader), skip, None)):
                yield batch, batch_size_of(batch) if self._batch_size else None, 0, 1, None, last
            return
        shard.set_epoch(self._epoch)
        shard.skip_batches = skip
        iterator = iter(self.base_dataloader)
        shard.skip_batches = 0  # (a worker took its copy already; one pass only)
        in_process, size = self.base_dataloader.num_workers == 0, shard.global_batch_size
        for batch, last in _read_ahead(iterator):
            repeated = 0
            if last and not self._drop_last:
                # the pass's end is read already: the shard knows its padding (a worker's copy: from the length)
                repeated = shard.padding if in_process else (
                    -self._dataset_length % size if self._dataset_length is not None else 0)
            yield batch, shard.process_batch_size, repeated, 1, None, last

    def _resume_point(self, state, steps, consumed):
        saved_world = int(state.get("world_size", self.num_processes))
        if saved_world != self.num_processes or bool(state.get("split_batches")) != self.split_batches:
            raise ValueError(
                f"This loader's state stopped in the middle of epoch {self._epoch} on {saved_world} processes "
                f"(split_batches={bool(state.get('split_batches'))}), and this run has {self.num_processes} "
                f"(split_batches={self.split_batches}): an IterableDataset sharded by global batch gives each process "
                "another slice of every global batch then, so the samples done are not known. Resume on "
                f"{saved_world} processes with the same split_batches, or from a checkpoint taken at the end of an "
                "epoch, or prepare it with DataLoaderConfiguration(dispatch_batches=True) (rank 0 reads: resumes on "
                "any number of processes), or make the data set a tasktrain.data.ShardedStream.")
        return consumed, steps


# -- the Accelerator's hook ------------------------------------------------------------------------------------------------
def is_prepared_here(obj) -> bool:
    """Whether `obj` is a loader this module prepared (Accelerator.prepare passes it through)."""
    return isinstance(obj, _CountedLoader)


def prepare_for_accelerator(loader, accelerator):
    """The prepared loader for `loader` when it is dispatched or sharded by global batch (see the module's
    docstring), else None (the Accelerator's PreparedDataLoader takes it). Every process calls it (rank 0 tells the
    others the length)."""
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

