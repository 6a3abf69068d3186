"""The logger base class and what the back-ends share.

`Logger` itself lives in tasktrain/callbacks/base.py (tasktrain's loggers are callbacks: the Trainer sorts them
first and gives them the flushed metrics; any other object with Lightning's Logger methods is a logger too); this
module is its Lightning-style address, `tasktrain.loggers.logger.Logger`.
"""
import functools
import os

from tasktrain.callbacks.base import Logger

__all__ = ["Logger", "DummyLogger", "DummyExperiment", "rank_zero_experiment"]


class DummyExperiment:
    """What `logger.experiment` is on ranks other than 0: every method exists and does nothing, so user code
    such as `self.logger.experiment.add_image(...)` runs on every rank and writes on rank 0 only."""

    def nop(self, *args, **kwargs):
        return None

    def __getattr__(self, name):
        return self.nop

    def __getitem__(self, index):
        return self

    def __setitem__(self, *args):
        pass


class DummyLogger(Logger):
    """A logger that logs nothing, for a run that must not write (fast_dev_run, the tuner's trials) while the user's
    code that uses `self.logger` still runs: `experiment` is a DummyExperiment, every other method exists and does
    nothing, and `name` and `version` are empty."""

    def __init__(self):
        super().__init__()
        self._experiment = DummyExperiment()

    @property
    def experiment(self):
        return self._experiment

    def log_metrics(self, *args, **kwargs):
        pass

    def log_hyperparams(self, *args, **kwargs):
        pass

    @property
    def name(self):
        return ""

    @property
    def version(self):
        return ""

    def __getitem__(self, index):  # self.logger[0].experiment.add_image(...)
        return self

    def __getattr__(self, name):
        if name.startswith("__"):  # copy / pickle probes get AttributeError, not a no-op
            raise AttributeError(name)

        def method(*args, **kwargs):
            return None

        return method


def rank_zero_experiment(fn):
    """For an `experiment` property: the real object on global rank 0, a DummyExperiment elsewhere."""

    @functools.wraps(fn)
    def experiment(self):
        if not self._is_global_zero():
            return DummyExperiment()
        return fn(self)

    return experiment


def rank_zero_method(fn):
    """For a logger method that writes: it runs on global rank 0 only and returns None elsewhere."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        if not self._is_global_zero():
            return None
        return fn(self, *args, **kwargs)

    return method


def next_version(root):
    """The next free N of root/version_N (0 when there is none)."""
    from tasktrain.loggers import utilities as files

    if not files.isdir(root):
        return 0
    versions = [int(d.split("_", 1)[1]) for d in files.listdir(root)
                if d.startswith("version_") and d.split("_", 1)[1].isdigit()]
    return max(versions) + 1 if versions else 0


class VersionedLogger(Logger):
    """A logger that writes under save_dir/name/version_N (the next free N unless `version` is given; a string
    version is the folder's name as it is). The version is chosen by rank 0 and shared with every rank at setup,
    so checkpoints of all ranks go under the same folder."""

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, save_dir, name, version, prefix=""):
        from tasktrain.checkpoint_io import local_path
        from tasktrain.loggers.utilities import remote_fs

        save_dir = local_path(save_dir)  # a file:// URL is the local folder
        remote_fs(save_dir)  # a file system URL ("s3://...") is written through fsspec, as Lightning's: needs it
        self._save_dir = save_dir
        self._name = name or ""
        self._version = version
        self._prefix = prefix

    @property
    def save_dir(self):
        return self._save_dir

    @property
    def name(self):
        return self._name

    @property
    def root_dir(self):  # self.name: a subclass that overrides `name` gets its folder (Lightning's rule)
        return os.path.join(self._save_dir, self.name) if self.name else self._save_dir

    @property
    def version(self):
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self):
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.expanduser(os.path.expandvars(os.path.join(self.root_dir, version)))

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        self._version = trainer.strategy.broadcast(self.version)

    @property
    def state_key(self):
        return self._generate_state_key(save_dir=self._save_dir, name=self._name)
