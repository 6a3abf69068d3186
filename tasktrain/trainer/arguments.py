"""The Trainer's arguments: checks, Lightning's refusals, fast_dev_run's rewrites, global torch flags and the
callbacks it adds. Plain functions called by Trainer.__init__, each for one concern."""
import ast
import functools
import inspect
import logging
import os
import platform
import warnings

import torch

from tasktrain.callbacks.base import Logger
from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning
from tasktrain.strategies.environment import launcher_rank
from tasktrain.trainer import guards

_log = logging.getLogger("tasktrain")


def defaults_from_env(init):
    """Lightning's environment defaults (its `_defaults_from_env_vars` on Trainer.__init__): an argument not passed
    is read from `PL_<CLASS>_<ARGUMENT>` (`PL_TRAINER_MAX_STEPS=7`; a subclass's name for a subclass), its value
    through `ast.literal_eval` where it is a Python literal ("False", "2", "[0, 1]"), else the string ("cpu"); an
    empty value counts as unset. An argument passed wins over the environment."""
    @functools.wraps(init)
    def insert_env_defaults(self, *args, **kwargs):
        cls = type(self)
        names = inspect.signature(cls).parameters
        if args:  # (a subclass's positional arguments, named by its signature, as Lightning's)
            kwargs.update(zip(names, args))
        env = {}
        for name in names:
            value = os.environ.get(f"PL_{cls.__name__.upper()}_{name.upper()}")
            if value:
                try:
                    value = ast.literal_eval(value)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    pass  # not a literal: the string itself
                env[name] = value
        return init(self, **{**env, **kwargs})

    return insert_env_defaults


def _rank():
    """This process's global rank as Lightning's rank_zero_only.rank reads it at this point: the strategy's, once the
    Trainer's plugins told it (under mpiexec MPI's rank, which sets no RANK), else the launcher's variables."""
    from tasktrain.trainer.runtime import known_rank

    return known_rank(launcher_rank())


def _info(message):
    """logging.info on global rank 0 only (Lightning's rank_zero_info)."""
    if _rank() == 0:
        _log.info(message)


def log_device_info(strategy, given_precision_plugin):
    """Lightning's notes at a Trainer's construction (rank 0, INFO on the "tasktrain" logger as rank_zero_info):
    the mixed-precision line its accelerator connector writes where it builds its own AMP plugin (not under DeepSpeed
    or FSDP, whose plugins are the engine's, nor for a plugin passed in), then its device lines (tasktrain runs on no
    TPU) and its PossibleUserWarning where a GPU is there but the strategy runs on the CPU. tasktrain's own
    resolved-config line is printed at the first run's start (trainer.py)."""
    from tasktrain.strategies.precision import MixedPrecision

    precision = strategy.precision
    if given_precision_plugin is None and type(precision) is MixedPrecision:
        _info(f"Using {'16bit' if precision.precision == '16-mixed' else 'bfloat16'} Automatic Mixed Precision (AMP)")
    # Lightning's probes: CUDA devices counted, MPS only on an ARM processor and not DISABLE_MPS=1 (its
    # MPSAccelerator.is_available)
    cuda = torch.cuda.is_available()
    mps = (os.getenv("DISABLE_MPS", "0") != "1" and torch.backends.mps.is_available()
           and platform.processor() in ("arm", "arm64"))
    available = "True (cuda)" if cuda else "True (mps)" if mps else "False"
    device = strategy.root_device.type
    _info(f"GPU available: {available}, used: {device in ('cuda', 'mps')}")
    _info("TPU available: False, using: 0 TPU cores")
    if cuda and device != "cuda" or mps and device != "mps":
        if _rank() == 0:  # (Lightning's rank_zero_warn, its words)
            warnings.warn("GPU available but not used. You can set it by doing `Trainer(accelerator='gpu')`.",
                          PossibleUserWarning, stacklevel=3)


def litmodels_installed():
    """Whether Lightning would hand a model registry name to the `litmodels` package (its RequirementCache
    "litmodels >=0.1.7"; any installed litmodels is taken as one here)."""
    import importlib.util

    return importlib.util.find_spec("litmodels") is not None


