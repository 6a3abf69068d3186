from tasktrain.strategies.base import (ClipsInsideStep, GradientClip, MultiProcess, OneProcess, Plan, Sharded,
                                      Strategy)
from tasktrain.strategies.ddp import DDP
from tasktrain.strategies.precision import Precision
from tasktrain.strategies.single_device import SingleDevice
from tasktrain.strategies.world import ProcessWorld

__all__ = ["Strategy", "OneProcess", "ProcessWorld", "MultiProcess", "Sharded", "ClipsInsideStep", "Plan", "GradientClip", "DDP",
           "Precision", "SingleDevice"]
