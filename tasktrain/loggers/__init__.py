"""Loggers: where the Trainer's metrics and hyper-parameters go (Lightning's `lightning.pytorch.loggers`).

    from tasktrain.loggers import TensorBoardLogger, CSVLogger, WandbLogger, MLFlowLogger, CometLogger
    Trainer(logger=[TensorBoardLogger("logs"), WandbLogger(project="demo", offline=True)])

Every logger here is a callback (tasktrain.Callback) that also receives the flushed metrics; the Trainer calls
loggers on every rank (Lightning's rule) and these act on global rank 0 only. Any object with Lightning's Logger
methods is accepted as a logger too (docs/logging.md, "Writing a logger"). wandb, mlflow and comet_ml are optional
extras (`pip install 'tasktrain[wandb]'`, `'tasktrain[mlflow]'`, `'tasktrain[comet]'`), imported when their logger is
created: importing this module imports none of them (nor tensorboard).
Lightning's LitLogger is importable here and refused when created (it needs a lightning.ai account).
The Accelerator's trackers are built on the same classes: tasktrain.loggers.trackers.
"""
from tasktrain.loggers.absent import LitLogger
from tasktrain.loggers.comet import CometLogger
from tasktrain.loggers.csv_logs import CSVLogger
from tasktrain.loggers.logger import Logger
from tasktrain.loggers.mlflow import MLFlowLogger
from tasktrain.loggers.tensorboard import TensorBoardLogger
from tasktrain.loggers.wandb import WandbLogger

__all__ = ["Logger", "TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger", "CometLogger", "LitLogger"]