def no_model_registry(what):
    """The error for a model registry name where litmodels is installed: Lightning's Trainer then builds litmodels'
    LitModelCheckpoint, which uploads each checkpoint to Lightning AI's registry and is written for Lightning's own
    Trainer. tasktrain cannot run it: refuse rather than let a user believe the checkpoints were uploaded."""
    return ValueError(
        f"{what}: the `litmodels` package is installed, and with it Lightning uploads the checkpoints to Lightning "
        "AI's model registry through litmodels' LitModelCheckpoint, which is written for Lightning's Trainer; tasktrain "
        "has no model registry client. Remove the name (ModelCheckpoint saves the files locally: default_root_dir, or "
        "ModelCheckpoint(dirpath=...)) and upload those files with litmodels afterwards, or uninstall litmodels to "
        "have Lightning's behaviour without it (the name is kept, the checkpoints are saved locally).")


def model_registry_name(model_registry):
    """Lightning's `trainer._model_registry`: the name without its version ("my-model:v2" -> "my-model"); None for
    None or "". Without litmodels Lightning keeps the name and saves locally (its default ModelCheckpoint, with a tip
    about installing litmodels): so does tasktrain. With litmodels installed it is refused (no_model_registry)."""
    if model_registry and litmodels_installed():
        raise no_model_registry(f"Trainer(model_registry={model_registry!r})")
    return model_registry.split(":")[0] if model_registry else None


def adds_default_checkpoint(callbacks, checkpointing):
    """Whether default_callbacks adds its own ModelCheckpoint (checkpointing on, no Checkpoint among `callbacks`)."""
    from tasktrain.callbacks.base import Callback, Checkpoint

    given = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
    return bool(checkpointing) and not any(isinstance(c, Checkpoint) for c in given)


LITMODELS_TIP = ("💡 Tip: For seamless cloud uploads and versioning, try installing "
                 "[litmodels](https://pypi.org/project/litmodels/) to enable LitModelCheckpoint, which syncs "
                 "automatically with the Lightning model registry.")


def refuse_lightning_only(barebones, plugins, max_restarts):
    """Lightning's arguments without a counterpart: a clear error instead of a silent difference."""
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError(f"Trainer(max_restarts={max_restarts!r}): use 0 (no restart) or a positive number.")


def barebones_settings(barebones, logger, enable_checkpointing, enable_progress_bar, log_every_n_steps,
                       enable_model_summary, num_sanity_val_steps, fast_dev_run, detect_anomaly, profiler):
    """Lightning's barebones mode: every feature that costs speed off, for measuring the Trainer's own overhead.
    The settings it turns off default to None so that one asked for explicitly is refused (Lightning's ValueErrors,
    its words); without barebones None means each one's usual default. Returns (logger, enable_checkpointing,
    enable_progress_bar, log_every_n_steps, enable_model_summary, num_sanity_val_steps)."""
    if not barebones:
        return (True if logger is None else logger, True if enable_checkpointing is None else enable_checkpointing,
                True if enable_progress_bar is None else enable_progress_bar,
                50 if log_every_n_steps is None else log_every_n_steps,
                True if enable_model_summary is None else enable_model_summary,
                2 if num_sanity_val_steps is None else num_sanity_val_steps)
    refused = (  # (setting, given, what barebones refuses, why)
        ("enable_checkpointing", enable_checkpointing, bool(enable_checkpointing),
         "Checkpointing can impact raw speed"),
        ("logger", logger, logger is not None and logger is not False, "Logging can impact raw speed"),
        ("enable_progress_bar", enable_progress_bar, bool(enable_progress_bar),
         "The progress bar can impact raw speed"),
        ("log_every_n_steps", log_every_n_steps, log_every_n_steps is not None and log_every_n_steps != 0,
         "Logging can impact raw speed"),
        ("enable_model_summary", enable_model_summary, bool(enable_model_summary),
         "Model summary can impact raw speed"),
        ("num_sanity_val_steps", num_sanity_val_steps, num_sanity_val_steps is not None and num_sanity_val_steps != 0,
         "Sanity checking can impact raw speed"),
        ("fast_dev_run", fast_dev_run, fast_dev_run is not False and fast_dev_run != 0,
         "Development run is not meant for raw speed evaluation"),
        ("detect_anomaly", detect_anomaly, bool(detect_anomaly), "Anomaly detection can impact raw speed"),
        ("profiler", profiler, profiler is not None, "Profiling can impact raw speed"),
    )
    for name, value, conflicts, why in refused:
        if conflicts:
            raise ValueError(f"`Trainer(barebones=True, {name}={value!r})` was passed. {why} so it is disabled in "
                             "barebones mode.")
    _info("You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have been "
          "disabled to facilitate analyzing the Trainer overhead. Specifically, the following features are "
          "deactivated:" + os.linesep + os.linesep.join((
              " - Checkpointing: `Trainer(enable_checkpointing=True)`",
              " - Progress bar: `Trainer(enable_progress_bar=True)`",
              " - Model summary: `Trainer(enable_model_summary=True)`",
              " - Logging: `Trainer(logger=True)`, `Trainer(log_every_n_steps>0)`, `TaskModule.log(...)`, "
              "`TaskModule.log_dict(...)`",
              " - Sanity checking: `Trainer(num_sanity_val_steps>0)`",
              " - Development run: `Trainer(fast_dev_run=True)`",
              " - Anomaly detection: `Trainer(detect_anomaly=True)`",
              " - Profiling: `Trainer(profiler=...)`")))
    return False, False, False, 0, False, 0


