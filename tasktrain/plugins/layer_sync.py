"""Lightning's layer synchronization plugins: TorchSyncBatchNorm() in plugins= is Trainer(sync_batchnorm=True). A
LayerSync (TorchSyncBatchNorm or one's own) is called as Lightning's DDP and FSDP strategies call it: under a
multi-process strategy, apply(module) when a fit sets up (after configure_model, before the precision's conversion,
the wrapper and configure_optimizers), revert(module) when the fit ends (after the teardown hooks, also after a
failure); both convert the module's layers in place and return it. A one-process strategy does not call it
(Lightning's neither)."""
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
    processes, converted in place when fit starts, and back when it ends)."""

    def apply(self, model):
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model):
        """Every SyncBatchNorm inside `model` (or `model` itself) becomes a `_BatchNormXd` holding the same
        parameters and buffers: Lightning's revert. The class the layer had before apply is not recorded (torch's
        converter drops it), so as under Lightning the layer is a BatchNorm of any input rank, not BatchNorm2d."""
        if isinstance(model, torch.nn.SyncBatchNorm):
            plain = _BatchNormXd(model.num_features, model.eps, model.momentum, model.affine,
                                 model.track_running_stats)
            if model.affine:  # the same Parameter objects: an optimizer holding them still updates the layer
                plain.weight, plain.bias = model.weight, model.bias
            plain.running_mean, plain.running_var = model.running_mean, model.running_var
            plain.num_batches_tracked = model.num_batches_tracked
            if hasattr(model, "qconfig"):
                plain.qconfig = model.qconfig
        else:
            plain = model  # a container: its children are swapped in place
        for name, child in model.named_children():
            plain.add_module(name, self.revert(child))
        return plain


class _BatchNormXd(torch.nn.modules.batchnorm._BatchNorm):
    """A reverted SyncBatchNorm (Lightning's class of the same name): BatchNorm1d/2d/3d differ only in the input
    rank they accept, which is not known after SyncBatchNorm, so any rank is accepted."""

    def _check_input_dim(self, input):
        pass
