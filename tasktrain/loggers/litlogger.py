"""Lightning's `lightning.pytorch.loggers.litlogger` path: LitLogger, refused when created (tasktrain/loggers/absent.py)."""
from tasktrain.loggers.absent import LitLogger

__all__ = ["LitLogger"]