def loop_limits(fast_dev_run, overfit_batches, min_epochs, min_steps, max_epochs, max_steps, limits,
                num_sanity_val_steps, val_check_interval, check_val_every_n_epoch, logger):
    """The loop's limits after fast_dev_run (Lightning's debugging run: n batches of each loop, one epoch, no
    sanity check, a DummyLogger in place of the loggers; ModelCheckpoint and EarlyStopping do nothing) and overfit_batches (the same first
    batches every epoch, unshuffled, for training and validation). `limits`: (train, val, test, predict)."""
    if isinstance(fast_dev_run, bool) or fast_dev_run is None:
        dev_batches = int(bool(fast_dev_run))
    elif isinstance(fast_dev_run, int) and fast_dev_run >= 0:
        dev_batches = fast_dev_run
    else:  # (Lightning's type, and its words first where it refuses the value: a negative int)
        lightnings = f"fast_dev_run={fast_dev_run!r} is not a valid configuration. It should be >= 0. " \
            if isinstance(fast_dev_run, int) else ""
        raise MisconfigurationException(
            f"{lightnings}fast_dev_run={fast_dev_run!r}: use True (one batch), False, or a number of batches.")
    # Lightning's _determine_batch_limits: a whole float above 1 (10.0, 1e3) is that many batches
    overfit_batches, val_check_interval = whole_count(overfit_batches), whole_count(val_check_interval)
    limits = tuple(whole_count(value) for value in limits)
    overfit = check_limit(overfit_batches, "overfit_batches")
    train, val, test, predict = limits
    for name, value in (("overfit_batches", overfit_batches), ("limit_train_batches", train),
                        ("limit_val_batches", val), ("limit_test_batches", test),
                        ("limit_predict_batches", predict), ("val_check_interval", val_check_interval)):
        _say_what_one_means(name, value)
    if overfit:
        train = val = overfit
    if dev_batches:
        _info(f"Running in `fast_dev_run` mode: will run the requested loop using {dev_batches} batch(es). "
                  "Logging and checkpointing is suppressed.")
        if not overfit:
            train = val = dev_batches
        test = predict = dev_batches
        max_steps, max_epochs, num_sanity_val_steps = dev_batches, 1, 0
        val_check_interval, check_val_every_n_epoch = None, 1
        if logger not in (False, []):  # Lightning's: a logger that writes nothing, so self.logger still works
            from tasktrain.loggers.logger import DummyLogger

            logger = DummyLogger()
    val_check_seconds = guards.val_check_seconds(val_check_interval)  # a time: validate once it has passed
    guards.check_val_schedule(val_check_interval, check_val_every_n_epoch)
    guards.check_limits(max_epochs, max_steps, min_epochs, min_steps, val_check_interval,  # issue 38
                        limit_train_batches=train, limit_val_batches=val, limit_test_batches=test,
                        limit_predict_batches=predict)
    # Lightning's: max_epochs left unset stays None until a fit decides it (run.start_stage), min_epochs and
    # min_steps stay None when not given
    min_epochs = None if min_epochs is None else int(min_epochs)
    if num_sanity_val_steps == -1:
        num_sanity_val_steps = float("inf")  # Lightning's: the whole validation, as many batches as it has
    # Lightning's attributes: an unlimited loop reads 1.0 (its _determine_batch_limits of None), fast_dev_run
    # keeps what was given (False stays False), 1 reads True
    train, val, test, predict = (1.0 if limit is None else limit for limit in (train, val, test, predict))
    return dict(
        fast_dev_run=True if dev_batches == 1 else (dev_batches or fast_dev_run), overfit_batches=overfit,
        min_epochs=min_epochs,
        max_epochs=None if max_epochs is None else int(max_epochs), max_steps=-1 if max_steps is None else int(max_steps),
        limit_train_batches=train, limit_val_batches=val, limit_test_batches=test, limit_predict_batches=predict,
        num_sanity_val_steps=num_sanity_val_steps,
        # Lightning's trainer.val_check_interval: 1.0 (the epoch's end) when not given and under fast_dev_run
        val_check_interval=1.0 if val_check_interval is None else val_check_interval,
        _val_check_time_interval=None if dev_batches else val_check_seconds,
        check_val_every_n_epoch=check_val_every_n_epoch), logger


