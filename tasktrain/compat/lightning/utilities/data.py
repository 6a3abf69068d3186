"""`lightning.pytorch.utilities.data`: extract_batch_size (how self.log finds a batch's size in Lightning),
sized_len, has_iterable_dataset, has_len_all_ranks."""
import torch
from torch.utils.data import IterableDataset

from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_only, rank_zero_warn
from tasktrain.trainer.metrics import extract_batch_size as _extract_batch_size

__all__ = ["extract_batch_size", "has_iterable_dataset", "has_len_all_ranks", "sized_len"]


# (the core's, which self.log uses: tasktrain/trainer/metrics.py)
def extract_batch_size(batch):
    """The first size found walking the batch (tensors, lists, tuples, dicts, dataclasses); a warning (rank 0) when
    a later tensor disagrees; MisconfigurationException when nothing in it has a size."""
    return _extract_batch_size(batch, warn=rank_zero_only.rank == 0)


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
