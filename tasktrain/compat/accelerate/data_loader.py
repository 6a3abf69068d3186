"""Accelerate's `accelerate.data_loader` (as `tasktrain.data_loader`): the standalone prepare_data_loader and the
classes it builds, in Accelerate's order (the rules are tasktrain/trainer/shard.py's, which the Accelerator's
prepared loaders follow too).

    from tasktrain.data_loader import prepare_data_loader
    loader = prepare_data_loader(DataLoader(data, batch_size=4), num_processes=2, process_index=rank)

Rank r of W reads whole batches r, r + W, ... of the DataLoader's batch sampler (BatchSamplerShard); with
split_batches=True every batch is cut into W slices; even_batches=True (the default) completes the last step with
the first samples of the epoch. Unlike the Accelerator's prepared loaders these objects keep no position for
save_state: they are the building blocks Accelerate's scripts use by name.
"""
import itertools

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from tasktrain.trainer.data import loader_options, read_ahead
from tasktrain.trainer.dispatch import DataLoaderDispatcher, IterableDatasetShard
from tasktrain.trainer.shard import SeedableRandomSampler, check_split, layout

__all__ = ["BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "IterableDatasetShard",
           "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "prepare_data_loader", "skip_first_batches"]


class BatchSamplerShard(BatchSampler):
    """One process's batches of `batch_sampler`: whole batches process_index, process_index + num_processes, ...
    (split_batches=False) or the process_index-th slice of every batch (split_batches=True); even_batches=True
    refills the last step from the epoch's first samples so that every process has the same number of full
    batches, even_batches=False leaves the tail short. The batch sampler's drop_last drops what does not fill a
    step."""

    def __init__(self, batch_sampler, num_processes=1, process_index=0, split_batches=False, even_batches=True):
        self.batch_sampler = batch_sampler
        self.num_processes, self.process_index = int(num_processes), int(process_index)
        self.split_batches, self.even_batches = bool(split_batches), bool(even_batches)
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if self.split_batches:
            check_split(self.batch_size, self.num_processes)

    @property
    def sampler(self):
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def total_length(self):
        return len(self.batch_sampler)

    def __len__(self):
        # Accelerate's count (under split_batches with even_batches=False a process with no slice of the short
        # last batch yields one batch fewer than this)
        total, world = len(self.batch_sampler), self.num_processes
        if self.split_batches:
            return total
        if total % world == 0 or self.drop_last:
            return total // world
        if self.even_batches:
            return total // world + 1
        return total // world + (1 if self.process_index < total % world else 0)

    def __iter__(self):
        batches = [list(batch) for batch in self.batch_sampler]
        first = batches[:1] if self.split_batches else batches[:self.num_processes]
        for step, _ in layout(batches, first, self.num_processes, self.batch_size, self.split_batches,
                              self.even_batches, self.drop_last, one_as_is=False):
            if step[self.process_index] is not None:
                yield step[self.process_index]


class SkipBatchSampler(BatchSampler):
    """`batch_sampler` without its first `skip_batches` batches."""

    def __init__(self, batch_sampler, skip_batches=0):
        self.batch_sampler, self.skip_batches = batch_sampler, int(skip_batches)

    @property
    def batch_size(self):
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self):
        return getattr(self.batch_sampler, "drop_last", False)

    def __iter__(self):
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    @property
    def total_length(self):
        return len(self.batch_sampler)

    def __len__(self):
        return max(0, len(self.batch_sampler) - self.skip_batches)


class _LoaderState:
    """end_of_dataloader (True during the last batch), remainder (real samples of the last global batch, -1 when
    not known), as Accelerate's loaders keep them for GradientState."""

    end_of_dataloader = False
    remainder = -1

    def _begin(self, total_batch_size):
        self.end_of_dataloader, self.remainder = False, -1
        if not self._drop_last and total_batch_size:
            try:
                self.remainder = self.total_dataset_length % total_batch_size
            except TypeError:
                pass

    @property
    def total_dataset_length(self):
        dataset = self.dataset
        return getattr(dataset, "total_length", None) or len(dataset)


