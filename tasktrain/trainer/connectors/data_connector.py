"""Lightning's module path `lightning.pytorch.trainer.connectors.data_connector`, for the module-level names scripts
and tests import or patch there. There is no `_DataConnector` here (tasktrain has no connector objects:
`trainer._data_connector` is a view of the Trainer, trainer/lightning_connectors.py); each name is tasktrain's own
rule under Lightning's name and signature:

    _DataLoaderSource(instance, name)    where a loop's loaders come from (lightning_connectors.DataLoaderSource)
    _request_dataloader(source)          source.dataloader(), recording the DataLoaders' constructor arguments
                                         (loader_init.py), as a run requests a hook's loaders
    _DataHookSelector(model, datamodule) .get_instance(hook): whose transfer hook a run calls (run.data_hook_owner)
    _check_dataloader_iterable(dataloader, source, trainer_fn)   the TypeError for what is not a loader
    _worker_check(trainer, dataloader, name)                     the num_workers warnings (data.warn_workers)
    warning_cache                        the shared-hook warnings said so far (clear() says them again)
    suggested_max_num_workers            the bound _worker_check reads (patchable here, as in Lightning)
    mp                                   torch.multiprocessing, as Lightning's module has it (so that a patch of
                                         `mp.<name>` here resolves); the "spawn" test reads the loader's
                                         multiprocessing context, else the process's default one
"""
import torch.multiprocessing as mp  # noqa: F401  (Lightning's module has it: patches of its names here resolve)
from torch.utils.data import DataLoader

from tasktrain.strategies.environment import launcher_rank
from tasktrain.trainer import run
from tasktrain.trainer.runtime import known_rank
from tasktrain.trainer.data import suggested_max_num_workers, warn_workers
from tasktrain.trainer.evaluation import check_loader_iterable
from tasktrain.trainer.lightning_connectors import DataLoaderSource as _DataLoaderSource
from tasktrain.trainer.loader_init import recording_init_args

warning_cache = run.shared_hook_warned

__all__ = ["_DataLoaderSource", "_request_dataloader", "_DataHookSelector", "_check_dataloader_iterable",
           "_worker_check", "warning_cache"]


def _request_dataloader(data_source):
    """The loaders of `data_source`: a hook's DataLoaders keep the arguments they were built with, so that the
    Trainer can build them again around its sampler (as a run requests them, Trainer._loader_of_now)."""
    with recording_init_args():
        return data_source.dataloader()


class _DataHookSelector:
    """Lightning's: whose shared data hook (on_before_batch_transfer, transfer_batch_to_device,
    on_after_batch_transfer) runs, the module's or the DataModule's: the rule a run follows (run.data_hook_owner),
    with its warning once per process."""

    def __init__(self, model, datamodule):
        self.model = model
        self.datamodule = datamodule

    def __repr__(self):
        return f"_DataHookSelector(model={type(self.model).__name__}, datamodule={type(self.datamodule).__name__})"

    def get_instance(self, hook_name):
        # rank zero warns, as Lightning's rank_zero_warn: the rank the last run announced, else the launcher's
        # (what Lightning's rank_zero_only.rank holds; the core never imports the compatibility layer that keeps it)
        rank = known_rank(default=launcher_rank())
        return run.data_hook_owner(hook_name, self.model, self.datamodule, warn=rank == 0)


def _check_dataloader_iterable(dataloader, source, trainer_fn):
    """TypeError naming the entry point `trainer_fn` (a TrainerFn) or the hook of `source` (a _DataLoaderSource) when
    `dataloader` is not iterable; a DataLoader is not asked (iter() would start its workers)."""
    check_loader_iterable(dataloader, getattr(trainer_fn, "value", trainer_fn),
                          source.instance if source.is_module() else None, source.name)


def _worker_check(trainer, dataloader, name):
    """Lightning's worker warnings on `dataloader` (named `name`, "train_dataloader", ...) for `trainer`'s devices."""
    if not isinstance(dataloader, DataLoader):
        return
    upper_bound = suggested_max_num_workers(trainer.num_devices)
    # (the reload setting is read only where it matters, as Lightning's: persistent pinned workers)
    pinned = dataloader.persistent_workers and dataloader.pin_memory
    warn_workers(dataloader, name, upper_bound, trainer.reload_dataloaders_every_n_epochs if pinned else 0)