def root_dir(default_root_dir):
    """Lightning's trainer.default_root_dir: a local path normalised, ~ expanded (a file:// URL is its local folder,
    where Lightning's fsspec writes it); a file system URL ("s3://...") as given, written through fsspec
    (checkpoint_io); the working directory without one."""
    from tasktrain.checkpoint_io import is_remote, local_path

    if not default_root_dir:
        return os.getcwd()
    path = local_path(default_root_dir)
    return path if is_remote(path) else os.path.normpath(os.path.expanduser(path))


def run_flags(min_steps, log_every_n_steps, default_root_dir, enable_checkpointing, inference_mode,
              use_distributed_sampler, detect_anomaly, sync_batchnorm, reload_dataloaders_every_n_epochs):
    """The Trainer's plain settings, checked."""
    log_every_n_steps = 50 if log_every_n_steps is None else log_every_n_steps  # Lightning's None
    if int(log_every_n_steps) < 0:
        raise ValueError(f"log_every_n_steps={log_every_n_steps}: use a positive integer, or 0 for no step values "
                         "(Lightning's).")
    reload_every = reload_dataloaders_every_n_epochs
    if not isinstance(reload_every, int) or reload_every < 0:  # (Lightning's check and words; a ValueError)
        raise MisconfigurationException(
            f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload_dataloaders_every_n_epochs}.")
    return dict(
        min_steps=None if min_steps is None else int(min_steps), log_every_n_steps=int(log_every_n_steps),
        default_root_dir=root_dir(default_root_dir),
        enable_checkpointing=enable_checkpointing,
        inference_mode=bool(inference_mode),  # False: evaluation under torch.no_grad() instead
        use_distributed_sampler=bool(use_distributed_sampler),  # False: each rank reads the loaders as given
        detect_anomaly=bool(detect_anomaly), sync_batchnorm=bool(sync_batchnorm),
        reload_dataloaders_every_n_epochs=reload_every)


def set_torch_flags(deterministic, benchmark):
    """The process-wide torch settings the Trainer's arguments ask for, as Lightning's: deterministic None leaves
    torch's setting alone, True / False sets it, "warn" makes torch warn where it would raise; deterministic turns
    cuDNN's algorithm search off unless benchmark says otherwise (which torch then overrides: a warning)."""
    if deterministic not in (None, True, False, "warn"):
        raise ValueError(f"Trainer(deterministic={deterministic!r}): use None, True, False or 'warn'.")
    if deterministic:
        if benchmark is None:
            benchmark = False
        elif benchmark:
            if _rank() == 0:  # (Lightning's rank_zero_warn, its words)
                warnings.warn("You passed `deterministic=True` and `benchmark=True`. Note that PyTorch ignores "
                              "torch.backends.cudnn.deterministic=True when torch.backends.cudnn.benchmark=True.",
                              UserWarning)
    if benchmark is not None:  # cuDNN's algorithm search (no effect on the CPU)
        torch.backends.cudnn.benchmark = bool(benchmark)
    if deterministic == "warn":
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif deterministic is not None:
        torch.use_deterministic_algorithms(deterministic)
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # (cuBLAS's reproducibility setting, Lightning's)


