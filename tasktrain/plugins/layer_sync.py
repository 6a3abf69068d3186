"""Lightning's layer synchronization plugins: TorchSyncBatchNorm() in plugins= is Trainer(sync_batchnorm=True)."""
import abc

import torch

__all__ = ["LayerSync", "TorchSyncBatchNorm"]


class LayerSync(abc.ABC):
    """Lightning's base class: apply(model) wraps layers with synchronization, revert(model) undoes it."""

    @abc.abstractmethod
    def apply(self, model):
        """Wrap the model's layers."""

    @abc.abstractmethod
    def revert(self, model):
        """Undo apply."""


class TorchSyncBatchNorm(LayerSync):
    """torch's SyncBatchNorm for the BatchNorm layers (what Trainer(sync_batchnorm=True) does: in a run of several
    processes, converted in place when fit starts)."""

    def apply(self, model):
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model):
        raise NotImplementedError("TorchSyncBatchNorm.revert: tasktrain keeps the SyncBatchNorm layers after fit "
                                  "(they act as BatchNorm in a single process).")
