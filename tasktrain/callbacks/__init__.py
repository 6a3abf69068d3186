from tasktrain.callbacks.base import Callback, Checkpoint, Logger
from tasktrain.callbacks.batch_size_finder import BatchSizeFinder
from tasktrain.callbacks.checkpoint import ModelCheckpoint
from tasktrain.callbacks.clipping import GradientClipping
from tasktrain.callbacks.device_stats_monitor import DeviceStatsMonitor
from tasktrain.callbacks.early_stopping import EarlyStopping
from tasktrain.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from tasktrain.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from tasktrain.callbacks.lambda_function import LambdaCallback
from tasktrain.callbacks.lr_finder import LearningRateFinder
from tasktrain.callbacks.lr_monitor import LearningRateMonitor
from tasktrain.callbacks.model_summary import ModelSummary, RichModelSummary
from tasktrain.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from tasktrain.callbacks.prediction_writer import BasePredictionWriter
from tasktrain.callbacks.progress import ProgressBar
from tasktrain.callbacks.pruning import ModelPruning
from tasktrain.callbacks.spike import SpikeDetection, TrainingSpikeException
from tasktrain.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from tasktrain.callbacks.throughput_monitor import ThroughputMonitor
from tasktrain.callbacks.timer import Timer
from tasktrain.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = ["Callback", "Checkpoint", "Logger", "ModelCheckpoint", "GradientClipping", "EarlyStopping",
           "TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger", "LearningRateMonitor", "ProgressBar",
           "TQDMProgressBar", "RichProgressBar", "Timer", "LambdaCallback", "OnExceptionCheckpoint",
           "GradientAccumulationScheduler", "BasePredictionWriter",
           "WeightAveraging", "EMAWeightAveraging", "StochasticWeightAveraging", "ThroughputMonitor",
           "BaseFinetuning", "BackboneFinetuning", "ModelSummary", "RichModelSummary", "DeviceStatsMonitor",
           "SpikeDetection", "TrainingSpikeException", "ModelPruning", "BatchSizeFinder", "LearningRateFinder"]

_LOGGERS = ("TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger")


def __getattr__(name):
    # The loggers live in tasktrain.loggers, which imports this package (their base class is a Callback): they
    # are looked up on first use so that either package can be imported first.
    if name in _LOGGERS:
        import tasktrain.loggers

        return getattr(tasktrain.loggers, name)
    if name in ("TQDMProgressBar", "RichProgressBar"):  # imports tqdm / rich: only when used
        import tasktrain.callbacks.progress

        return getattr(tasktrain.callbacks.progress, name)
    raise AttributeError(f"module 'tasktrain.callbacks' has no attribute {name!r}")
