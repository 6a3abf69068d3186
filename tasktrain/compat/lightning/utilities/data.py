"""`lightning.pytorch.utilities.data`: extract_batch_size (how self.log finds a batch's size in Lightning),
sized_len, has_iterable_dataset, has_len_all_ranks."""
import dataclasses
from collections.abc import Iterable, Mapping

import torch
from torch.utils.data import IterableDataset

from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_warn
from tasktrain.exceptions import MisconfigurationException

__all__ = ["extract_batch_size", "has_iterable_dataset", "has_len_all_ranks", "sized_len"]

_CANNOT_INFER = ("We could not infer the batch_size from the batch. Either simplify its structure or provide the "
                 "batch_size as `self.log(..., batch_size=batch_size)`.")
_warned = set()  # each ambiguity message once per process (Lightning's warning cache)


def _sizes(batch):
    """The first dimension of every tensor in the batch (1 for a scalar tensor), None for any other leaf."""
    if isinstance(batch, torch.Tensor):
        yield batch.size(0) if batch.ndim else 1
    elif isinstance(batch, (Iterable, Mapping)) and not isinstance(batch, str):
        for item in batch.values() if isinstance(batch, Mapping) else batch:
            yield from _sizes(item)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
    else:
        yield None


def extract_batch_size(batch):
    """The first size found walking the batch (tensors, lists, tuples, dicts, dataclasses); a warning when a later
    tensor disagrees; MisconfigurationException when nothing in it has a size."""
    size = None
    try:
        for found in _sizes(batch):
            if size is None:
                size = found
            elif found != size:
                message = ("Trying to infer the `batch_size` from an ambiguous collection. The batch size we found "
                           f"is {size}. To avoid any miscalculations, use `self.log(..., batch_size=batch_size)`.")
                if message not in _warned:
                    _warned.add(message)
                    rank_zero_warn(message)
                break
    except RecursionError:
        raise RecursionError(_CANNOT_INFER)
    if size is None:
        raise MisconfigurationException(_CANNOT_INFER)
    return size


def sized_len(dataloader):
    """len(dataloader), or None where it has none."""
    try:
        return len(dataloader)
    except (TypeError, NotImplementedError):
        return None


def has_iterable_dataset(dataloader):
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def has_len_all_ranks(dataloader, strategy, allow_zero_length_dataloader_with_multiple_devices=False):
    """Whether the loader has a length (every rank calls it: the lengths are summed over ranks). A length of zero on
    this rank while others have batches raises, unless allowed; zero on all ranks warns."""
    local = sized_len(dataloader)
    if local is None:
        return False
    total = strategy.reduce(torch.tensor(local, device=strategy.root_device), op="sum")
    name = type(dataloader).__name__
    if total == 0:
        rank_zero_warn(f"Total length of `{name}` across ranks is zero. Please make sure this was your intention.")
    if total > 0 and local == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            raise RuntimeError(f"`{name}` within local rank has zero length. Please make sure that it returns at "
                               "least 1 batch.")
        rank_zero_warn(f"Total length of `{name}` across ranks is zero, but local rank has zero length. Please be "
                       "cautious of uneven batch length.")
    if has_iterable_dataset(dataloader):
        rank_zero_warn("Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading "
                       "(when num_workers > 1), `__len__` could be inaccurate if each worker is not configured "
                       "independently to avoid having duplicate data.")
    return True
