from typing import Optional, Union

import torch

from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.checkpoint_io import CheckpointIO
from tasktrain.plugins.precision import _PRECISION_PLUGIN
from tasktrain.strategies.base import OneProcess, Strategy


class SingleDevice(OneProcess, Strategy):
    """One process, one device (the CPU, or one GPU)."""

    name = "single_device"
    strategy_name = "single_device"  # (Lightning's registry name)

    def __init__(
        self,
        device: Optional[Union[torch.device, str, int]] = None,
        accelerator: Optional[Accelerator] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[_PRECISION_PLUGIN] = None,
        *,
        precision=None,
    ):
        # Lightning's parameters in Lightning's order; tasktrain's precision= (a name) by keyword only
        # checkpoint_io, precision_plugin: Lightning's SingleDeviceStrategy arguments (precision_plugin is the
        # precision, one of tasktrain.plugins.precision)
        if precision_plugin is not None:
            from tasktrain.strategies.lightning import _check_common

            if precision is not None:
                raise ValueError("SingleDeviceStrategy(precision=..., precision_plugin=...): give the precision once.")
            _check_common("SingleDeviceStrategy", None, None, None, precision_plugin)
            precision = precision_plugin
        super().__init__(accelerator=accelerator, precision=precision)
        if checkpoint_io is not None:
            self.checkpoint_io = checkpoint_io
        if device is not None:
            import torch

            self._root_device = torch.device(device)

    def barrier(self, *args, **kwargs):
        """Lightning's SingleDeviceStrategy.barrier(*args, **kwargs): one process waits for no one."""


class SingleDeviceStrategy(SingleDevice):
    """Lightning's SingleDeviceStrategy (`from lightning.pytorch.strategies import SingleDeviceStrategy` after the
    rename): tasktrain's SingleDevice under Lightning's name, a class of its own so that TaskCLI finds it by that
    short name, as LightningCLI does. Every SingleDevice is an instance of it (the Trainer's strategy on one device
    is one, as under Lightning)."""

    @classmethod
    def __subclasshook__(cls, subclass):
        if cls is SingleDeviceStrategy and SingleDevice in getattr(subclass, "__mro__", ()):
            return True
        return NotImplemented  # (a subclass of one's own: Python's rules)

    @classmethod
    def register_strategies(cls, strategy_registry):
        """Lightning's: register this class as its strategy_name ("single_device") in `strategy_registry`."""
        strategy_registry.register(cls.strategy_name, cls, description=cls.__name__)
