"""Lightning's `lightning.pytorch.overrides.distributed` names that scripts and tests use: UnrepeatedDistributedSampler
(each sample on one rank only, no padding: for prediction and evaluation) and _IndexBatchSamplerWrapper (a batch
sampler that keeps the indices of the batches it gave out). The Trainer's own predict sharding is
tasktrain/trainer/data.py's PredictShardSampler (the same rule over the loader's sampler); these are for scripts that
build their loaders with them. Lightning's DDP helpers of this module (prepare_for_backward, _sync_module_states,
comm hooks) are not here: tasktrain's DDP strategy does that work."""
from collections.abc import Sized

import torch
from torch.utils.data import DistributedSampler


class UnrepeatedDistributedSampler(DistributedSampler):
    """A DistributedSampler (same arguments) that neither pads nor drops: rank r takes positions r, r + N, ... of the
    dataset's order (shuffled by torch.randperm seeded with the epoch alone, Lightning's rule), so ranks may differ by
    one sample and every sample is read once. Not for training: DDP needs every rank to run the same steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.dataset, Sized):
            raise TypeError("The given dataset must implement the `__len__` method.")
        self.total_size = len(self.dataset)
        self.num_samples = len(range(self.rank, self.total_size, self.num_replicas))
        if self.num_samples < 1 and self.total_size:  # Lightning's AssertionError (DDP's first step would hang)
            raise AssertionError(f"UnrepeatedDistributedSampler: {self.total_size} samples leave rank {self.rank} of "
                             f"{self.num_replicas} none; every rank needs at least one (use fewer processes).")

    def __iter__(self):
        count = len(self.dataset)
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.epoch)).tolist() \
            if self.shuffle else list(range(count))
        return iter(order[self.rank::self.num_replicas])


class _IndexBatchSamplerWrapper:
    """Wraps a batch sampler: `seen_batch_indices` lists the batches given out since the iteration began (emptied by
    each new iteration); the wrapped sampler's attributes read through (batch_size, drop_last, sampler, ...)."""

    def __init__(self, batch_sampler):
        self._batch_sampler = batch_sampler
        self._iterator = None
        self.seen_batch_indices = []

    def __getattr__(self, name):  # (only for names not set here: the wrapped sampler's)
        if name.startswith("__") or name in ("_batch_sampler", "_iterator"):
            raise AttributeError(name)
        return getattr(self._batch_sampler, name)

    def __iter__(self):
        self.seen_batch_indices = []
        self._iterator = iter(self._batch_sampler)
        return self

    def __next__(self):
        if self._iterator is None:
            raise TypeError("_IndexBatchSamplerWrapper: iterate it (iter(wrapper)) before calling next().")
        batch = next(self._iterator)
        self.seen_batch_indices.append(batch)
        return batch

    def __len__(self):
        return len(self._batch_sampler)

    def __getstate__(self):
        return {**self.__dict__, "_iterator": None}  # (a running iterator does not pickle)

    def __setstate__(self, state):
        self.__dict__.update(state)
