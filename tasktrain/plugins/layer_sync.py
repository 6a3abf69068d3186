"""Lightning's layer synchronization plugins: TorchSyncBatchNorm() in plugins= is Trainer(sync_batchnorm=True). A
LayerSync of one's own is called as Lightning's DDP and FSDP strategies call it: under a multi-process strategy,
apply(module) when a fit sets up (after configure_model, before the precision's conversion, the wrapper and
configure_optimizers), revert(module) when the fit ends (after the teardown hooks, also after a failure); both
convert the module's layers in place and return it. A one-process strategy does not call it (Lightning's neither)."""
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