class DataLoaderShard(_LoaderState, DataLoader):
    """A DataLoader (its keyword arguments: batch_sampler=BatchSamplerShard(...) for a shard) that moves batches to
    `device`, synchronises `rng_types` ("torch", "cuda", "generator": `synchronized_generator`) from rank 0 at the
    start of each iteration, skips its first `skip_batches` batches, and tells end_of_dataloader / remainder /
    iteration (the epoch: set_epoch passes it to the samplers)."""

    def __init__(self, dataset, device=None, rng_types=None, synchronized_generator=None, skip_batches=0,
                 use_stateful_dataloader=False, _drop_last=False, _non_blocking=False, torch_device_mesh=None,
                 iteration=0, **kwargs):
        if use_stateful_dataloader:
            raise ValueError("DataLoaderShard(use_stateful_dataloader=True): the standalone loaders here are plain "
                             "DataLoaders; prepare a torchdata StatefulDataLoader with Accelerator.prepare (its "
                             "state is then saved by save_state).")
        if torch_device_mesh is not None:
            raise ValueError("DataLoaderShard(torch_device_mesh=...): tensor/context parallel meshes are not "
                             "supported (data parallelism only); drop torch_device_mesh.")
        super().__init__(dataset, **kwargs)
        self.device, self.rng_types = device, list(rng_types) if rng_types else None
        self.synchronized_generator, self.skip_batches = synchronized_generator, int(skip_batches)
        self._drop_last, self._non_blocking, self.iteration = bool(_drop_last), bool(_non_blocking), int(iteration)

    @property
    def total_batch_size(self):
        sampler = self.batch_sampler
        size = getattr(sampler, "batch_size", None)
        if size is None:
            return None
        return size if getattr(sampler, "split_batches", False) else size * getattr(sampler, "num_processes", 1)

    def set_epoch(self, epoch):
        self.iteration = int(epoch)
        for owner in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None),
                      getattr(getattr(self.batch_sampler, "batch_sampler", None), "sampler", None)):
            if owner is not None and hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
                return
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def get_sampler(self):
        return get_sampler(self)

    def set_sampler(self, sampler):
        inner = getattr(self.batch_sampler, "batch_sampler", self.batch_sampler)
        inner.sampler = sampler

    def __iter__(self):
        if self.rng_types:
            _synchronize(self.rng_types, self.synchronized_generator)
        self._begin(self.total_batch_size)
        self.set_epoch(self.iteration)
        for index, (batch, last) in enumerate(read_ahead(super().__iter__())):
            self.end_of_dataloader = last
            if index >= self.skip_batches:
                yield _to_device(batch, self.device, self._non_blocking)
        self.iteration += 1

    def __len__(self):
        return max(0, super().__len__() - self.skip_batches) if self.skip_batches and \
            not isinstance(self.batch_sampler, SkipBatchSampler) else super().__len__()


class SkipDataLoader(_LoaderState, DataLoader):
    """A DataLoader that reads and drops its first `skip_batches` batches (an IterableDataset has no batch sampler
    to skip with)."""

    def __init__(self, dataset, skip_batches=0, use_stateful_dataloader=False, **kwargs):
        if use_stateful_dataloader:
            raise ValueError("SkipDataLoader(use_stateful_dataloader=True): not supported here; prepare a torchdata "
                             "StatefulDataLoader with Accelerator.prepare.")
        super().__init__(dataset, **kwargs)
        self.skip_batches = int(skip_batches)
        self._drop_last = bool(kwargs.get("drop_last", False))

    def __iter__(self):
        self._begin(None)
        for index, (batch, last) in enumerate(read_ahead(super().__iter__())):
            self.end_of_dataloader = last
            if index >= self.skip_batches:
                yield batch

    def __len__(self):
        return max(0, super().__len__() - self.skip_batches)



def get_sampler(dataloader):
    """The sampler the order comes from: the batch sampler's (or its inner batch sampler's) sampler."""
    batch_sampler = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    inner = getattr(batch_sampler, "batch_sampler", batch_sampler)
    return getattr(inner, "sampler", None)


def _world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    from tasktrain.compat.accelerate.state import PartialState

    state = PartialState()
    return state.num_processes, state.process_index


def _broadcast(obj):
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
            torch.distributed.get_world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _synchronize(rng_types, generator):
    """Every process continues from rank 0's random states (Accelerate's synchronize_rng_states)."""
    for kind in rng_types:
        kind = str(getattr(kind, "value", kind))
        if kind == "torch":
            torch.set_rng_state(_broadcast(torch.get_rng_state()))
        elif kind == "cuda" and torch.cuda.is_available():
            torch.cuda.set_rng_state(_broadcast(torch.cuda.get_rng_state()).cpu())
        elif kind == "generator" and generator is not None:
            generator.set_state(_broadcast(generator.get_state()))
        elif kind not in ("cuda", "generator"):
            raise ValueError(f"rng_types: {kind!r} is not one of 'torch', 'cuda', 'generator'.")


