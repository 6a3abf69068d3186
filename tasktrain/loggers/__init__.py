"""Loggers: where the Trainer's metrics and hyper-parameters go (Lightning's `lightning.pytorch.loggers`).

    from tasktrain.loggers import TensorBoardLogger, CSVLogger, WandbLogger, MLFlowLogger
    Trainer(logger=[TensorBoardLogger("logs"), WandbLogger(project="demo", offline=True)])

Every logger here is a callback (tasktrain.Callback) that also receives the flushed metrics; the Trainer calls
loggers on every rank (Lightning's rule) and these act on global rank 0 only. Any object with Lightning's Logger
methods is accepted as a logger too (docs/logging.md, "Writing a logger"). wandb and mlflow are optional extras
(`pip install 'tasktrain[wandb]'`, `'tasktrain[mlflow]'`), imported when their logger is created: importing this
module imports neither (nor tensorboard).
Lightning's CometLogger and LitLogger are importable here and refused when created (tasktrain has neither).
The Accelerator's trackers are built on the same classes: tasktrain.loggers.trackers.
"""
from tasktrain.loggers.absent import CometLogger, LitLogger
from tasktrain.loggers.csv_logs import CSVLogger
from tasktrain.loggers.logger import Logger
from tasktrain.loggers.mlflow import MLFlowLogger
from tasktrain.loggers.tensorboard import TensorBoardLogger
from tasktrain.loggers.wandb import WandbLogger

__all__ = ["Logger", "TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger", "CometLogger", "LitLogger"]
