"""Accelerate's `accelerate.tracking` under the rename rule: the tracker classes and helpers. They are defined in
tasktrain/loggers/trackers.py, over the same back-ends as the Trainer's loggers."""
from tasktrain.loggers.trackers import (CSVTracker, GeneralTracker, LoggerType, MLflowTracker, TensorBoardTracker,
                                        WandBTracker, available_trackers, check_log_with, make_trackers)

get_available_trackers = available_trackers
filter_trackers = check_log_with

__all__ = ["GeneralTracker", "TensorBoardTracker", "WandBTracker", "MLflowTracker", "CSVTracker", "LoggerType",
           "get_available_trackers", "filter_trackers", "make_trackers", "check_log_with", "available_trackers"]