def _to_device(batch, device, non_blocking):
    if device is None:
        return batch
    from tasktrain.compat.accelerate.utils.operations import send_to_device

    return send_to_device(batch, device, non_blocking=non_blocking)


def prepare_data_loader(dataloader, device=None, num_processes=None, process_index=None, split_batches=False,
                        put_on_device=False, rng_types=None, dispatch_batches=None, even_batches=True,
                        slice_fn_for_dispatch=None, use_seedable_sampler=False, data_seed=None, non_blocking=False,
                        use_stateful_dataloader=False, torch_device_mesh=None):
    """This process's shard of `dataloader` (a DataLoaderShard), as Accelerate's prepare_data_loader: whole batches
    of the batch sampler per process (BatchSamplerShard), or slices of each (split_batches=True); even_batches;
    a shuffling sampler's generator made one (seeded once) and synchronised from rank 0 at every iteration
    (rng_types "generator"); use_seedable_sampler replaces a RandomSampler by SeedableRandomSampler(data_seed).
    num_processes / process_index default to this process's. Batches go to `device` under put_on_device=True."""
    if dispatch_batches is None:  # Accelerate's default: an IterableDataset put on the device is dispatched
        dispatch_batches = bool(put_on_device) and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError("prepare_data_loader(dispatch_batches=True) needs put_on_device=True (as Accelerate's): the "
                         "batches rank 0 reads are sent to every process's device.")
    if slice_fn_for_dispatch is not None and not dispatch_batches:
        raise ValueError("prepare_data_loader(slice_fn_for_dispatch=...) is used only with dispatch_batches=True; "
                         "drop it.")
    if use_stateful_dataloader:
        raise ValueError("prepare_data_loader(use_stateful_dataloader=True): the standalone loaders are plain "
                         "DataLoaders; use Accelerator(dataloader_config=DataLoaderConfiguration("
                         "use_stateful_dataloader=True)) and accelerator.prepare.")
    if torch_device_mesh is not None:
        raise ValueError("prepare_data_loader(torch_device_mesh=...): tensor/context parallel meshes are not "
                         "supported (data parallelism only); drop torch_device_mesh.")
    if num_processes is None or process_index is None:
        world, rank = _world()
        num_processes = world if num_processes is None else num_processes
        process_index = rank if process_index is None else process_index
    num_processes, process_index = int(num_processes), int(process_index)
    dataset = dataloader.dataset
    if dispatch_batches:
        return _dispatcher(dataloader, num_processes, process_index, split_batches, non_blocking,
                           slice_fn_for_dispatch)
    if isinstance(dataset, IterableDataset):
        batch_size = dataloader.batch_size
        if num_processes > 1:
            dataset, batch_size = _iterable_shard(dataset, batch_size, dataloader.drop_last, num_processes,
                                                  process_index, split_batches)
        return DataLoaderShard(dataset, device=device if put_on_device else None, rng_types=rng_types,
                               _drop_last=dataloader.drop_last, _non_blocking=non_blocking,
                               batch_size=batch_size, drop_last=dataloader.drop_last,
                               **loader_options(dataloader))
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    batch_sampler = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
    if batch_sampler is None:
        raise ValueError("prepare_data_loader: this DataLoader has no batch sampler (batch_size=None); give it "
                         "batch_size or batch_sampler.")
    if split_batches:
        size = getattr(batch_sampler, "batch_size", None)
        if size is None:
            raise ValueError("prepare_data_loader(split_batches=True) needs a batch size on the DataLoader or its "
                             "batch sampler (each batch is cut into one slice per process).")
        if size > 1:
            check_split(size, num_processes)
    sampler = getattr(batch_sampler, "sampler", None)
    generator = None
    if isinstance(sampler, RandomSampler) and use_seedable_sampler:
        sampler = SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                        num_samples=sampler._num_samples, generator=sampler.generator,
                                        data_seed=data_seed)
        batch_sampler.sampler = sampler
    if num_processes > 1:
        if not use_seedable_sampler and sampler is not None and hasattr(sampler, "generator"):
            if sampler.generator is None:  # one, seeded once, so that every rank draws rank 0's order
                sampler.generator = torch.Generator()
                sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            generator = sampler.generator
        batch_sampler = BatchSamplerShard(batch_sampler, num_processes=num_processes, process_index=process_index,
                                          split_batches=split_batches, even_batches=even_batches)
    rng_types = list(rng_types) if rng_types else None
    if rng_types and generator is None and "generator" in rng_types:
        rng_types.remove("generator")
    kwargs = loader_options(dataloader)
    if sampler_is_batch_sampler:
        kwargs.update(sampler=batch_sampler, batch_size=dataloader.batch_size)
    else:
        kwargs.update(batch_sampler=batch_sampler)
    return DataLoaderShard(dataset, device=device if put_on_device else None, rng_types=rng_types,
                           synchronized_generator=generator, _drop_last=dataloader.drop_last,
                           _non_blocking=non_blocking, **kwargs)


