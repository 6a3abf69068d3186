"""Lightning's module path `lightning.pytorch.strategies.strategy`: the Strategy base class (defined in base.py)."""
from tasktrain.strategies.base import Strategy

__all__ = ["Strategy"]
