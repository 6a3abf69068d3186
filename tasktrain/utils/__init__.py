"""Accelerate's `accelerate.utils` path under the rename rule: the names of tasktrain/compat/accelerate/utils, and
its modules under their Accelerate names (tasktrain.utils.dataclasses ... are those very modules)."""
from tasktrain.compat.accelerate import utils as _utils

__all__ = list(_utils.__all__)


def __getattr__(name):
    return getattr(_utils, name)


def __dir__():
    return sorted(__all__)