def _iterable_shard(dataset, batch_size, drop_last, num_processes, process_index, split_batches):
    """Each process's part of a stream, as Accelerate: a Hugging Face datasets.IterableDataset with a shard per
    process reads its own shards; any other keeps its part of each global batch (IterableDatasetShard)."""
    try:
        from datasets import IterableDataset as HuggingFaceIterable
    except ImportError:
        HuggingFaceIterable = ()
    if isinstance(dataset, HuggingFaceIterable) and not split_batches and dataset.n_shards >= num_processes:
        return dataset.shard(num_shards=num_processes, index=process_index), batch_size
    if split_batches and batch_size is not None:
        check_split(batch_size, num_processes)
    shard = IterableDatasetShard(dataset, batch_size=batch_size, drop_last=drop_last, num_processes=num_processes,
                                 process_index=process_index, split_batches=split_batches)
    return shard, batch_size // num_processes if split_batches and batch_size is not None else batch_size


def _dispatcher(dataloader, num_processes, process_index, split_batches, non_blocking, slice_fn):
    """Rank 0 reads `dataloader`, every process gets its slice (DataLoaderDispatcher), over this process group."""
    world, rank = _world()
    if (num_processes, process_index) != (world, rank):
        raise ValueError(f"prepare_data_loader(dispatch_batches=True, num_processes={num_processes}, "
                         f"process_index={process_index}): rank 0 sends the batches through the running process "
                         f"group, which has {world} process(es) (this one is {rank}); leave num_processes and "
                         "process_index unset.")
    kwargs = loader_options(dataloader)
    kwargs.pop("generator", None)
    if isinstance(dataloader.dataset, IterableDataset):
        kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
    else:  # the user's own batch sampler (its sampler, batch size and drop_last), as Accelerate's
        kwargs.update(batch_sampler=dataloader.batch_sampler)
    return DataLoaderDispatcher(dataloader.dataset, split_batches=split_batches, _drop_last=dataloader.drop_last,
                                _non_blocking=non_blocking, slice_fn=slice_fn, **kwargs)


def skip_first_batches(dataloader, num_batches=0):
    """`dataloader` without the first `num_batches` batches of its next iteration: a prepared loader of an
    Accelerator skips them without loading them (and counts them for save_state); a DataLoader gets a
    SkipBatchSampler (an IterableDataset: a SkipDataLoader that reads and drops them)."""
    from tasktrain.trainer.accelerator import PreparedDataLoader
    from tasktrain.trainer.accelerator import skip_first_batches as skip_prepared

    if isinstance(dataloader, PreparedDataLoader):
        return skip_prepared(dataloader, num_batches)
    if not isinstance(dataloader, DataLoader):
        return skip_prepared(dataloader, num_batches)
    dataset, kwargs = dataloader.dataset, loader_options(dataloader)
    if isinstance(dataset, IterableDataset) or dataloader.batch_sampler is None and \
            not isinstance(dataloader.sampler, BatchSampler):
        return SkipDataLoader(dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              drop_last=dataloader.drop_last, **kwargs)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    inner = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
    skipping = SkipBatchSampler(inner, skip_batches=num_batches)
    if sampler_is_batch_sampler:
        kwargs.update(sampler=skipping, batch_size=dataloader.batch_size)
    else:
        kwargs.update(batch_sampler=skipping)
    if isinstance(dataloader, DataLoaderShard):
        return DataLoaderShard(dataset, device=dataloader.device, rng_types=dataloader.rng_types,
                               synchronized_generator=dataloader.synchronized_generator,
                               _drop_last=dataloader._drop_last, _non_blocking=dataloader._non_blocking,
                               iteration=dataloader.iteration, **kwargs)
    return DataLoader(dataset, **kwargs)
