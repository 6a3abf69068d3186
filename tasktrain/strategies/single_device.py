from tasktrain.strategies.base import OneProcess, Strategy


class SingleDevice(OneProcess, Strategy):
    """One process, one device (the CPU, or one GPU)."""

    name = "single_device"

    def __init__(self, device=None, accelerator=None, precision=None):
        super().__init__(accelerator=accelerator, precision=precision)
        if device is not None:
            import torch

            self._root_device = torch.device(device)
