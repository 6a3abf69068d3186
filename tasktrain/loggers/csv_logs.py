"""CSVLogger: metrics.csv and hparams.yaml under save_dir/name/version_N."""
import csv
import os
import warnings

from tasktrain.loggers import utilities as files
from tasktrain.loggers.logger import VersionedLogger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers.utilities import add_prefix, convert_params, scalar, write_hparams_yaml


class CSVLogger(VersionedLogger):
    """Metrics as save_dir/name/version_N/metrics.csv and the hyper-parameters as hparams.yaml next to it, in
    Lightning's layout: one row per `log_metrics` call, the columns sorted by name (`step` among them); a metric
    that appears after the file was started adds a column (the file is rewritten with it, old rows left blank).

    Rows are buffered and written on `save()`, which the Trainer calls after each of its writes (as Lightning's
    logger connector does), when `(step + 1) % flush_logs_every_n_steps == 0` for a direct `log_metrics` call, and
    when the run ends. The first write into a version folder that already holds files warns, and a metrics.csv
    there is replaced (Lightning's rule). `prefix` is put before every metric name, joined with "-". `experiment`
    is the logger itself on global rank 0 (it has log_metrics, save, metrics, metrics_file_path), a do-nothing
    stand-in elsewhere. Writes happen on global rank 0.
    """

    NAME_METRICS = NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir, name="lightning_logs", version=None, prefix="", flush_logs_every_n_steps=100):
        super().__init__(save_dir, name, version, prefix)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self.hparams = {}
        self.metrics = []  # the rows not written yet (Lightning's experiment.metrics)
        self.metrics_keys = []  # the columns of the file on disk
        self._rows_logged = 0
        self._file = None
        self._started = False

    @property
    @rank_zero_experiment
    def experiment(self):  # (a do-nothing stand-in on the other ranks, as Lightning's)
        self._start()
        return self

    @property
    def metrics_file_path(self):
        return os.path.join(self.log_dir, self.NAME_METRICS)

    def _start(self):
        """Lightning's check when its writer is created: a version folder with files in it is written over."""
        if self._started or not self._is_global_zero():
            return
        self._started = True
        if files.isdir(self.log_dir) and files.listdir(self.log_dir):
            warnings.warn(f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files "
                          "in this directory will be deleted when the new ones are saved!")
            if files.isfile(self.metrics_file_path):
                files.remove(self.metrics_file_path)
        files.makedirs(self.log_dir)

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        self._start()
        if step is None:  # the row's number (Lightning's counts the rows since its last save, restarting at 0)
            step = self._rows_logged
        self._rows_logged += 1
        row = {k: scalar(v) for k, v in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items()}
        row["step"] = step
        self.metrics.append(row)
        if (step + 1) % self.flush_logs_every_n_steps == 0:
            self.save()

    @rank_zero_method
    def log_hyperparams(self, params=None):
        self._start()
        self.hparams.update(convert_params(params))
        write_hparams_yaml(self.hparams, os.path.join(self.log_dir, self.NAME_HPARAMS_FILE))

    @rank_zero_method
    def save(self):
        """Write the buffered rows: append when no column is new, else rewrite the file with the new header."""
        if not self.metrics:
            return
        self._start()
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
        self._close()
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

    def _close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    @rank_zero_method
    def finalize(self, status="success"):
        self.save()
        self._close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None  # an open file cannot travel to another process (ddp_spawn)
        return state
