"""Lightning's `lightning.pytorch.utilities` path under the rename rule: the names of
tasktrain/compat/lightning/utilities, and its modules under their Lightning names (tasktrain.utilities.<module> are
those very modules)."""
import importlib

from tasktrain.compat.lightning import utilities as _layer

__all__ = list(_layer.__all__)
# the submodules, attributes of this package as of Lightning's (which imports them all): loaded when first read
_SUBMODULES = ("argparse", "compile", "data", "enums", "exceptions", "grads", "imports", "memory", "migration",
               "model_helpers", "model_registry", "model_summary", "parameter_tying", "parsing", "rank_zero", "seed",
               "signature_utils", "types", "warnings")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(_layer, name)


def __dir__():
    return sorted(__all__ + list(_SUBMODULES))
