"""Lightning's `lightning.pytorch.utilities` path under the rename rule: the names of tasktrain/compat/lightning/utilities, and its
modules under their Lightning names (tasktrain.utilities.<module> are those very modules)."""
from tasktrain.compat.lightning import utilities as _layer

__all__ = [name for name in dir(_layer) if not name.startswith("_")]


def __getattr__(name):
    return getattr(_layer, name)


def __dir__():
    return sorted(__all__)
