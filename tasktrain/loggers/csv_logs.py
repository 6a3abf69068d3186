"""CSVLogger: metrics.csv and hparams.yaml under save_dir/name/version_N; ExperimentWriter: the writer of one such
folder (Lightning's `lightning.pytorch.loggers.csv_logs.ExperimentWriter`, what `CSVLogger.experiment` is)."""
import csv
import os
import warnings
from pathlib import Path
from typing import Optional, Union

from tasktrain.loggers import utilities as files
from tasktrain.loggers.logger import VersionedLogger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers.utilities import add_prefix, convert_params, scalar, write_hparams_yaml


class ExperimentWriter:
    """The metrics and hyper-parameters of one version folder, as Lightning's writer keeps them: `log_metrics` buffers
    a row (`metrics`, the step among its columns), `save()` writes the buffered rows to metrics.csv (`metrics_keys`: the
    file's columns, sorted; a new column rewrites the file with it), `log_hparams` writes hparams.yaml at once.
    Created on a folder that already holds files, it warns and removes that folder's metrics.csv (Lightning's rule)."""

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        self.hparams = {}
        self.metrics = []  # the rows not written yet
        self.metrics_keys = []  # the columns of the file on disk
        self._file = None
        self._check_log_dir_exists()
        files.makedirs(log_dir)

    def _check_log_dir_exists(self):
        """Lightning's (its writer's method of this name): a folder that already holds files is warned about and its
        metrics.csv removed, so the new run's rows do not follow an old run's. (A file system URL goes through
        fsspec: loggers/utilities.py.)"""
        if files.isdir(self.log_dir) and files.listdir(self.log_dir):
            warnings.warn(f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files "
                          "in this directory will be deleted when the new ones are saved!")
            if files.isfile(self.metrics_file_path):
                files.remove(self.metrics_file_path)

    def log_metrics(self, metrics_dict, step=None):
        if step is None:  # Lightning's: the row's place among the rows not saved yet
            step = len(self.metrics)
        row = {k: scalar(v) for k, v in metrics_dict.items()}
        row["step"] = step
        self.metrics.append(row)

    def log_hparams(self, params):
        self.hparams.update(params)
        write_hparams_yaml(self.hparams, os.path.join(self.log_dir, self.NAME_HPARAMS_FILE))

    def save(self):
        """Write the buffered rows: append when no column is new, else rewrite the file with the new header."""
        if not self.metrics:
            return
        rows, self.metrics = self.metrics, []
        path = self.metrics_file_path
        new = {k for row in rows for k in row} - set(self.metrics_keys)
        exists = files.isfile(path)
        if new:
            self.metrics_keys = sorted([*self.metrics_keys, *new])
        if exists and not new and files.remote_fs(path) is None:
            # the file stays open between saves (the Trainer saves after each write: an open per save would cost
            # ~0.3 ms); flushed, so a reader sees each row once save() returns
            if self._file is None or self._file.closed:
                self._file = open(path, "a", newline="")
            csv.DictWriter(self._file, fieldnames=self.metrics_keys).writerows(rows)
            self._file.flush()
            return
        self.close()
        old = []
        if exists:
            with files.open_file(path, newline="") as f:
                old = list(csv.DictReader(f))
        files.makedirs(self.log_dir)
        if files.remote_fs(path) is not None:  # a file system URL: the whole file written again (no append there)
            with files.open_file(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(old)
                writer.writerows(rows)
            return
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(old)
            writer.writerows(rows)
        os.replace(tmp, path)

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None  # an open file cannot travel to another process (ddp_spawn)
        return state


class CSVLogger(VersionedLogger):
    """Metrics as save_dir/name/version_N/metrics.csv and the hyper-parameters as hparams.yaml next to it, in
    Lightning's layout: one row per `log_metrics` call, the columns sorted by name (`step` among them); a metric
    that appears after the file was started adds a column (the file is rewritten with it, old rows left blank).

    Rows are buffered and written on `save()`, which the Trainer calls after each of its writes (as Lightning's
    logger connector does), when `(step + 1) % flush_logs_every_n_steps == 0` for a direct `log_metrics` call (a
    step of None is the row's place among the unsaved rows, Lightning's), and when the run ends. The first write into
    a version folder that already holds files warns, and a metrics.csv there is replaced (Lightning's rule). `prefix`
    is put before every metric name, joined with "-". `experiment` is the folder's ExperimentWriter on global rank 0
    (log_metrics, log_hparams, save, metrics, metrics_keys, metrics_file_path, hparams), a do-nothing stand-in
    elsewhere. Writes happen on global rank 0.
    """

    NAME_METRICS = NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(
        self,
        save_dir: Union[str, Path],
        name: Optional[str] = "lightning_logs",
        version: Optional[Union[int, str]] = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ):
        super().__init__(save_dir, name, version, prefix)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self._experiment = None

    @property
    @rank_zero_experiment
    def experiment(self):  # (a do-nothing stand-in on the other ranks, as Lightning's)
        if self._experiment is None:
            self._experiment = ExperimentWriter(self.log_dir)
        return self._experiment

    @property
    def metrics_file_path(self):
        return os.path.join(self.log_dir, self.NAME_METRICS)

    @property
    def metrics(self):  # (the writer's unsaved rows; none before anything was logged)
        return self._experiment.metrics if self._experiment is not None else []

    @property
    def hparams(self):
        return self._experiment.hparams if self._experiment is not None else {}

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        if step is None:
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR), step)
        if (step + 1) % self.flush_logs_every_n_steps == 0:
            self.save()

    @rank_zero_method
    def log_hyperparams(self, params=None):
        self.experiment.log_hparams(convert_params(params))

    @rank_zero_method
    def save(self):
        if self._experiment is not None:
            self._experiment.save()

    @rank_zero_method
    def finalize(self, status):
        if self._experiment is not None:
            self._experiment.save()
            self._experiment.close()
