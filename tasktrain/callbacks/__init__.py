from tasktrain.callbacks.base import Callback, Logger
from tasktrain.callbacks.checkpoint import ModelCheckpoint
from tasktrain.callbacks.clipping import GradientClipping
from tasktrain.callbacks.early_stopping import EarlyStopping
from tasktrain.callbacks.lr_monitor import LearningRateMonitor
from tasktrain.callbacks.progress import ProgressBar
from tasktrain.callbacks.timer import Timer

__all__ = ["Callback", "Logger", "ModelCheckpoint", "GradientClipping", "EarlyStopping", "TensorBoardLogger",
           "CSVLogger", "WandbLogger", "MLFlowLogger", "LearningRateMonitor", "ProgressBar", "Timer"]

_LOGGERS = ("TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger")


def __getattr__(name):
    # The loggers live in tasktrain.loggers, which imports this package (their base class is a Callback): they
    # are looked up on first use so that either package can be imported first.
    if name in _LOGGERS:
        import tasktrain.loggers

        return getattr(tasktrain.loggers, name)
    raise AttributeError(f"module 'tasktrain.callbacks' has no attribute {name!r}")
