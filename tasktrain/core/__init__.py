"""Lightning's `lightning.pytorch.core` path under the rename rule: the names of tasktrain/compat/lightning/core, and its
modules under their Lightning names (tasktrain.core.<module> are those very modules)."""
from tasktrain.compat.lightning import core as _layer

__all__ = [name for name in dir(_layer) if not name.startswith("_")]


def __getattr__(name):
    return getattr(_layer, name)


def __dir__():
    return sorted(__all__)
