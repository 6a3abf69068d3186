"""DataModule: the data of a run in one object (Lightning's LightningDataModule, renamed).

The Trainer calls, on every rank: prepare_data (once per machine, before setup; the other ranks wait), setup(stage),
the loader hook of the stage, the batch-transfer hooks (these win over the module's), state_dict into checkpoints
(load_state_dict on resume), on_exception when the run fails and teardown(stage) at its end. With a DataModule the
module's own loader hooks are not called.
"""
import os

from tasktrain.trainer.module import AttributeDict, TaskModule, _not_implemented


class DataModule:
    prepare_data_per_node = True  # prepare_data on each machine's local rank 0 (False: local rank 0 of node 0 only)
    name = None
    # where a checkpoint keeps its save_hyperparameters()'s values (Lightning's keys; load_from_checkpoint reads them)
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self):
        self.trainer = None  # set by the Trainer when a run with this DataModule starts
        # Lightning's DataHooks.__init__ sets it on the instance: set it after super().__init__() to change it (a
        # class attribute of a subclass is shadowed, as under Lightning)
        self.prepare_data_per_node = True
        # Lightning's too: a loader of zero length on this rank while other ranks have batches is refused unless
        # this is True (then a warning: guards.check_zero_length_ranks)
        self.allow_zero_length_dataloader_with_multiple_devices = False
        self._hparams = AttributeDict()

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    # self.save_hyperparameters() in __init__, as in a TaskModule (kept in checkpoints as datamodule_hyper_parameters)
    save_hyperparameters = TaskModule.save_hyperparameters
    hparams_initial = TaskModule.hparams_initial
    remove_ignored_hparams = TaskModule.remove_ignored_hparams

    @classmethod
    def from_datasets(cls, train_dataset=None, val_dataset=None, test_dataset=None, predict_dataset=None,
                      batch_size=1, num_workers=0, **datamodule_kwargs):
        """A DataModule whose loader hooks wrap the given datasets (a list or dict of them: several loaders); the
        training loader shuffles unless the dataset is iterable (Lightning's helper). batch_size / num_workers also
        go to the class's __init__ where it takes them (or **kwargs), as Lightning's; a hook whose dataset is None
        is left as the class defines it."""
        import inspect

        from torch.utils.data import DataLoader, IterableDataset

        def loaders(datasets, shuffle):
            def one(ds):
                return DataLoader(ds, batch_size=batch_size, shuffle=shuffle and not isinstance(ds, IterableDataset),
                                  num_workers=num_workers, pin_memory=True)

            if isinstance(datasets, dict):
                return {key: one(ds) for key, ds in datasets.items()}
            if isinstance(datasets, (list, tuple)):
                return [one(ds) for ds in datasets]
            return one(datasets)

        params = inspect.signature(cls.__init__).parameters
        takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
        special = {k: v for k, v in {"batch_size": batch_size, "num_workers": num_workers}.items()
                   if takes_kwargs or k in params}
        datamodule = cls(**datamodule_kwargs, **special)
        for hook, datasets, shuffle in (("train_dataloader", train_dataset, True), ("val_dataloader", val_dataset, False),
                                        ("test_dataloader", test_dataset, False),
                                        ("predict_dataloader", predict_dataset, False)):
            if datasets is not None:
                setattr(datamodule, hook, lambda datasets=datasets, shuffle=shuffle: loaders(datasets, shuffle))
        return datamodule

    def __str__(self):
        """Lightning's summary of the loaders: one `{Train dataloader: size=64}` line per loader hook (`None` where
        the hook fails or has no loader, `NA` for a dataset without a length, `1. size=.. ; 2. size=..` for
        several)."""
        from collections.abc import Mapping, Sized

        from torch.utils.data import DataLoader

        def one(loader):
            if not isinstance(loader, DataLoader):
                return "None"
            return f"size={len(loader.dataset)}" if isinstance(loader.dataset, Sized) else "size=NA"

        lines = []
        for title, hook in (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
                            ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader")):
            try:
                loader = getattr(self, hook)()
            except Exception:  # a hook that needs setup() first: Lightning shows it as None too
                loader = None
            if isinstance(loader, Mapping):
                loader = list(loader.values())
            if isinstance(loader, (list, tuple)):
                text = " ; ".join(f"{i}. {one(x)}" if isinstance(x, DataLoader) else "None"
                                  for i, x in enumerate(loader, start=1))
            else:
                text = one(loader)
            lines.append(f"{{{title}: {text}}}")
        return os.linesep.join(lines)

    def prepare_data(self):
        """Download or write files: runs in one process per machine, so never assign state here (use setup)."""

    def setup(self, stage):
        """Build the datasets of `stage` ("fit", "validate", "test" or "predict"): runs on every rank."""

    def teardown(self, stage):
        """Release what setup made: runs on every rank at the end of each entry point."""

    # The loader hooks a subclass defines; the base's raise Lightning's error, so that calling one the class does not
    # define says so (the Trainer never calls them: it asks is_overridden first and takes "no loader" instead).
    def train_dataloader(self):
        raise _not_implemented("train_dataloader")

    def val_dataloader(self):
        raise _not_implemented("val_dataloader")

    def test_dataloader(self):
        raise _not_implemented("test_dataloader")

    def predict_dataloader(self):
        raise _not_implemented("predict_dataloader")

    def on_before_batch_transfer(self, batch, dataloader_idx):
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        from tasktrain.strategies.base import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        return batch

    def state_dict(self):
        """What a checkpoint keeps of this DataModule (under its class name); {} keeps nothing."""
        return {}

    def load_state_dict(self, state_dict):
        """Restore what state_dict returned, when a fit resumes from a checkpoint."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, weights_only=None,
                             **overrides):
        """Rebuild the DataModule from a checkpoint a fit wrote (Lightning's): its saved hyper-parameters
        (datamodule_hyper_parameters, overridden by **overrides) go to __init__, then load_state_dict gets what
        state_dict() saved (kept under the class name). map_location, hparams_file, weights_only: Lightning's, as
        TaskModule.load_from_checkpoint's; so is the rebuilding of the class a TaskCLI recorded (its
        load_from_checkpoint_support)."""
        import inspect

        from tasktrain.trainer.module import (checkpoint_instantiator, named_init_arguments,
                                              read_for_load_from_checkpoint, takes_any_keyword)

        ckpt = read_for_load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, weights_only)
        hparams = dict(ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        params = inspect.signature(cls.__init__).parameters
        name = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
        if name in named_init_arguments(params):  # as the module's (Lightning's): from that argument
            hparams = {name: hparams}
        hparams.update(overrides)
        instantiator = checkpoint_instantiator(cls, hparams)  # a TaskCLI's checkpoint: its class, checked
        takes_kwargs = takes_any_keyword(cls, params, instantiator)
        unknown = sorted(k for k in overrides if k not in params) if not takes_kwargs else []
        if unknown:
            raise TypeError(f"{cls.__name__}.load_from_checkpoint: {unknown} are not arguments of "
                            f"{cls.__name__}.__init__.")
        kwargs = hparams if takes_kwargs else {k: v for k, v in hparams.items() if k in params}
        datamodule = cls(**kwargs) if instantiator is None else instantiator(cls, kwargs)
        if type(datamodule).__qualname__ in ckpt:  # (the class built: a TaskCLI checkpoint's may be a subclass)
            datamodule.load_state_dict(ckpt[type(datamodule).__qualname__])
        return datamodule

    def on_exception(self, exception):
        """Called when an entry point fails, before teardown."""

