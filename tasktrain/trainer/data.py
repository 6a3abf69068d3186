"""Data: each rank gets its own shard, the order is a function of (seed, epoch), and a resume skips ahead.

The Trainer rebuilds a plain DataLoader whose sampler is a RandomSampler or SequentialSampler around our
ResumableSampler (torch's DistributedSampler with a start offset), so a resumed epoch skips the samples
already seen without loading them. A user's own sampler or batch sampler is left alone.
"""
import warnings

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler


class ResumableSampler(DistributedSampler):
    """DistributedSampler (deterministic order from seed + epoch, padded to equal shards) that can start late."""

    def __init__(self, dataset, num_replicas, rank, shuffle, seed):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.start = 0

    def skip(self, num_samples: int):
        """Start the next iteration `num_samples` into this rank's order (applies once)."""
        self.start = num_samples

    def __iter__(self):
        indices = list(super().__iter__())
        start, self.start = self.start, 0
        return iter(indices[start:])


class EvalShardSampler(Sampler):
    """Rank r takes samples r, r + W, r + 2W, ...: no padding, so every sample is counted exactly once."""

    def __init__(self, dataset, num_replicas, rank):
        self.length = len(dataset)
        self.num_replicas, self.rank = num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.length, self.num_replicas))


class TrainData:
    """A training loader plus what the loop needs to drive it: set_epoch and skip-ahead."""

    def __init__(self, loader, sampler=None, generator=None, seed=0):
        self.loader, self.sampler, self.generator, self.seed = loader, sampler, generator, seed
        self._skip_batches = 0

    def __len__(self):
        return len(self.loader)

    def has_len(self):
        try:
            len(self.loader)
            return True
        except TypeError:
            return False

    def set_epoch(self, epoch):
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if self.generator is not None:
            # Worker seeds come from this generator, so they too are a function of (seed, epoch).
            self.generator.manual_seed(self.seed * 100_003 + epoch)

    def skip(self, num_batches: int):
        if num_batches <= 0:
            return
        if isinstance(self.sampler, ResumableSampler) and self.loader.batch_size is not None:
            self.sampler.skip(num_batches * self.loader.batch_size)
        else:
            self._skip_batches = num_batches

    def __iter__(self):
        iterator = iter(self.loader)
        skip, self._skip_batches = self._skip_batches, 0
        if skip:
            warnings.warn(f"Resuming mid-epoch by loading and dropping {skip} batches: this loader's sampler is the "
                          "user's own, so it cannot skip ahead without loading them.")
            for _ in range(skip):
                next(iterator, None)
        return iterator


def _rebuild(loader: DataLoader, sampler, generator) -> DataLoader:
    kwargs = dict(
        batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=generator,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, **kwargs)


def _replaceable(loader) -> bool:
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return False
    if type(loader.batch_sampler) is not BatchSampler and loader.batch_sampler is not None:
        return False
    sampler = loader.sampler
    if type(sampler) is SequentialSampler:
        return True
    return type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None


def prepare_train_data(loader, world_size, rank, seed, shuffle=None) -> TrainData:
    """shuffle=False reads a shuffling loader in order (overfit_batches); None keeps the loader's choice."""
    if _replaceable(loader):
        shuffle = isinstance(loader.sampler, RandomSampler) and shuffle is not False
        sampler = ResumableSampler(loader.dataset, world_size, rank, shuffle, seed)
        generator = torch.Generator()
        return TrainData(_rebuild(loader, sampler, generator), sampler, generator, seed)
    sampler = getattr(loader, "sampler", None)
    if world_size > 1 and not isinstance(sampler, DistributedSampler):
        warnings.warn(
            "The training loader has a custom sampler or an IterableDataset, so the Trainer cannot shard it: make "
            "sure each rank reads its own part of the data (e.g. a DistributedSampler), or every rank trains on "
            "the same samples."
        )
    return TrainData(loader, sampler if isinstance(sampler, DistributedSampler) else None, None, seed)


def prepare_eval_loader(loader, world_size, rank):
    """Shard an evaluation loader without padding (exact metrics); on one process, leave it as it is."""
    if world_size == 1 or not _replaceable(loader) or type(loader.sampler) is not SequentialSampler:
        return loader
    return _rebuild(loader, EvalShardSampler(loader.dataset, world_size, rank), loader.generator)


class _RecordingBatchSampler:
    """A batch sampler that keeps the indices of every batch it has given out (in order), for prediction writers."""

    def __init__(self, batch_sampler, seen):
        self.batch_sampler, self.seen = batch_sampler, seen

    def __iter__(self):
        for batch in self.batch_sampler:
            self.seen.append(list(batch))
            yield batch

    def __len__(self):
        return len(self.batch_sampler)


def record_batch_indices(loader):
    """(loader, seen): the same loader, rebuilt so that `seen[i]` holds the dataset indices of its i-th batch.
    A loader without a batch sampler (an IterableDataset, batch_size=None, not a DataLoader) has no indices: it is
    returned as it is, and `seen[i]` is None for each batch."""
    if not isinstance(loader, DataLoader) or loader.batch_sampler is None or \
            isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return loader, _NoIndices()
    seen = []
    kwargs = dict(batch_sampler=_RecordingBatchSampler(loader.batch_sampler, seen), num_workers=loader.num_workers,
                  collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
                  worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
                  generator=loader.generator, persistent_workers=loader.persistent_workers,
                  pin_memory_device=loader.pin_memory_device)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, **kwargs), seen


class _NoIndices(list):
    def __getitem__(self, i):
        return None

