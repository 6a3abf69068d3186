"""CSVLogger: metrics.csv and hparams.yaml under save_dir/name/version_N."""
import csv
import os

from tasktrain.loggers.logger import VersionedLogger, rank_zero_method
from tasktrain.loggers.utilities import add_prefix, convert_params, scalar, write_hparams_yaml


class CSVLogger(VersionedLogger):
    """Metrics as save_dir/name/version_N/metrics.csv (a `step` column, then one column per metric; the values
    written at the same step share a row) and the hyper-parameters as hparams.yaml next to it.

    Rows are buffered and written every `flush_logs_every_n_steps` steps, on `save()` and when the run ends. A
    metric that appears after the file was started adds a column: the file is then rewritten with it, old rows
    left blank. `prefix` is put before every metric name, joined with "-". `experiment` is the logger itself
    (it has log_metrics, save and metrics_file_path). Writes happen on global rank 0 only.
    """

    NAME_METRICS = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir, name="lightning_logs", version=None, prefix="", flush_logs_every_n_steps=100):
        super().__init__(save_dir, name, version, prefix)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self.hparams = {}
        self._rows = []
        self._columns = []  # the columns of the file on disk
        self._last_flush_step = None
        self._written_rows = 0

    @property
    def experiment(self):
        return self

    @property
    def metrics_file_path(self):
        return os.path.join(self.log_dir, self.NAME_METRICS)

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        if step is None:  # as Lightning: the row's number
            step = self._written_rows + len(self._rows)
        metrics = {k: scalar(v) for k, v in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items()}
        last = self._rows[-1] if self._rows else None
        if last is not None and last["step"] == step and all(last.get(k, v) == v for k, v in metrics.items()):
            last.update(metrics)  # one row per step where the writes agree (step metrics, then lr, epoch values)
        else:
            self._rows.append({"step": step, **metrics})
        if self._last_flush_step is None:
            self._last_flush_step = step
        if step - self._last_flush_step >= self.flush_logs_every_n_steps:
            self.save()

    @rank_zero_method
    def log_hyperparams(self, params):
        self.hparams.update(convert_params(params))
        write_hparams_yaml(self.hparams, os.path.join(self.log_dir, self.NAME_HPARAMS_FILE))

    @rank_zero_method
    def save(self):
        """Write the buffered rows: append when the columns are unchanged, else rewrite the whole file."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        self._written_rows += len(rows)
        self._last_flush_step = rows[-1]["step"]
        path = self.metrics_file_path
        if not self._columns and os.path.exists(path):
            # an explicit version that already has a file (a resumed run): continue it
            with open(path, newline="") as f:
                self._columns = next(csv.reader(f), [])
        on_disk = os.path.exists(path) and bool(self._columns)
        new = [k for row in rows for k in row if k not in self._columns]
        if on_disk and not new:
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerows(rows)
            return
        old = []
        if on_disk:
            with open(path, newline="") as f:
                old = list(csv.DictReader(f))
        columns = list(dict.fromkeys(["step", *self._columns, *new]))
        os.makedirs(self.log_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(old)
            writer.writerows(rows)
        os.replace(tmp, path)
        self._columns = columns

    @rank_zero_method
    def finalize(self, status="success"):
        self.save()
