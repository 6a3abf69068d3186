from tasktrain.strategies.base import OneProcess, Strategy


class SingleDevice(OneProcess, Strategy):
    """One process, one device (the CPU, or one GPU)."""

    name = "single_device"

    def __init__(self, device=None, accelerator=None, precision=None):
        super().__init__(accelerator=accelerator, precision=precision)
        if device is not None:
            import torch

            self._root_device = torch.device(device)


class SingleDeviceStrategy(SingleDevice):
    """Lightning's `SingleDeviceStrategy(device="cpu", accelerator=None, checkpoint_io=None, precision_plugin=None)`
    under its name: `from lightning.pytorch.strategies import SingleDeviceStrategy` after the rename imports it, and
    its arguments map onto SingleDevice's (precision_plugin is the precision, checkpoint_io the strategy's)."""

    def __init__(self, device="cpu", accelerator=None, checkpoint_io=None, precision_plugin=None, precision=None):
        if precision_plugin is not None:
            from tasktrain.strategies.lightning import _check_common

            if precision is not None:
                raise ValueError("SingleDeviceStrategy(precision=..., precision_plugin=...): give the precision once.")
            _check_common("SingleDeviceStrategy", None, None, None, precision_plugin)
            precision = precision_plugin
        super().__init__(device=device, accelerator=accelerator, precision=precision)
        if checkpoint_io is not None:
            self.checkpoint_io = checkpoint_io
