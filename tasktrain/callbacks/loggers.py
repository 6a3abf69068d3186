"""The loggers' first address (they were callbacks here before tasktrain.loggers existed); kept so that old
imports work. The classes live in tasktrain/loggers/."""
from tasktrain.loggers.csv_logs import CSVLogger
from tasktrain.loggers.mlflow import MLFlowLogger
from tasktrain.loggers.tensorboard import TensorBoardLogger
from tasktrain.loggers.wandb import WandbLogger

__all__ = ["TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger"]
