from tasktrain.strategies.base import (ClipsInsideStep, GradientClip, MultiProcess, OneProcess, Plan, Sharded,
                                      Strategy)
from tasktrain.strategies.ddp import DDP
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.single_device import SingleDevice

__all__ = ["Strategy", "OneProcess", "MultiProcess", "Sharded", "ClipsInsideStep", "Plan", "GradientClip", "DDP",
           "Precision", "SingleDevice"]
