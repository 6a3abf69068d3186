"""DataModule: the data of a run in one object (Lightning's LightningDataModule, renamed).

The Trainer calls, on every rank: prepare_data (once per machine, before setup; the other ranks wait), setup(stage),
the loader hook of the stage, the batch-transfer hooks (these win over the module's), state_dict into checkpoints
(load_state_dict on resume), on_exception when the run fails and teardown(stage) at its end. With a DataModule the
module's own loader hooks are not called.
"""
from tasktrain.trainer.module import AttributeDict, TaskModule


class DataModule:
    prepare_data_per_node = True  # prepare_data on each machine's local rank 0 (False: on global rank 0 only)
    name = None
    # where a checkpoint keeps its save_hyperparameters()'s values (Lightning's keys; load_from_checkpoint reads them)
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self):
        self.trainer = None  # set by the Trainer when a run with this DataModule starts
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
        training loader shuffles (Lightning's helper)."""
        from torch.utils.data import DataLoader

        def loaders(datasets, shuffle):
            if datasets is None:
                return None
            def one(ds):
                return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers)

            if isinstance(datasets, dict):
                return {key: one(ds) for key, ds in datasets.items()}
            if isinstance(datasets, (list, tuple)):
                return [one(ds) for ds in datasets]
            return one(datasets)

        datamodule = cls(**datamodule_kwargs)
        datamodule.train_dataloader = lambda: loaders(train_dataset, True)
        datamodule.val_dataloader = lambda: loaders(val_dataset, False)
        datamodule.test_dataloader = lambda: loaders(test_dataset, False)
        datamodule.predict_dataloader = lambda: loaders(predict_dataset, False)
        return datamodule

    def prepare_data(self):
        """Download or write files: runs in one process per machine, so never assign state here (use setup)."""

    def setup(self, stage):
        """Build the datasets of `stage` ("fit", "validate", "test" or "predict"): runs on every rank."""

    def teardown(self, stage):
        """Release what setup made: runs on every rank at the end of each entry point."""

    def train_dataloader(self):
        return None

    def val_dataloader(self):
        return None

    def test_dataloader(self):
        return None

    def predict_dataloader(self):
        return None

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
    def load_from_checkpoint(cls, checkpoint_path, map_location="cpu", **overrides):
        """Rebuild the DataModule from a checkpoint a fit wrote (Lightning's): its saved hyper-parameters
        (datamodule_hyper_parameters, overridden by **overrides) go to __init__, then load_state_dict gets what
        state_dict() saved (kept under the class name)."""
        import inspect

        from tasktrain.checkpoint_io import load_checkpoint_file

        ckpt = load_checkpoint_file(checkpoint_path, map_location=map_location)
        hparams = dict(ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        params = inspect.signature(cls.__init__).parameters
        name = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
        if name in params:  # as the module's (Lightning's): from that argument
            hparams = {name: hparams}
        hparams.update(overrides)
        takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
        unknown = sorted(k for k in overrides if k not in params) if not takes_kwargs else []
        if unknown:
            raise TypeError(f"{cls.__name__}.load_from_checkpoint: {unknown} are not arguments of "
                            f"{cls.__name__}.__init__.")
        datamodule = cls(**(hparams if takes_kwargs else {k: v for k, v in hparams.items() if k in params}))
        if cls.__qualname__ in ckpt:
            datamodule.load_state_dict(ckpt[cls.__qualname__])
        return datamodule

    def on_exception(self, exception):
        """Called when an entry point fails, before teardown."""
