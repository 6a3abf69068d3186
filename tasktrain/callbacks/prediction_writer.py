"""BasePredictionWriter: write predictions as they come (per batch) or all at once (per epoch), per rank.

Subclass it and write `write_on_batch_end(trainer, pl_module, prediction, batch_indices, batch, batch_idx,
dataloader_idx)` and/or `write_on_epoch_end(trainer, pl_module, predictions, batch_indices)`;
`write_interval` is "batch", "epoch" or "batch_and_epoch". `batch_indices` are the dataset indices of the
batch's samples (this rank's, on several processes), so predictions written per rank can be put back in order.

With `trainer.predict(..., return_predictions=False)` predict returns None and, with batch writers only, keeps no
prediction in memory; an epoch writer gets them all at the end either way (they are kept for it, as in Lightning).
`predictions` at the epoch's end are the one loader's list (a list per loader with several), `batch_indices` are
per loader: `batch_indices[0][i]` is the i-th batch's (Lightning's shapes).

As Lightning: `self.interval` is a WriteInterval (a str enum: `interval == "epoch"` holds; `.on_batch`,
`.on_epoch`); a wrong `write_interval` is a MisconfigurationException (a ValueError), and a predict_step that takes
`dataloader_iter` a NotImplementedError at set-up.
"""
import inspect
from enum import Enum
from typing import Literal

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


class WriteInterval(str, Enum):
    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    def __init__(self, write_interval: Literal["batch", "epoch", "batch_and_epoch"] = "batch") -> None:
        if write_interval not in [i.value for i in WriteInterval]:
            raise MisconfigurationException(f"`write_interval` should be one of {[i.value for i in WriteInterval]}; "
                                            f"got {write_interval!r}.")
        self.interval = WriteInterval(write_interval)

    @property
    def writes_on_batch(self):
        return self.interval.on_batch

    @property
    def writes_on_epoch(self):
        return self.interval.on_epoch

    def setup(self, trainer, pl_module, stage):
        if "dataloader_iter" in inspect.signature(pl_module.predict_step).parameters:
            raise NotImplementedError("The `PredictionWriterCallback` does not support using `dataloader_iter`: "
                                      f"{type(pl_module).__name__}.predict_step takes it.")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must define "
                                  "write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, "
                                  "batch_idx, dataloader_idx).")

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must define "
                                  "write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices).")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.writes_on_batch:
            indices = trainer.predict_batch_indices[dataloader_idx][batch_idx]
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer, pl_module):
        if self.writes_on_epoch:
            self.write_on_epoch_end(trainer, pl_module, trainer.predictions, trainer.predict_batch_indices)
