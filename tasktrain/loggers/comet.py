"""Lightning's `lightning.pytorch.loggers.comet` path: CometLogger, refused when created (tasktrain/loggers/absent.py)."""
from tasktrain.loggers.absent import CometLogger

__all__ = ["CometLogger"]
