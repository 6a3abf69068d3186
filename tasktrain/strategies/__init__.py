from tasktrain.strategies.base import Strategy
from tasktrain.strategies.ddp import DDP
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.single_device import SingleDevice

__all__ = ["Strategy", "DDP", "Precision", "SingleDevice"]
