"""BasePredictionWriter: write predictions as they come (per batch) or all at once (per epoch), per rank.

Subclass it and write `write_on_batch_end(trainer, module, prediction, batch_indices, batch, batch_idx,
dataloader_idx)` and/or `write_on_epoch_end(trainer, module, predictions, batch_indices)`;
`write_interval` is "batch", "epoch" or "batch_and_epoch". `batch_indices` are the dataset indices of the
batch's samples (this rank's, on several processes), so predictions written per rank can be put back in order.

With `trainer.predict(..., return_predictions=False)` predict returns None and, with batch writers only, keeps no
prediction in memory; an epoch writer gets them all at the end either way (they are kept for it, as in Lightning).
`predictions` at the epoch's end and `batch_indices` are per loader: `batch_indices[0][i]` is the i-th batch's.
"""
from tasktrain.callbacks.base import Callback

_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    def __init__(self, write_interval="batch"):
        if write_interval not in _INTERVALS:
            raise ValueError(f"BasePredictionWriter(write_interval={write_interval!r}): use one of {_INTERVALS}.")
        self.interval = write_interval

    @property
    def writes_on_batch(self):
        return self.interval in ("batch", "batch_and_epoch")

    @property
    def writes_on_epoch(self):
        return self.interval in ("epoch", "batch_and_epoch")

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must define "
                                  "write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, "
                                  "batch_idx, dataloader_idx).")

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must define "
                                  "write_on_epoch_end(self, trainer, module, predictions, batch_indices).")

    def on_predict_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.writes_on_batch:
            indices = trainer.predict_batch_indices[dataloader_idx][batch_idx]
            self.write_on_batch_end(trainer, module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer, module):
        if self.writes_on_epoch:
            self.write_on_epoch_end(trainer, module, trainer.predictions, trainer.predict_batch_indices)
