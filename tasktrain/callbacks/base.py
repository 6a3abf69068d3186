"""Callback: everything that reacts to the loop's events.

Every event receives (trainer, module, ...). The module's own hook of the same name (without the two first
arguments) fires first, then the callbacks in list order; the Trainer sorts loggers first and ModelCheckpoint
last. A callback that does not override an event costs nothing on it: the Trainer builds, once per run, the
list of overriders of each event. The full firing order is in docs/callbacks.md.

Callbacks ask the loop for things through the trainer (`trainer.should_stop = True`: the loop stops at the end
of the current optimizer step, or after the epoch when set at its end) and carry their own state in
checkpoints under `state_key`.
"""

from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

if TYPE_CHECKING:
    from tasktrain.trainer.module import STEP_OUTPUT, TaskModule
    from tasktrain.trainer.trainer import Trainer

EVENTS = (
    "setup", "teardown",
    "on_fit_start", "on_fit_end",
    "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end",
    "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end",
    "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end",
    "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad",
    "on_save_checkpoint", "on_load_checkpoint",
    "on_exception",
)


class Callback:
    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint; include what tells two instances apart."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A key from the class name and the settings that tell instances apart (e.g. monitor and mode)."""
        return f"{type(self).__qualname__}{repr(dict(sorted(kwargs.items())))}"

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    # Lightning's hooks with Lightning's annotations (the types named as strings: no import cycle)
    def setup(self, trainer: "Trainer", pl_module: "TaskModule", stage: str) -> None: ...
    def teardown(self, trainer: "Trainer", pl_module: "TaskModule", stage: str) -> None: ...
    def on_fit_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_fit_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_sanity_check_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_sanity_check_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_train_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_train_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_train_epoch_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_train_epoch_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_train_batch_start(self, trainer: "Trainer", pl_module: "TaskModule", batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, trainer: "Trainer", pl_module: "TaskModule", outputs: "STEP_OUTPUT", batch: Any,
                           batch_idx: int) -> None: ...
    def on_validation_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_validation_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_validation_epoch_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_validation_epoch_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_validation_batch_start(self, trainer: "Trainer", pl_module: "TaskModule", batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, trainer: "Trainer", pl_module: "TaskModule", outputs: "STEP_OUTPUT", batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_test_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_test_epoch_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_test_epoch_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_test_batch_start(self, trainer: "Trainer", pl_module: "TaskModule", batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, trainer: "Trainer", pl_module: "TaskModule", outputs: "STEP_OUTPUT", batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_predict_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_predict_epoch_start(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_predict_epoch_end(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_predict_batch_start(self, trainer: "Trainer", pl_module: "TaskModule", batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, trainer: "Trainer", pl_module: "TaskModule", outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_before_backward(self, trainer: "Trainer", pl_module: "TaskModule", loss: Tensor) -> None: ...
    def on_after_backward(self, trainer: "Trainer", pl_module: "TaskModule") -> None: ...
    def on_before_optimizer_step(self, trainer: "Trainer", pl_module: "TaskModule", optimizer: Optimizer) -> None: ...
    def on_before_zero_grad(self, trainer: "Trainer", pl_module: "TaskModule", optimizer: Optimizer) -> None: ...
    def on_save_checkpoint(self, trainer: "Trainer", pl_module: "TaskModule", checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: "Trainer", pl_module: "TaskModule", checkpoint: dict[str, Any]) -> None: ...
    def on_exception(self, trainer: "Trainer", pl_module: "TaskModule", exception: BaseException) -> None: ...


class Checkpoint(Callback):
    """The base of the checkpointing callbacks (ModelCheckpoint, OnExceptionCheckpoint), as Lightning's: the Trainer
    counts every Checkpoint as checkpointing. `trainer.checkpoint_callbacks` lists them (`checkpoint_callback` is the
    first), they run after the other callbacks, with EarlyStopping at the end of a training epoch, and
    `Trainer(enable_checkpointing=False)` refuses them. Subclass it so that the Trainer treats a checkpointing
    callback of your own the same way."""


class Logger(Callback):
    """tasktrain's logger base class: a callback that also receives the flushed metrics (floats) and the
    hyper-parameters. (Any object with these methods is a logger too, as in Lightning: it is called the same way,
    without the callback hooks.)

    The Trainer calls, on every rank as Lightning does: `log_hyperparams(params)`, `log_graph(module)` and `save()`
    at the start of every run; `log_metrics(metrics, step)` and `save()` at each write; `finalize(status)` at the
    end of every run ("success" or "failed"); and on global rank 0 `after_save_checkpoint(checkpoint_callback)`
    after each file a ModelCheckpoint writes. tasktrain's back-ends (TensorBoard, CSV, Weights & Biases, MLflow, in
    `tasktrain.loggers`) act on global rank 0 only; a subclass that writes guards itself (`rank_zero_only`).

    `name`, `version`, `save_dir`, `root_dir` and `log_dir` are None here; a logger sets or overrides the ones
    it has (plain attributes or properties). `trainer.log_dir` is, as in Lightning, a TensorBoardLogger's or
    CSVLogger's `log_dir` and any other first logger's `save_dir`.
    """

    name = None
    version = None
    save_dir = None  # where the logger writes locally, None when it writes nowhere on this machine
    root_dir = None  # the folder that holds every version of the experiment
    log_dir = None  # this version's folder
    group_separator = "/"
    _global_rank = None  # set at setup; before it, what the launcher says

    @property
    def experiment(self):
        """The underlying object (SummaryWriter, wandb run, MlflowClient), for what the logger has no method for."""
        return None

    def setup(self, trainer, pl_module, stage):
        self._global_rank = trainer.global_rank

    def _is_global_zero(self) -> bool:
        rank = self._global_rank
        if rank is None:  # not set up by a Trainer yet: the launcher's variables (not cached: a pickled logger moves)
            from tasktrain.strategies.environment import detect_environment

            rank = detect_environment().global_rank
        return rank == 0

    def log_metrics(self, metrics: dict, step: int = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define log_metrics(self, metrics, step).")

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_graph(self, model, input_array=None) -> None:
        pass

    def save(self) -> None:
        """Write what is buffered."""

    def finalize(self, status: str) -> None:
        """The run ended, with status "success" or "failed"."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        """A ModelCheckpoint saved (rank 0): loggers that upload checkpoints (log_model) look at it here."""
