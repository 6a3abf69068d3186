"""`lightning.pytorch.utilities.data`: extract_batch_size (how self.log finds a batch's size in Lightning),
sized_len, has_iterable_dataset, has_len_all_ranks; and, for scripts and tests that call Lightning's private helpers,
thin views of the Trainer's rules: _update_dataloader / _get_dataloader_init_args_and_kwargs (a loader's class built
again around another sampler, tasktrain/trainer/loader_init.py), _is_dataloader_shuffled, warning_cache (the
ambiguous batch size warnings said so far), _replace_dunder_methods (the hooks' recording of constructor arguments)."""
import contextlib

import torch
from torch.utils.data import IterableDataset

from tasktrain.compat.lightning.overrides.distributed import _IndexBatchSamplerWrapper
from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_only, rank_zero_warn
from tasktrain.trainer.data import _is_shuffled
from tasktrain.trainer.loader_init import _instantiate, init_arguments, recorded, recording_init_args
from tasktrain.trainer.metrics import _ambiguity_warned
from tasktrain.trainer.metrics import extract_batch_size as _extract_batch_size

warning_cache = _ambiguity_warned  # (clear() says them again)

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


def _get_dataloader_init_args_and_kwargs(dataloader, sampler, mode=None):
    """(args, kwargs) that build `dataloader`'s class again around `sampler` (the Trainer's rule, Lightning's errors);
    mode=RunningStage.PREDICTING: drop_last=False, the batch sampler wrapped to record its batches' indices."""
    predicting = str(getattr(mode, "value", mode)) == "predict"
    args, kwargs = init_arguments(dataloader, sampler, predicting=predicting)
    if predicting and kwargs.get("batch_sampler") is not None:
        kwargs["batch_sampler"] = _IndexBatchSamplerWrapper(kwargs["batch_sampler"])
    return args, kwargs


def _update_dataloader(dataloader, sampler, mode=None):
    """`dataloader`'s class built again around `sampler` (see _get_dataloader_init_args_and_kwargs)."""
    args, kwargs = _get_dataloader_init_args_and_kwargs(dataloader, sampler, mode)
    return _instantiate(type(dataloader), *args, **kwargs)


def _is_dataloader_shuffled(dataloader):
    """Whether the loader shuffles: its recorded `shuffle=` argument where it was built in a loader hook, else its
    (batch sampler's) sampler is a RandomSampler; never over an IterableDataset."""
    record = recorded(dataloader) if hasattr(dataloader, "__dict__") else None
    if record is not None:
        args, kwargs, names = record
        if "shuffle" in kwargs:
            return kwargs["shuffle"]
        if "shuffle" in names:
            return args[names.index("shuffle")]
    if has_iterable_dataset(dataloader) or not hasattr(dataloader, "sampler"):
        return False
    return _is_shuffled(dataloader)


@contextlib.contextmanager
def _replace_dunder_methods(base_cls, store_explicit_arg=None):
    """Lightning's context around its loader hooks: here the Trainer's (recording_init_args), which records the
    constructor arguments of DataLoaders and BatchSamplers (both, whichever `base_cls` names)."""
    with recording_init_args():
        yield
