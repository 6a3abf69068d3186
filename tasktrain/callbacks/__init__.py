from tasktrain.callbacks.base import Callback, Logger
from tasktrain.callbacks.checkpoint import ModelCheckpoint
from tasktrain.callbacks.clipping import GradientClipping
from tasktrain.callbacks.early_stopping import EarlyStopping
from tasktrain.callbacks.loggers import CSVLogger, TensorBoardLogger
from tasktrain.callbacks.lr_monitor import LearningRateMonitor
from tasktrain.callbacks.progress import ProgressBar
from tasktrain.callbacks.timer import Timer

__all__ = ["Callback", "Logger", "ModelCheckpoint", "GradientClipping", "EarlyStopping", "TensorBoardLogger",
           "CSVLogger", "LearningRateMonitor", "ProgressBar", "Timer"]
