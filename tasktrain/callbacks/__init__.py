from tasktrain.callbacks.base import Callback, Logger
from tasktrain.callbacks.checkpoint import ModelCheckpoint
from tasktrain.callbacks.clipping import GradientClipping
from tasktrain.callbacks.loggers import TensorBoardLogger
from tasktrain.callbacks.progress import ProgressBar
from tasktrain.callbacks.timer import Timer

__all__ = ["Callback", "Logger", "ModelCheckpoint", "GradientClipping", "TensorBoardLogger", "ProgressBar", "Timer"]