def default_callbacks(callbacks, root_dir, loggers, progress_bar, checkpointing, clip_val, clip_algorithm, max_time,
                      model_summary):
    """The user's callbacks and those the Trainer's arguments add (the loggers that are tasktrain Loggers, progress
    bar, summary, checkpointing, gradient_clip_val, max_time), in call order. `loggers`: resolve_loggers' list."""
    from tasktrain.callbacks import ModelCheckpoint, ModelSummary, ProgressBar, RichModelSummary
    from tasktrain.callbacks import progress
    from tasktrain.callbacks.clipping import GradientClipping
    from tasktrain.callbacks.timer import Timer
    from tasktrain.trainer.connectors import callback_connector
    from tasktrain.callbacks import external

    from tasktrain.callbacks.base import Callback, Checkpoint
    from tasktrain.exceptions import MisconfigurationException

    callbacks = list(callbacks or []) if not isinstance(callbacks, Callback) else [callbacks]
    # a tasktrain Logger is also a callback (its setup hook agrees on the version across ranks); another logger
    # object is only called as a logger
    callbacks.extend(logger for logger in loggers if isinstance(logger, Logger))
    bars = [c for c in callbacks if isinstance(c, ProgressBar)]
    if len(bars) > 1:  # Lightning's refusals, Lightning's words
        raise MisconfigurationException("You added multiple progress bar callbacks to the Trainer, but currently only "
                                        "one progress bar is supported.")
    if bars and not progress_bar:
        raise MisconfigurationException(f"Trainer was configured with `enable_progress_bar=False` but found "
                                        f"`{type(bars[0]).__name__}` in callbacks list.")
    # Lightning's rule, read from Lightning's switch (callback_connector._RICH_AVAILABLE, patched by its tests to pin
    # the tqdm branch): RichProgressBar and RichModelSummary when rich is installed, else TQDMProgressBar and
    # ModelSummary
    rich = bool(callback_connector._RICH_AVAILABLE)
    if progress_bar and not bars:
        callbacks.append(progress.default_progress_bar(rich))
    if model_summary and not any(isinstance(c, ModelSummary) for c in callbacks):
        # (and it runs a ModelSummary the user gave even when disabled)
        callbacks.append(RichModelSummary() if rich else ModelSummary())
    if any(isinstance(c, Checkpoint) for c in callbacks):  # any Checkpoint counts, OnExceptionCheckpoint too
        if not checkpointing:
            raise MisconfigurationException("Trainer was configured with `enable_checkpointing=False` but found "
                                            "`ModelCheckpoint` in callbacks list.")
    elif checkpointing:
        callbacks.append(ModelCheckpoint())
    if any(isinstance(c, ModelCheckpoint) for c in callbacks):  # it calls after_save_checkpoint: checked up front
        check_loggers(loggers, methods=LOGGER_METHODS + ("after_save_checkpoint",))
    # (Lightning's check; .lower() of a str enum such as GradClipAlgorithmType.NORM is its value's, "norm")
    if clip_algorithm is not None and getattr(clip_algorithm, "lower", str(clip_algorithm).lower)() not in (
            "value", "norm"):
        raise MisconfigurationException(f"`gradient_clip_algorithm` {clip_algorithm} is invalid. Allowed algorithms: "
                                        "['value', 'norm'].")
    if clip_val:  # None or 0 means no clipping, as gradient_clipping: 0 does in DeepSpeed
        clip_algorithm = (clip_algorithm or "norm").lower()  # (None, Lightning's default, is what the hooks get)
        clipping = GradientClipping(**({"max_norm": clip_val} if clip_algorithm == "norm" else {"max_value": clip_val}))
        clipping.from_trainer = True
        callbacks.append(clipping)
    if max_time is not None and any(isinstance(c, Timer) for c in callbacks):  # the user's Timer wins (Lightning's)
        logging.getLogger("tasktrain").info(
            "Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
    elif max_time is not None:
        callbacks.append(Timer(duration=max_time))
    # the callbacks installed packages register under Lightning's entry-point group (tasktrain/callbacks/external.py),
    # where Lightning's Trainer adds them: after its own, before the checks
    callbacks.extend(external._load_external_callbacks(external.CALLBACKS_GROUP))
    check_state_keys(callbacks)
    return in_call_order(callbacks)


def check_state_keys(callbacks):
    """Lightning's refusal at Trainer(): two callbacks with a state (state_dict overridden) under one state_key would
    write one entry of the checkpoint, and a resume would hand both the same state. (tasktrain Loggers are callbacks
    here but loggers in Lightning, where two of a kind are allowed: not checked.)"""
    from tasktrain.callbacks.base import Callback
    from tasktrain.trainer.module import is_overridden

    seen = set()
    for callback in callbacks:
        if isinstance(callback, Logger) or not is_overridden("state_dict", callback, Callback):
            continue
        if callback.state_key in seen:
            name = type(callback).__name__
            raise RuntimeError(
                f"Found more than one stateful callback of type `{name}`. In the current configuration, this callback "
                "does not support being saved alongside other instances of the same type. Please consult the "
                f"documentation of `{name}` regarding valid settings for the callback state to be checkpointable. "
                "HINT: The `callback.state_key` must be unique among all callbacks in the Trainer.")
        seen.add(callback.state_key)


def in_call_order(callbacks):
    """The finders first (Lightning's rule: they tune before any other callback sees the run), then loggers,
    checkpointing last: a checkpoint holds the state of every other callback at that point."""
    from tasktrain.callbacks.base import Checkpoint
    from tasktrain.callbacks.batch_size_finder import BatchSizeFinder
    from tasktrain.callbacks.lr_finder import LearningRateFinder

    return sorted(callbacks, key=lambda c: -1 if isinstance(c, (BatchSizeFinder, LearningRateFinder)) else
                  0 if isinstance(c, Logger) else 2 if isinstance(c, Checkpoint) else 1)


# What the Trainer calls on every logger in every run (Lightning's Logger interface): log_hyperparams, log_graph and
# save at a run's start, log_metrics and save at each write, finalize at its end; after_save_checkpoint when a
# ModelCheckpoint saves.
LOGGER_METHODS = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize")


def resolve_loggers(logger, root_dir):
    """Lightning's `logger=` rule: True or None the default TensorBoardLogger, False (or an empty list) none, an
    iterable its items, any other object one logger. Every logger is checked for Lightning's Logger methods here,
    before training (Lightning fails on the first missing method during the run)."""
    from collections.abc import Iterable

    from tasktrain.loggers.tensorboard import TensorBoardLogger

    if logger is True or logger is None:  # None is Lightning's default: the default logger
        return [TensorBoardLogger(root_dir)]
    if logger is False:
        return []
    if isinstance(logger, Iterable) and not isinstance(logger, (str, bytes, Logger)):
        return check_loggers(list(logger))
    return check_loggers([logger], one=True)


def check_loggers(loggers, methods=LOGGER_METHODS, one=False):
    """Any object with Lightning's Logger methods is a logger (a tasktrain.loggers logger, a subclass of
    tasktrain.loggers.Logger, a user's own class, a Mock); anything else is refused with the methods it lacks."""
    loggers = list(loggers)
    for logger in loggers:
        missing = [name for name in methods if not callable(getattr(logger, name, None))]
        if missing:
            where = f"logger={logger!r}" if one else f"logger=[..., {logger!r}, ...]"
            raise TypeError(
                f"{where}: not a logger, it has no {', '.join(missing)}. A logger has Lightning's Logger "
                "methods: log_metrics(metrics, step), log_hyperparams(params), log_graph(model, input_array=None), "
                "save(), finalize(status), after_save_checkpoint(checkpoint_callback) (subclass "
                "tasktrain.loggers.Logger to get them all). Use logger=True (the default TensorBoardLogger), False "
                "(none), a logger, or a list of loggers.")
    return loggers


def _say_what_one_means(name, value):
    """Lightning's note for a limit given as 1 or 1.0 (a count of one batch, or all of them): easy to mix up."""
    if value is None or isinstance(value, bool) or value != 1:
        return
    if isinstance(value, int):
        what = {"limit_train_batches": "1 batch per epoch will be used",
                "val_check_interval": "validation will run after every batch"}.get(name, "1 batch will be used")
        _info(f"`Trainer({name}=1)` was configured so {what}.")
    elif isinstance(value, float):
        what = {"limit_train_batches": "100% of the batches per epoch will be used",
                "val_check_interval": "validation will run at the end of the training epoch"}.get(
            name, "100% of the batches will be used")
        _info(f"`Trainer({name}=1.0)` was configured so {what}.")


def whole_count(value):
    """A float above 1 with no fraction as the int it is (Lightning reads limit_*_batches=10.0 as 10 batches);
    anything else as it is."""
    if isinstance(value, float) and value > 1 and value % 1 == 0:
        return int(value)
    return value


def check_limit(value, name):
    """A batch limit: a fraction in [0, 1] (float) or a count (int >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
            (isinstance(value, float) and value > 1.0):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        lightnings = guards.invalid_value_sentence(value, name) if number else ""
        raise MisconfigurationException(  # (Lightning's type, and its first sentence where it refuses the value)
            f"{lightnings}{name}={value!r}: a float is a fraction of the loader in [0, 1]; an int is a batch count.")
    return value


def is_one(value):
    return type(value) is int and value == 1
