"""The loop and what it carries. `from tasktrain.trainer import Trainer, seed_everything` as from Lightning's
`lightning.pytorch.trainer`; imported on first use (tasktrain.trainer.module is imported by much that must not
import the loop)."""
_NAMES = {"Trainer": "tasktrain.trainer.trainer", "seed_everything": "tasktrain.trainer.seed"}

__all__ = list(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'tasktrain.trainer' has no attribute {name!r}")
