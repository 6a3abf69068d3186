"""Loggers are callbacks that receive flushed metrics. They write on rank 0 only."""
import os

from tasktrain.callbacks.base import Logger


def _next_version(root):
    if not os.path.isdir(root):
        return 0
    versions = [int(d.split("_", 1)[1]) for d in os.listdir(root)
                if d.startswith("version_") and d.split("_", 1)[1].isdigit()]
    return max(versions) + 1 if versions else 0


class _VersionedLogger(Logger):
    def __init__(self, save_dir, name, version):
        self.save_dir = os.fspath(save_dir)
        self.name = name or ""
        self._version = version

    @property
    def root_dir(self):
        return os.path.join(self.save_dir, self.name)

    @property
    def version(self):
        if self._version is None:
            self._version = _next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self):
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.root_dir, version)

    def setup(self, trainer, module, stage):
        # Every rank must agree on the version rank 0 picked (and checkpoints go under it).
        self._version = trainer.strategy.broadcast(self.version)

    @property
    def state_key(self):
        return self._generate_state_key(save_dir=self.save_dir, name=self.name)


class TensorBoardLogger(_VersionedLogger):
    """Scalars, epoch metrics and hyper-parameters as TensorBoard event files under save_dir/name/version_N."""

    def __init__(self, save_dir, name="tasktrain_logs", version=None, flush_secs=30):
        super().__init__(save_dir, name, version)
        self.flush_secs = flush_secs
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when a log is written

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(log_dir=self.log_dir, flush_secs=self.flush_secs)
        return self._writer

    def log_metrics(self, metrics, step):
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def log_hyperparams(self, params):
        _write_yaml(params, os.path.join(self.log_dir, "hparams.yaml"))
        if not params:
            return
        from torch.utils.tensorboard.summary import hparams

        # TensorBoard's HPARAMS tab takes numbers, strings and booleans; anything else is shown as its text.
        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in params.items()}
        experiment, session_start, session_end = hparams(clean, {})
        writer = self.writer.file_writer
        for summary in (experiment, session_start, session_end):
            writer.add_summary(summary)

    def save(self):
        """Push buffered events to disk now (the writer also does so every flush_secs)."""
        if self._writer is not None:
            self._writer.flush()

    def finalize(self):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _write_yaml(params, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not params:
        with open(path, "w") as f:  # the common case needs no yaml import (~30 ms before the first step)
            f.write("{}\n")
        return
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump(_plain(dict(params)), f)


def _plain(value):
    """What yaml.safe_dump takes: plain containers and scalars; anything else as its repr."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return repr(value)


class CSVLogger(_VersionedLogger):
    """Metrics as save_dir/name/version_N/metrics.csv (one row per write: step, then one column per metric)
    and the hyper-parameters as hparams.yaml next to it.

    Rows are buffered and written every `flush_logs_every_n_steps` steps and when the run ends. A metric that
    appears after the file was started adds a column: the file is then rewritten with it, old rows left blank.
    """

    NAME_METRICS = "metrics.csv"

    def __init__(self, save_dir, name="tasktrain_logs", version=None, flush_logs_every_n_steps=100):
        super().__init__(save_dir, name, version)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self._rows = []
        self._columns = []  # the columns of the file on disk
        self._last_flush_step = None

    @property
    def metrics_file_path(self):
        return os.path.join(self.log_dir, self.NAME_METRICS)

    def log_metrics(self, metrics, step):
        last = self._rows[-1] if self._rows else None
        if last is not None and last["step"] == step and all(last.get(k, v) == v for k, v in metrics.items()):
            last.update(metrics)  # one row per step where the writes agree (step metrics, then lr, epoch values)
        else:
            self._rows.append({"step": step, **metrics})
        if self._last_flush_step is None:
            self._last_flush_step = step
        if step - self._last_flush_step >= self.flush_logs_every_n_steps:
            self.save()

    def log_hyperparams(self, params):
        _write_yaml(params, os.path.join(self.log_dir, "hparams.yaml"))

    def save(self):
        """Write the buffered rows: append when the columns are unchanged, else rewrite the whole file."""
        import csv

        if not self._rows:
            return
        rows, self._rows = self._rows, []
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

    def finalize(self):
        self.save()
