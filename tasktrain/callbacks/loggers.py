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
        if not params:
            return
        from torch.utils.tensorboard.summary import hparams

        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in params.items()}
        experiment, session_start, session_end = hparams(clean, {})
        writer = self.writer.file_writer
        for summary in (experiment, session_start, session_end):
            writer.add_summary(summary)
        _write_yaml(params, os.path.join(self.log_dir, "hparams.yaml"))

    def finalize(self):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _write_yaml(params, path):
    import yaml

    os.makedirs(os.path.dirname(path), exist_ok=True)
    plain = {k: v if isinstance(v, (int, float, str, bool, list, dict, type(None))) else str(v) for k, v in params.items()}
    with open(path, "w") as f:
        yaml.safe_dump(plain, f)
