from tasktrain.strategies.base import GradientClip, Plan, Strategy
from tasktrain.strategies.ddp import DDP
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.single_device import SingleDevice

__all__ = ["Strategy", "Plan", "GradientClip", "DDP", "Precision", "SingleDevice"]
