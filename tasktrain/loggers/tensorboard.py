"""TensorBoardLogger: TensorBoard event files under save_dir/name/version_N (torch's SummaryWriter)."""
import importlib.util
import os
import warnings
from pathlib import Path
from typing import Optional, Union

from tasktrain.loggers.logger import VersionedLogger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers import utilities as files
from tasktrain.loggers.utilities import (add_prefix, convert_params, flatten_dict, scalar, write_hparams_yaml)

# Lightning's name for "the tensorboard package is installed" (scripts and tests import it from here to skip without
# it); torch's SummaryWriter, which this logger writes with, needs that package
class _TensorBoardInstalled:
    """Truthy when the tensorboard package is installed (asked at each use); str() words it as Lightning's flag (a
    RequirementCache) does. (The core does not import the Lightning layer's RequirementCache: tests/test_layers.py.)"""

    def __bool__(self):
        return importlib.util.find_spec("tensorboard") is not None

    def __str__(self):
        if self:
            return "Requirement 'tensorboard' met"
        return "Requirement 'tensorboard' not met. HINT: Try running `pip install -U 'tensorboard'`"

    __repr__ = __str__


_TENSORBOARD_AVAILABLE = _TensorBoardInstalled()


class TensorBoardLogger(VersionedLogger):
    """Scalars, epoch metrics and hyper-parameters as TensorBoard event files (`tensorboard --logdir save_dir`).

    Args:
        save_dir: the folder that holds every experiment.
        name: the experiment's folder under save_dir ("" for none).
        version: the run's folder: None for the next free version_N, an int N for version_N, a string as is.
        log_graph: trace the module once at the start of fit (`add_graph`); needs `module.example_input_array`
            (or pass input_array to log_graph). Not with FSDP or ZeRO-3: rank 0 alone cannot run a sharded forward.
        default_hp_metric: log_hyperparams without metrics also writes `hp_metric` = -1, so TensorBoard's HPARAMS
            tab lists the run.
        prefix: put before every metric name, joined with "-".
        sub_dir: a folder under the version folder for the event files.
        **kwargs: SummaryWriter's arguments (flush_secs defaults to 30, max_queue, filename_suffix, ...).
    The SummaryWriter is created on the first write, on global rank 0 only (`experiment` is a do-nothing
    stand-in on the other ranks).
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(
        self,
        save_dir: Union[str, Path],
        name: Optional[str] = "lightning_logs",
        version: Optional[Union[int, str]] = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: Optional[Union[str, Path]] = None,
        **kwargs,
    ):
        super().__init__(save_dir, name, version, prefix)
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        kwargs.setdefault("flush_secs", 30)
        self._writer_kwargs = kwargs
        self._experiment = None
        self.hparams = {}

    @property
    def sub_dir(self):
        return self._sub_dir

    @property
    def log_dir(self):
        log_dir = super().log_dir
        return os.path.join(log_dir, self._sub_dir) if self._sub_dir else log_dir

    @property
    def flush_secs(self):
        return self._writer_kwargs["flush_secs"]

    @property
    @rank_zero_experiment
    def experiment(self):
        """torch.utils.tensorboard.SummaryWriter (created on first use: importing tensorboard costs ~0.5 s)."""
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            files.makedirs(self.log_dir)  # (a file system URL: tensorboard writes it through fsspec)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._experiment

    writer = experiment  # the name this logger had before `experiment`

    @rank_zero_method
    def log_metrics(self, metrics, step=None, **kwargs):
        """Numbers (tensors of one element too) with add_scalar, dicts of numbers with add_scalars; kwargs
        (walltime, ...) go to those methods."""
        writer = self.experiment
        for name, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, dict):
                writer.add_scalars(name, {k: scalar(v) for k, v in value.items()}, step, **kwargs)
                continue
            value = scalar(value)
            if not isinstance(value, (int, float)):
                raise ValueError(f"TensorBoardLogger.log_metrics: {name}={value!r} is not a number (or a dict of "
                                 "numbers, written with add_scalars). Write text with logger.experiment.add_text.")
            writer.add_scalar(name, value, step, **kwargs)

    @rank_zero_method
    def log_hyperparams(self, params, metrics=None, step=None):
        """Write params to hparams.yaml and to TensorBoard's HPARAMS tab. `metrics` (a dict or one number, as
        hp_metric) are written with them; with none, hp_metric = -1 when default_hp_metric is on."""
        params = convert_params(params)
        self.hparams.update(params)
        write_hparams_yaml(self.hparams, os.path.join(self.log_dir, self.NAME_HPARAMS_FILE))
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else {}
        elif not isinstance(metrics, dict):
            metrics = {"hp_metric": metrics}
        if not params and not metrics:
            return
        from torch.utils.tensorboard.summary import hparams

        # The HPARAMS tab takes numbers, strings and booleans; anything else is shown as its text.
        flat = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten_dict(params).items()}
        if metrics:
            self.log_metrics(metrics, step)
        experiment, session_start, session_end = hparams(flat, {k: scalar(v) for k, v in metrics.items()})
        writer = self.experiment.file_writer
        for summary in (experiment, session_start, session_end):
            writer.add_summary(summary, step)

    @rank_zero_method
    def log_graph(self, model, input_array=None):
        if not self._log_graph:
            return
        import torch

        input_array = getattr(model, "example_input_array", None) if input_array is None else input_array
        if input_array is None:  # Lightning's warnings, in its words
            warnings.warn("Could not log computational graph to TensorBoard: The `model.example_input_array` "
                          "attribute is not set or `input_array` was not given.")
            return
        if not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn("Could not log computational graph to TensorBoard: The `input_array` or "
                          f"`model.example_input_array` has type {type(input_array)} which can't be traced by "
                          "TensorBoard. Make the input array a tuple representing the positional arguments to the "
                          "model's `forward()` implementation.")
            return
        param = next(model.parameters(), None)
        if hasattr(model, "transfer_batch_to_device") and param is not None:  # a TaskModule: its batch hooks
            input_array = model.on_before_batch_transfer(input_array, 0)
            input_array = model.transfer_batch_to_device(input_array, param.device, 0)
            input_array = model.on_after_batch_transfer(input_array, 0)
        elif param is not None:
            move = (lambda t: t.to(param.device) if isinstance(t, torch.Tensor) else t)
            input_array = tuple(map(move, input_array)) if isinstance(input_array, tuple) else move(input_array)
        # the trace probes every attribute, `module.trainer` too, which may be unattached here (Lightning's flag)
        from tasktrain.trainer.module import jit_is_scripting

        with jit_is_scripting():
            self.experiment.add_graph(model, input_array)

    @rank_zero_method
    def save(self):
        """Push buffered events to disk now (the writer also does so every flush_secs); hparams.yaml is written
        when the folder has none (Lightning's: a run without hyper-parameters gets an empty one). Lightning's
        save() also creates the SummaryWriter; here it waits for the first event (importing tensorboard costs
        ~0.5 s before the first step)."""
        if self._experiment is not None:
            self._experiment.flush()
        path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if not files.isfile(path):
            write_hparams_yaml(self.hparams, path)

    @rank_zero_method
    def finalize(self, status):
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None
        # Lightning's finalize saves on success: an hparams.yaml ({} without hyper-parameters) in a log folder that
        # has none (seen with Trainer(enable_autolog_hparams=False)); no folder is created for it
        path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if status == "success" and files.isdir(self.log_dir) and not files.isfile(path):
            write_hparams_yaml(self.hparams, path)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_experiment"] = None  # an open writer cannot travel to another process (ddp_spawn)
        return state
