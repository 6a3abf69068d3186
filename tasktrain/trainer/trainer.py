"""Trainer: fit / validate / test / predict. The loop is in `_fit_loop` and `_train_epoch`, top to bottom.

An epoch is a sequence of accumulation windows of micro-batches. Per micro-batch (automatic optimisation), in
this order:

    on_train_batch_start
    training_step (under the strategy's forward_context, through the DDP/DeepSpeed wrapper)
    at the window's first micro-batch: on_before_zero_grad -> zero_grad (Lightning's place)
    on_before_backward -> backward -> on_after_backward
    at the window's last micro-batch, the optimizer step (the one place the loop steps it):
        on_before_optimizer_step -> optimizer step -> step-interval schedulers
        (the epoch's last batch: the epoch-interval schedulers that watch no metric, as Lightning)
        logger flush every log_every_n_steps; validation, when due at this step
    on_train_batch_end                                             (checkpoints are saved here: after validation)

At the end of an epoch: epoch metrics reduced, validation when due, the metric-watching epoch schedulers, then
on_train_epoch_end (module first; what it logs is reduced before the callbacks' on_train_epoch_end runs).
"""
import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from functools import partial
from typing import List, Optional, Union

import torch

from tasktrain import checkpoint_io as ckpt_io
from tasktrain.callbacks.base import EVENTS, Callback, Logger
from tasktrain.compiled import compile_forward_as, unwrap_compiled
from tasktrain.profilers import Profiler, profiled, profiled_calls, profiled_iter, resolve_profiler
from tasktrain.strategies.base import MultiProcess, Plan, Sharded, Strategy, step_arguments
from tasktrain.strategies.watchdog import DEFAULT_STALL_TIMEOUT, watched_action, watched_batches
from tasktrain.trainer.data import (StatefulLoaderData, prepare_eval_loader, prepare_train_data,
                                    record_batch_indices)
from tasktrain.trainer.epoch import EpochIterator, warn_global_batch_change
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.metrics import MetricStore
from tasktrain.trainer.module import TaskModule, is_overridden
from tasktrain.trainer.optim import parse_optimizers
from tasktrain.trainer.run_state import (Callbacks, Objects, Optimizers, RandomStates, RunState, Value, Weights,
                                         check_counts, upgrade)
from tasktrain.trainer.runtime import announce_rank, broadcast_seed, build_runtime, rng_restore_of_this_rank
from tasktrain.trainer.state import TrainState
from tasktrain.trainer.states import RunningStage, TrainerFn, TrainerStatus


class Trainer:
    checkpoint_seconds = 0.0  # this process's time in save_checkpoint, summed (read by ThroughputMonitor)

    def __init__(
        self,
        *,
        accelerator="auto",
        strategy: Union[str, Strategy] = "auto",  # the annotations of object arguments: TaskCLI builds them from YAML
        devices="auto",
        num_nodes=None,
        precision=None,
        max_epochs=None,
        max_steps=-1,
        limit_train_batches=None,
        limit_val_batches=None,
        limit_test_batches=None,
        limit_predict_batches=None,
        val_check_interval=None,
        check_val_every_n_epoch=1,
        num_sanity_val_steps=2,
        accumulate_grad_batches=1,
        gradient_clip_val=None,
        gradient_clip_algorithm="norm",
        callbacks: Optional[Union[List[Callback], Callback]] = None,
        logger: Union[bool, Logger, List[Logger], None] = True,
        enable_progress_bar=True,
        enable_checkpointing=True,
        log_every_n_steps=50,
        default_root_dir=None,
        deterministic=False,
        max_time=None,
        stall_timeout=DEFAULT_STALL_TIMEOUT,
        enable_model_summary=True,
        profiler: Union[str, Profiler, None] = None,
        fast_dev_run=False,
        min_epochs=None,
        min_steps=None,
        overfit_batches=0.0,
        benchmark=None,
        inference_mode=True,
        use_distributed_sampler=True,
        detect_anomaly=False,
        barebones=False,
        plugins=None,
        sync_batchnorm=False,
        reload_dataloaders_every_n_epochs=0,
        max_restarts=0,
    ):
        # The launch config, the strategy and its precision, the accumulation: the Accelerator's rules too.
        # Arguments left at their defaults count as not given, so that `tasktrain launch`'s config fills them.
        runtime = build_runtime(
            accelerator=accelerator, strategy=strategy, devices=devices,
            num_nodes=num_nodes, precision=precision,
            accumulate_grad_batches=None if _is_one(accumulate_grad_batches) else accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val, stall_timeout=stall_timeout,
        )
        self.env = runtime.env
        self.strategy = runtime.strategy
        self.devices, self.num_nodes = runtime.devices, runtime.num_nodes
        self.accumulate_grad_batches = runtime.accumulate_grad_batches
        gradient_clip_val = runtime.gradient_clip_val
        # read by TaskModule.clip_gradients (manual optimisation); a GradientClipping callback does the automatic one
        self.gradient_clip_val, self.gradient_clip_algorithm = gradient_clip_val, gradient_clip_algorithm
        # watchdog (issue 19): seconds a rank may go without progress in a loop before every rank stops, or None
        self.stall_timeout = runtime.stall_timeout
        # issue 29: restarts by torch's elastic agent (read by the strategy's setup_environment)
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
            raise ValueError(f"Trainer(max_restarts={max_restarts!r}): use 0 (no restart) or a positive number.")
        self.max_restarts = self.strategy.max_restarts = max_restarts
        # profiler (tasktrain/profilers.py): without one each loop action is a `with` on a shared no-op context.
        # Bound again at each run's start (the tuner sets the profiler aside for its trials).
        self.profiler = resolve_profiler(profiler)
        self._profile = _no_profile

        # Lightning's arguments without a counterpart: a clear error instead of a silent difference.
        if barebones:
            raise ValueError(
                "barebones=True: tasktrain has no barebones mode. Turn off what it would turn off: logger=False, "
                "enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0 (the loop itself adds "
                "no per-step work beyond those; see docs/benchmarks.md).")
        if plugins:
            raise ValueError(
                f"plugins={plugins!r}: tasktrain has no plugin objects. Precision is precision='bf16-mixed' (...), the "
                "cluster environment is read from the launcher's variables (tasktrain launch, torchrun, SLURM), and "
                "checkpoint I/O belongs to the strategy (strategy=...).")
        # fast_dev_run (Lightning's debugging run): n batches of each loop, one epoch, no sanity check, no loggers;
        # ModelCheckpoint and EarlyStopping do nothing.
        if isinstance(fast_dev_run, bool) or fast_dev_run is None:
            dev_batches = int(bool(fast_dev_run))
        elif isinstance(fast_dev_run, int) and fast_dev_run >= 0:
            dev_batches = fast_dev_run
        else:
            raise ValueError(f"fast_dev_run={fast_dev_run!r}: use True (one batch), False, or a number of batches.")
        self.fast_dev_run = True if dev_batches == 1 else dev_batches
        self.overfit_batches = _check_limit(overfit_batches, "overfit_batches")
        if self.overfit_batches:  # the same first batches every epoch, unshuffled, for training and validation
            limit_train_batches = limit_val_batches = self.overfit_batches
        if dev_batches:
            if not self.overfit_batches:
                limit_train_batches = limit_val_batches = dev_batches
            limit_test_batches = limit_predict_batches = dev_batches
            max_steps, max_epochs, num_sanity_val_steps = dev_batches, 1, 0
            val_check_interval, check_val_every_n_epoch, logger = None, 1, False
        self.min_epochs = int(min_epochs or 0)
        self.min_steps = int(min_steps or 0)
        if max_epochs is None and max_steps in (None, -1):
            max_epochs = max(1000, self.min_epochs)
        self.max_epochs = -1 if max_epochs is None else int(max_epochs)
        self.max_steps = -1 if max_steps is None else int(max_steps)
        self.limit_train_batches = limit_train_batches
        self.limit_val_batches = limit_val_batches
        self.limit_test_batches = limit_test_batches
        self.limit_predict_batches = limit_predict_batches
        self.val_check_interval = val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = num_sanity_val_steps
        if int(log_every_n_steps) < 1:
            raise ValueError(f"log_every_n_steps={log_every_n_steps}: use a positive integer.")
        self.log_every_n_steps = int(log_every_n_steps)
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir else os.getcwd()
        self.enable_checkpointing = enable_checkpointing
        if deterministic:
            torch.use_deterministic_algorithms(True)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if benchmark is not None:  # cuDNN's algorithm search (no effect on the CPU)
            torch.backends.cudnn.benchmark = bool(benchmark)
        self.inference_mode = bool(inference_mode)  # False: evaluation under torch.no_grad() instead
        self.use_distributed_sampler = bool(use_distributed_sampler)  # False: each rank reads the loaders as given
        self.detect_anomaly = bool(detect_anomaly)
        self.sync_batchnorm = bool(sync_batchnorm)
        self.reload_dataloaders_every_n_epochs = int(reload_dataloaders_every_n_epochs or 0)
        if self.reload_dataloaders_every_n_epochs < 0:
            raise ValueError(f"reload_dataloaders_every_n_epochs={reload_dataloaders_every_n_epochs}: use 0 or more.")

        self.callbacks = self._default_callbacks(
            list(callbacks or []) if not isinstance(callbacks, Callback) else [callbacks],
            logger, enable_progress_bar, enable_checkpointing, gradient_clip_val, gradient_clip_algorithm, max_time,
            enable_model_summary,
        )

        self.state = TrainState()
        self.optimizers = []
        self.lr_scheduler_configs = []
        self.module = None
        self.datamodule = None  # the DataModule of the last entry point given one (Lightning's trainer.datamodule)
        self._given_module = None  # what the last run was given: the module, or torch.compile(module)
        self._metrics = None
        self._callback_metrics_cache = {}
        self._logged_metrics = {}
        self._hooks = {}
        self._watchdog, self._watching = None, False
        self._reset_run_state()

    def _reset_run_state(self):
        """What belongs to one run (fit, validate, ...): fresh at the start of each, so nothing leaks into the next."""
        self.should_stop = False
        self.sanity_checking = False
        self.training = False
        self.num_training_batches = None  # batches of the epoch being trained (a resumed epoch: what is left + done)
        self._epoch_length = None  # batches of a whole epoch (limit_train_batches applied)
        self._loader_data = None  # the TrainData being trained (a StatefulDataLoader's state is checkpointed)
        self.num_val_batches = []  # one entry per validation loader (Lightning's shape): its batch count or None
        self.num_sanity_val_batches = []
        self.num_test_batches = []
        self.num_predict_batches = []
        self._val_loader = None
        self._resumed_from = None
        self._datamodule_restored = False
        self._preempted = False
        self._preempt_path = None
        self._loss_window = []
        self._loss_window_start = 0
        self.predictions, self.predict_batch_indices = [], []  # of the predict run in progress (prediction writers)

    # -- set-up helpers --------------------------------------------------------------------------------------------
    def _default_callbacks(self, callbacks, logger, progress_bar, checkpointing, clip_val, clip_algorithm, max_time,
                           model_summary):
        from tasktrain.callbacks import ModelCheckpoint, ModelSummary, ProgressBar, TensorBoardLogger
        from tasktrain.callbacks.clipping import GradientClipping
        from tasktrain.callbacks.timer import Timer

        if logger is True or logger is None:  # None is Lightning's default: the default logger
            callbacks.append(TensorBoardLogger(self.default_root_dir))
        elif isinstance(logger, Logger):
            callbacks.append(logger)
        elif isinstance(logger, (list, tuple)):
            callbacks.extend(_check_loggers(logger))
        elif logger is not False:
            raise TypeError(f"logger={logger!r}: use True, False, a Logger (tasktrain.loggers), or a list of them.")
        if progress_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(ProgressBar())
        if not progress_bar and any(isinstance(c, ProgressBar) for c in callbacks):
            raise ValueError("enable_progress_bar=False, but a ProgressBar is in callbacks: remove one of them.")
        if model_summary and not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(ModelSummary())
        if not model_summary and any(isinstance(c, ModelSummary) for c in callbacks):
            raise ValueError("enable_model_summary=False, but a ModelSummary is in callbacks: remove one of them.")
        if checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks.append(ModelCheckpoint())
        if not checkpointing and any(isinstance(c, ModelCheckpoint) for c in callbacks):
            raise ValueError("enable_checkpointing=False, but a ModelCheckpoint is in callbacks: remove one of them.")
        if clip_val:  # None or 0 means no clipping, as gradient_clipping: 0 does in DeepSpeed
            if clip_algorithm not in ("norm", "value"):
                raise ValueError(f"gradient_clip_algorithm={clip_algorithm!r}: use 'norm' or 'value'.")
            callbacks.append(GradientClipping(**({"max_norm": clip_val} if clip_algorithm == "norm" else
                                                 {"max_value": clip_val})))
        if max_time is not None:
            callbacks.append(Timer(duration=max_time))
        return _in_call_order(callbacks)

    @property
    def loggers(self):
        return [c for c in self.callbacks if isinstance(c, Logger)]

    @loggers.setter
    def loggers(self, loggers):
        self.callbacks = _check_loggers(loggers or []) + [c for c in self.callbacks if not isinstance(c, Logger)]

    @property
    def logger(self):
        loggers = self.loggers
        return loggers[0] if loggers else None

    @logger.setter
    def logger(self, logger):
        self.loggers = [] if logger is None else [logger]

    @property
    def log_dir(self):
        """The first logger's log_dir, else its save_dir (W&B, MLflow), else default_root_dir."""
        logger = self.logger
        if logger is None:
            return self.default_root_dir
        return logger.log_dir or logger.save_dir or self.default_root_dir

    @property
    def checkpoint_callbacks(self):
        from tasktrain.callbacks import ModelCheckpoint

        return [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def checkpoint_callback(self):
        cbs = self.checkpoint_callbacks
        return cbs[0] if cbs else None

    # -- read-only views -------------------------------------------------------------------------------------------
    @property
    def early_stopping_callbacks(self):
        from tasktrain.callbacks import EarlyStopping

        return [c for c in self.callbacks if isinstance(c, EarlyStopping)]

    @property
    def early_stopping_callback(self):
        """The first EarlyStopping callback, or None (Lightning's attribute)."""
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self):
        from tasktrain.callbacks import ProgressBar

        return next((c for c in self.callbacks if isinstance(c, ProgressBar)), None)

    @property
    def ckpt_path(self):
        """The checkpoint the current (or last) fit resumed from, or None."""
        return self._resumed_from

    @property
    def lightning_module(self):
        """Lightning's name for `trainer.module`, the TaskModule of the current (or last) run."""
        return self.module

    @property
    def global_step(self):
        return self.state.global_step

    @property
    def current_epoch(self):
        return self.state.epoch

    @property
    def global_rank(self):
        return self.strategy.global_rank

    @property
    def local_rank(self):
        return self.strategy.local_rank

    @property
    def node_rank(self):
        return self.strategy.node_rank

    @property
    def world_size(self):
        return self.strategy.world_size

    @property
    def is_global_zero(self):
        return self.strategy.is_global_zero

    @property
    def precision(self):
        """The precision name of the strategy's plugin ("32-true", "bf16-mixed", ...)."""
        return self.strategy.precision.name

    @property
    def enable_validation(self):
        """Whether this fit runs a validation loop: a validation loader, validation_step, limit_val_batches != 0."""
        return self._val_loader is not None and self.limit_val_batches != 0

    # Lightning's flags over trainer.state.stage (the loop running now)
    @property
    def training(self):
        return self.state.stage == RunningStage.TRAINING

    @training.setter
    def training(self, value):
        self._set_stage(RunningStage.TRAINING, value)

    @property
    def sanity_checking(self):
        return self.state.stage == RunningStage.SANITY_CHECKING

    @sanity_checking.setter
    def sanity_checking(self, value):
        self._set_stage(RunningStage.SANITY_CHECKING, value)

    @property
    def validating(self):
        return self.state.stage == RunningStage.VALIDATING

    @property
    def testing(self):
        return self.state.stage == RunningStage.TESTING

    @property
    def predicting(self):
        return self.state.stage == RunningStage.PREDICTING

    def _set_stage(self, stage, on):
        if on:
            self.state.stage = stage
        elif self.state.stage == stage:
            self.state.stage = None

    @property
    def callback_metrics(self):
        return self._metrics.callback_metrics if self._metrics else self._callback_metrics_cache

    @property
    def logged_metrics(self):
        return self._logged_metrics

    @property
    def progress_bar_metrics(self):
        # kept after the run, as in Lightning (a progress bar's get_metrics after fit)
        # kept after the run, as in Lightning (a progress bar's get_metrics after fit): read from the last run's store
        store = self._metrics or getattr(self, "_last_metrics", None)
        return store.progress_bar_metrics() if store else {}

    # -- hooks -----------------------------------------------------------------------------------------------------
    def _build_hooks(self, module):
        """For each event, the module's hook (if overridden) then each overriding callback, bound once."""
        self._hooks = {}
        for event in EVENTS:
            fns = []
            if event not in ("on_exception",) and is_overridden(event, module, TaskModule):
                fns.append((True, getattr(module, event)))
            for cb in self.callbacks:
                if is_overridden(event, cb, Callback):
                    fns.append((False, partial(getattr(cb, event), self, module)))
            if self.profiler is not None:  # only then is a hook wrapped: without one they are called as they are
                fns = profiled_calls(self.profiler, event, fns, module, self.callbacks)
            self._hooks[event] = fns
        _warn_hook_order(module, self.callbacks)
        # The hot-path events as plain lists of callables.
        self._module_hooks = {e: [f for is_mod, f in fns if is_mod] for e, fns in self._hooks.items()}
        self._callback_hooks = {e: [f for is_mod, f in fns if not is_mod] for e, fns in self._hooks.items()}
        self._all_hooks = {e: [f for _, f in fns] for e, fns in self._hooks.items()}

    def _call(self, event, *args):
        for fn in self._all_hooks[event]:
            fn(*args)

    def _attach_module_callbacks(self, module):
        """The module's configure_callbacks(): each replaces the trainer's callbacks of its exact type."""
        if not is_overridden("configure_callbacks", module, TaskModule):
            return
        extra = module.configure_callbacks()
        extra = [extra] if isinstance(extra, Callback) else list(extra or [])
        replaced = {type(c) for c in extra}
        self.callbacks = _in_call_order([c for c in self.callbacks if type(c) not in replaced] + extra)

    def _prepare_data(self, module):
        """prepare_data (the DataModule's, then the module's) once per machine (local rank 0), or once in all
        (prepare_data_per_node=False); the other ranks wait at a barrier, so that setup() finds the files."""
        for owner, base in ((self.datamodule, DataModule), (module, TaskModule)):
            if owner is None or not is_overridden("prepare_data", owner, base):
                continue
            if self.local_rank == 0 if owner.prepare_data_per_node else self.is_global_zero:
                owner.prepare_data()
            if self.world_size > 1:
                self.strategy.barrier("prepare_data")

    def _data_hook(self, name, module):
        """The DataModule's `name` where it overrides it (it wins, as in Lightning), else the module's, or None."""
        module_has = is_overridden(name, module, TaskModule)
        if self.datamodule is not None and is_overridden(name, self.datamodule, DataModule):
            if module_has:  # one of them runs (Lightning's rule and warning), never both
                warnings.warn(f"{name} is overridden in both {type(module).__name__} and "
                              f"{type(self.datamodule).__name__}: the DataModule's runs, the module's does not.")
            return getattr(self.datamodule, name)
        if module_has and self.datamodule is not None:
            warnings.warn(f"{name} is overridden in {type(module).__name__} and a DataModule was passed that does "
                          "not override it: the module's runs.")
        return getattr(module, name) if module_has else None

    def _loader_of(self, module, name):
        """`name` ("train_dataloader", ...) of the DataModule when there is one, else of the module."""
        return getattr(self.datamodule if self.datamodule is not None else module, name)()

    def _batch_mover(self, module):
        """(move, plain): how a batch reaches the device. Without transfer hooks, the strategy's batch_to_device
        (plain=True: called with the batch alone); else Lightning's three hooks in order."""
        strategy = self.strategy
        before, transfer, after = (self._data_hook(name, module) for name in (
            "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"))
        if before is None and transfer is None and after is None:
            return strategy.batch_to_device, True

        def move(batch, dataloader_idx=0):
            if before is not None:
                batch = before(batch, dataloader_idx)
            batch = strategy.batch_to_device(batch) if transfer is None else \
                transfer(batch, strategy.root_device, dataloader_idx)
            if after is not None:
                batch = after(batch, dataloader_idx)
            return batch

        return move, False

    def _eval_to_device(self, batch, dataloader_idx):
        return self._to_device(batch) if self._plain_transfer else self._to_device(batch, dataloader_idx)

    # -- entry points ----------------------------------------------------------------------------------------------
    def init_module(self, empty_init=False):
        """`with trainer.init_module(empty_init=True): module = Model()`: build the module the way the strategy wants
        it built (strategy.module_init_context): FSDP on the meta device with empty_init=True (each rank then
        materialises only its shard), DeepSpeed's zero3_init partitioned; elsewhere as usual."""
        if isinstance(self.strategy, Sharded):
            return self.strategy.module_init_context(empty_init=empty_init)
        return contextlib.nullcontext()

    def fit(self, module, train_dataloaders=None, val_dataloaders=None, datamodule=None, ckpt_path=None):
        """Train `module` on loaders, or on a DataModule's (`datamodule=`, or passed as train_dataloaders)."""
        return self._run("fit", module, train_dataloaders, val_dataloaders, ckpt_path=ckpt_path, datamodule=datamodule)

    def validate(self, module=None, dataloaders=None, ckpt_path=None, verbose=True, datamodule=None):
        self._verbose = verbose  # False: the results are returned, not printed
        return self._run("validate", module, None, dataloaders, ckpt_path=ckpt_path, datamodule=datamodule)

    def test(self, module=None, dataloaders=None, ckpt_path=None, verbose=True, datamodule=None):
        self._verbose = verbose
        return self._run("test", module, None, dataloaders, ckpt_path=ckpt_path, datamodule=datamodule)

    def predict(self, module=None, dataloaders=None, ckpt_path=None, gather=False, return_predictions=None,
                datamodule=None):
        """Predictions of this rank, in loader order (a list per loader when there are several); with gather=True,
        every rank's, in dataset order. return_predictions=False keeps none in memory and returns None (a
        BasePredictionWriter writes them)."""
        self._return_predictions = return_predictions is None or bool(return_predictions)
        return self._run("predict", module, None, dataloaders, ckpt_path=ckpt_path, gather=gather,
                         datamodule=datamodule)

    def _run(self, stage, module, train_loader, eval_loader, ckpt_path=None, gather=False, datamodule=None):
        given = module if module is not None else self._given_module if self._given_module is not None else self.module
        # fit(torch.compile(module)): the module inside is trained, its forward compiled for the run (compiled.py).
        module, compiled = unwrap_compiled(given)
        if not isinstance(module, TaskModule):
            raise TypeError(f"Trainer.{stage} needs a TaskModule, got {type(module).__name__}.")
        self._check_module(module, stage)
        self._given_module = given
        # A DataModule passed where the loaders go is the datamodule (Lightning's rule); it stays for later runs.
        if stage == "fit" and isinstance(train_loader, DataModule) and datamodule is None:
            datamodule, train_loader = train_loader, None
        if stage != "fit" and isinstance(eval_loader, DataModule) and datamodule is None:
            datamodule, eval_loader = eval_loader, None
        if datamodule is not None:
            if not isinstance(datamodule, DataModule):
                raise TypeError(f"Trainer.{stage}(datamodule={type(datamodule).__name__}): use a tasktrain.DataModule.")
            if train_loader is not None or eval_loader is not None:
                raise ValueError(f"Trainer.{stage} was given both dataloaders and a datamodule: pass one of them.")
            self.datamodule = datamodule
            datamodule.trainer = self
        # The strategy runs the stage on every rank: here, or in the processes it starts (ddp_spawn).
        return self.strategy.launch(_StageRun(self, stage, module, ckpt_path, gather, compiled), train_loader,
                                    eval_loader)

    def _run_stage(self, stage, module, train_loader, eval_loader, ckpt_path, gather, compiled=None):
        strategy = self.strategy
        strategy.setup_environment()
        self._reset_run_state()
        self.state.fn, self.state.status = TrainerFn(stage), TrainerStatus.RUNNING  # Lightning's trainer.state
        # watchdog (issue 19): None on one process; the loops are observed through watched_batches/watched_action
        self._watchdog = strategy.watchdog
        self.module = module
        module.trainer = self
        self._profile = self.profiler.profile if self.profiler is not None else _no_profile
        if self.profiler is not None:
            self.profiler.setup(stage, strategy.local_rank if strategy.world_size > 1 else None, self.log_dir,
                                strategy.is_global_zero, module)
        announce_rank(strategy.global_rank)  # @rank_zero_only functions of the user's script know their rank
        self._metrics = MetricStore(strategy)
        self._attach_module_callbacks(module)
        self._build_hooks(module)
        self._to_device, self._plain_transfer = self._batch_mover(module)
        result = None
        status = "success"  # what the loggers' finalize hears
        restore_forward = compile_forward_as(module, compiled)  # undone in the finally below
        try:
            if strategy.is_global_zero and not getattr(Trainer, "_announced", False):
                print(f"[tasktrain] {strategy.describe()}, precision={self.precision}", flush=True)
                Trainer._announced = True
            self._prepare_data(module)
            if self.datamodule is not None:
                self.datamodule.setup(stage)
            self._call("setup", stage)
            if is_overridden("configure_model", module, TaskModule):
                module.configure_model()
            with torch.autograd.set_detect_anomaly(self.detect_anomaly):
                if stage == "fit":
                    self._fit(module, train_loader, eval_loader, ckpt_path)
                else:
                    result = self._evaluate_entry(stage, module, eval_loader, ckpt_path, gather)
        except BaseException as exc:
            status = "failed"
            self.state.status = TrainerStatus.INTERRUPTED
            self._on_failure(exc)
            raise
        finally:
            try:
                self._teardown(stage, module, status)
            finally:
                restore_forward()
                self.state.stage = None
        self.state.status = TrainerStatus.FINISHED
        return result

    def _check_module(self, module, stage):
        for hook, instead in _REFUSED_HOOKS.items():
            # (TaskModule defines none of them: any definition is an override)
            if is_overridden(hook, module, TaskModule) and (stage == "fit" or hook == "configure_sharded_model"):
                raise NotImplementedError(f"{type(module).__name__} overrides {hook}, which tasktrain does not "
                                          f"call: {instead}")
        if stage == "fit" and module.automatic_optimization and is_overridden("clip_gradients", module, TaskModule):
            # Lightning's loop calls it at each step; here the strategy clips (an override would never run)
            raise NotImplementedError(
                f"{type(module).__name__} overrides clip_gradients, which tasktrain's loop does not call under "
                "automatic optimisation: set Trainer(gradient_clip_val=..., gradient_clip_algorithm=...), or clip in "
                "on_before_optimizer_step with self.trainer.strategy.clip_gradients(optimizer, max_norm=...).")
        if stage == "fit":
            if not is_overridden("training_step", module, TaskModule):
                raise NotImplementedError(
                    f"{type(module).__name__} does not define training_step(self, batch, batch_idx); the Trainer "
                    "needs it to fit. It must return the loss (or a dict with a 'loss' key)."
                )
            if not is_overridden("configure_optimizers", module, TaskModule):
                raise NotImplementedError(
                    f"{type(module).__name__} does not define configure_optimizers(self); return an optimizer, "
                    "e.g. `return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
                )
        elif stage in ("validate", "test"):
            name = "validation_step" if stage == "validate" else "test_step"
            if not is_overridden(name, module, TaskModule):
                raise NotImplementedError(f"Trainer.{stage} needs {type(module).__name__}.{name}(self, batch, batch_idx).")

    def _on_failure(self, exc):
        if not isinstance(exc, SystemExit) and isinstance(self.strategy, MultiProcess):
            self.strategy.mark_failed()
        handlers = list(self._all_hooks.get("on_exception", []))
        if self.datamodule is not None:
            handlers.append(self.datamodule.on_exception)
        for fn in handlers:
            try:
                fn(exc)
            except Exception as hook_error:  # the original error is what is raised; this one is reported
                print(f"[tasktrain] an on_exception hook failed too ({getattr(getattr(fn, 'func', fn), '__qualname__', fn)}): "
                      f"{type(hook_error).__name__}: {hook_error}", file=sys.stderr, flush=True)
        if self.world_size > 1 and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            print(f"[tasktrain] rank {self.global_rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _teardown(self, stage, module, status):
        self._unwatch()
        try:
            if self.datamodule is not None:
                self.datamodule.teardown(stage)
            self._call("teardown", stage)
        finally:
            for logger in self.loggers:
                if self.is_global_zero:
                    logger.finalize(status)
            self._callback_metrics_cache = dict(self._metrics.callback_metrics) if self._metrics else {}
            write_error = self._wait_for_checkpoint_write(status)  # issue 29: fit end, error, SIGTERM: wait for it
            self._last_metrics = self._metrics
            self.strategy.teardown()
            self._metrics = None
            if self.profiler is not None:
                self.profiler.describe()
                self.profiler.teardown(stage)
                self._profile = _no_profile  # a save_checkpoint after the run would restart a torn-down profiler
            if write_error is not None:  # issue 29: a failed background write, raised once the rest is torn down
                raise write_error

    # -- fit ---------------------------------------------------------------------------------------------------------
    def _fit(self, module, train_loader, val_loader, ckpt_path):
        strategy = self.strategy
        self._loaders_from_hooks = (train_loader is None, val_loader is None)  # reload_dataloaders_every_n_epochs
        if self.sync_batchnorm and strategy.world_size > 1:
            if strategy.root_device.type == "cpu":
                raise ValueError("sync_batchnorm=True: torch's SyncBatchNorm runs on GPUs only, and this run is on "
                                 "the CPU. Remove it (each process then normalises with its own batch statistics).")
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)  # in place: the module's BatchNorm children

        # Data order: a function of (seed, epoch), the same seed on every rank.
        self.state = TrainState(data_seed=broadcast_seed(strategy), status=self.state.status, fn=self.state.fn)
        # Lightning's order: configure_optimizers, then the loaders (val first); configure_optimizers reading
        # trainer.estimated_stepping_batches gets the training loader set up there (_train_data_now).
        self._pending_train = (module, train_loader)
        self._train_data = None
        optimizers, self.lr_scheduler_configs = parse_optimizers(module)
        # no validation_step (or it set to None) or limit_val_batches=0: no validation loader, loop nor hooks
        has_val = is_overridden("validation_step", module, TaskModule) and self.limit_val_batches != 0
        if has_val:
            val_loader = val_loader if val_loader is not None else self._loader_of(module, "val_dataloader")
            has_val = val_loader is not None
        if has_val:
            self._setup_val_data(val_loader)
        train_data = self._train_data_now()
        train_loader = train_data.given_loader
        if module.automatic_optimization and len(optimizers) > 1:
            raise ValueError(
                f"configure_optimizers returned {len(optimizers)} optimizers: automatic optimisation steps one. "
                "Set `self.automatic_optimization = False` in __init__ and step them yourself in training_step "
                "(self.optimizers(), self.manual_backward(loss))."
            )
        if not module.automatic_optimization and self.accumulate_grad_batches != 1:
            # The loop would step the user's optimizers at every batch regardless: say so instead of ignoring it.
            raise ValueError(
                f"accumulate_grad_batches={self.accumulate_grad_batches} (Trainer argument or the launch config's "
                "gradient_accumulation_steps) does nothing under manual optimisation (automatic_optimization = "
                "False): training_step steps the optimizers itself. Remove it, and accumulate in training_step "
                "(call opt.step() and opt.zero_grad() every N batches)."
            )
        plan = Plan(
            training=True, calls_steps=True, micro_batch_size=_batch_size_of(train_loader),
            accumulate_grad_batches=self.accumulate_grad_batches,
            automatic_optimization=module.automatic_optimization, loss_divided_by_window=True,
            clipping=self._clipping_requests(), has_lr_schedulers=bool(self.lr_scheduler_configs),
            accumulation_schedule=self._accumulation_schedule(),
        )
        with self._profile(f"[Strategy]{strategy.name}.setup_module_and_optimizers"):
            _, self.optimizers = strategy.setup_module_and_optimizers(module, optimizers, plan)

        restore_rng = None
        ckpt_path = self._restart_ckpt_path(ckpt_path)  # issue 29: a restarted worker resumes from the newest
        if ckpt_path is not None:
            resumed = self._restore(ckpt_path)
            if self._datamodule_restored:  # the loader hooks see the DataModule's restored state, as in Lightning
                from_train_hook, from_val_hook = self._loaders_from_hooks
                if from_train_hook:
                    train_data = self._setup_train_data(self._loader_of(module, "train_dataloader"))
                if from_val_hook and has_val:
                    self._setup_val_data(self._loader_of(module, "val_dataloader"))
            if resumed is not None:  # the position in the epoch is worked out on the loader that will be trained on
                restore_rng = self._restore_position(*resumed, train_data)

        self._call("on_fit_start")
        module.zero_grad()  # Lightning clears the gradients when each entry point starts
        if self.is_global_zero:
            for logger in self.loggers:
                logger.log_hyperparams(dict(module.hparams))
                logger.log_graph(module)
                logger.save()
        self._watch()  # from the sanity check on; set-up is not watched
        if has_val and self.num_sanity_val_steps and self._resumed_from is None:
            self.sanity_checking = True
            self._call("on_sanity_check_start")
            self._evaluate("validate", self._val_loader, self.num_sanity_val_batches)
            self._call("on_sanity_check_end")
            self.sanity_checking = False
            self._metrics.callback_metrics.clear()
            self._metrics.epoch_values.clear()
        if restore_rng is not None:
            restore_rng()

        previous = self._install_sigterm_handler()
        try:
            self._fit_loop(module, train_data)
        finally:
            self._restore_sigterm_handler(previous)
        self._call("on_fit_end")
        skipped = self.strategy.precision.skipped_steps
        if skipped and self.is_global_zero:
            print(f"[tasktrain] GradScaler skipped {skipped} optimizer step(s) with inf/NaN gradients.", flush=True)
        if self._preempted:
            raise SystemExit(
                f"[tasktrain] stopped by SIGTERM after step {self.global_step}; a checkpoint was saved to "
                f"{self._preempt_path}. Resume with trainer.fit(module, ..., ckpt_path='last')."
            )

    def _train_data_now(self):
        """The fit's training data, requested and prepared once (from configure_optimizers on)."""
        if self._train_data is None:
            module, train_loader = self._pending_train
            train_loader = train_loader if train_loader is not None else self._loader_of(module, "train_dataloader")
            if train_loader is None:
                raise ValueError("fit needs training data: pass train_dataloaders or datamodule=, or define "
                                 "train_dataloader() on the module.")
            self._train_data = self._setup_train_data(train_loader)
            self._train_data.given_loader = train_loader
        return self._train_data

    def _shards(self):
        """(world size, rank) the loaders are sharded for: (1, 0) with use_distributed_sampler=False."""
        if not self.use_distributed_sampler:
            return 1, 0
        return self.strategy.data_parallel_size, self.strategy.data_parallel_rank  # tensor-parallel peers read the same

    def _setup_train_data(self, loader, previous=None):
        """The epoch iterator of a training loader (a rebuilt loader keeps the resume of the `previous` one)."""
        world_size, rank = self._shards()
        train_data = prepare_train_data(loader, world_size, rank, self.state.data_seed,
                                        shuffle=False if self.overfit_batches else None)
        self.train_dataloader = train_data.loader
        self._epoch_length = self._limit(train_data, self.limit_train_batches, "limit_train_batches")
        self.num_training_batches = self._epoch_length
        # samples of the global order per optimizer step, all processes together (a resume says when it changes)
        micro = _batch_size_of(loader)
        accumulate = self.accumulate_grad_batches if self.module.automatic_optimization else 1
        self.state.global_batch_size = micro * world_size * accumulate if micro else 0
        if self.num_training_batches is None and self.max_steps == -1:
            raise ValueError(
                "The training loader has no length (an infinite or iterable dataset) and max_steps is not set, so "
                "training would never end. Set Trainer(max_steps=N), or give the loader a __len__ / set "
                "limit_train_batches=N to define an epoch."
            )
        self._loader_data = train_data
        epochs = EpochIterator(train_data, world_size, self._epoch_length, self.state)
        if previous is not None:
            epochs.keep_resume_of(previous)
        return epochs

    def _setup_val_data(self, loader):
        world_size, rank = self._shards()
        val_loaders = [prepare_eval_loader(one, world_size, rank) for one in _as_loaders(loader)]
        self._val_loader = val_loaders
        # Counted once per fit (a fraction of a loader without a length fails here, before training).
        self.num_val_batches = [0 if self.limit_val_batches == 0 else
                                self._limit_eval(one, self.limit_val_batches) for one in val_loaders]
        self.num_sanity_val_batches = [self._sanity_limit(one) if self.num_sanity_val_steps else 0
                                       for one in val_loaders]

    @property
    def estimated_stepping_batches(self):
        """The optimizer steps this fit will take (Lightning's): per epoch ceil(batches / accumulate_grad_batches)
        of this rank's shard, times max_epochs, capped by max_steps; readable from configure_optimizers on."""
        if self.num_training_batches is None and self.state.fn == "fit" and getattr(self, "_train_data", 0) is None:
            self._train_data_now()  # read in configure_optimizers: the training loader is requested now (Lightning's)
        if self.num_training_batches is None:
            if self.max_steps != -1:
                return self.max_steps
            if self.state.fn != "fit":
                raise RuntimeError("estimated_stepping_batches is known once fit() has its training data: read it "
                                   "in configure_optimizers or later.")
            return float("inf")
        accumulate = self.accumulate_grad_batches if self.module is None or self.module.automatic_optimization else 1
        per_epoch = -(-self.num_training_batches // accumulate)
        steps = per_epoch * max(self.max_epochs, 1) if self.max_epochs != -1 else float("inf")
        return min(steps, self.max_steps) if self.max_steps != -1 else steps

    @property
    def val_dataloaders(self):
        """The validation loader(s) of the fit, as this rank reads them (a list when there are several)."""
        loaders = self._val_loader
        return loaders[0] if loaders and len(loaders) == 1 else loaders

    def _fit_loop(self, module, epochs):
        # (no module.train() here: Lightning leaves the module's modes as they are, and evaluation gives them back)
        self.training = True
        self._first_epoch = self.state.epoch  # its first step may compile: no watchdog deadline (issue 19)
        self._actions = self._step_actions()
        self._call("on_train_start")
        every = self.reload_dataloaders_every_n_epochs
        while not self._done():
            epoch = self.state.epoch
            if every and epoch > 0 and epoch % every == 0:  # Lightning re-calls the loader hooks, not given loaders
                from_train_hook, from_val_hook = self._loaders_from_hooks
                if from_train_hook:
                    epochs = self._setup_train_data(self._loader_of(module, "train_dataloader"), epochs)
                if from_val_hook and self._val_loader is not None:
                    self._setup_val_data(self._loader_of(module, "val_dataloader"))
            with self._profile("run_training_epoch"):
                self._train_epoch(module, epochs, epoch)
            if self.state.epoch_finished:  # current_epoch counts the finished epochs, also when the run stops here
                epochs.end_epoch()
                self.state.epoch_finished = False
            if (self.should_stop and self._may_stop()) or self._max_steps_reached():
                break
            self.should_stop = False  # a request before min_epochs/min_steps is not kept (Lightning continues too)
        self.training = False
        self._call("on_train_end")

    def _step_actions(self):
        """What a training step does, in the strategy: its own methods, inside the profiler's ranges with a
        profiler and marked for the watchdog with one (so that without either a step costs nothing more)."""
        strategy, watchdog = self.strategy, self._watchdog
        actions = [("training_step", strategy.training_step), ("backward", strategy.backward),
                   ("optimizer_step", strategy.optimizer_step), ("optimizer_zero_grad", strategy.zero_grad)]
        if self.profiler is not None:
            actions = [(name, profiled(self.profiler, name, fn)) for name, fn in actions]
        (_, training_step), (_, backward), (_, optimizer_step), (_, zero_grad) = actions
        return (training_step, watched_action(watchdog, "backward", backward),
                watched_action(watchdog, "optimizer step", optimizer_step,
                               after="after the optimizer step (logging, validation, callbacks)"), zero_grad)

    def _may_stop(self):
        """A stop request (EarlyStopping, should_stop) is honoured once min_epochs and min_steps are reached;
        SIGTERM always."""
        return self._preempted or (self.state.global_step >= self.min_steps and self.state.epoch >= self.min_epochs)

    def _done(self):
        return self._max_steps_reached() or (self.max_epochs != -1 and self.state.epoch >= self.max_epochs)

    def _max_steps_reached(self):
        return self.max_steps != -1 and self.state.global_step >= self.max_steps

    def _train_epoch(self, module, epochs, epoch):
        """One epoch: its batches through `_training_step`, then its end (metrics, validation, schedulers, hooks)."""
        state, metrics = self.state, self._metrics
        metrics.set_stage("train", True, False)
        # Resumed mid-epoch: the epoch iterator skips what was trained on (on another number of processes or another
        # batch size too), without loading it on the Trainer's own order.
        num_batches = self.num_training_batches = epochs.begin(epoch)
        start = state.batch_in_epoch
        if start == 0:  # a mid-epoch resume goes on with the epoch: it does not start it again (Lightning's)
            self._call("on_train_epoch_start")
        else:
            schedule = self._accumulation_schedule()  # what a GradientAccumulationScheduler set when the epoch began
            if schedule:
                self.accumulate_grad_batches = [n for first, n in sorted(schedule) if first <= epoch][-1] \
                    if any(first <= epoch for first, _ in schedule) else 1
        # In manual optimisation training_step steps the optimizers itself: every batch is a window of one. Read
        # after the epoch-start hooks: a GradientAccumulationScheduler sets it there.
        automatic = module.automatic_optimization
        accumulate = self.accumulate_grad_batches if automatic else 1
        self._loss_window, self._loss_window_start = [], start
        self._val_every = self._val_every_n_batches()
        self._ended_by_hook = False
        batches = watched_batches(self._watchdog, epochs.batches(self.profiler), "training_step",
                                  lambda: state.global_step, start, epoch == self._first_epoch,
                                  end_event="end of the training epoch")
        window_end = -1  # the index of the current accumulation window's last micro-batch
        for batch_idx, batch, last_of_epoch in batches:
            if batch_idx > window_end:  # a window starts: its size is worked out once
                window_start, window = epochs.window(batch_idx, accumulate, num_batches)
                window_end = window_start + window - 1
            ends_epoch = last_of_epoch or batch_idx + 1 == num_batches
            if not self._training_step(module, epochs, batch, batch_idx, window, batch_idx == window_start,
                                       batch_idx == window_end or last_of_epoch, ends_epoch):
                break
        del batches  # (the watchdog's end-of-epoch mark)

        self._check_finite_loss()
        if self._stopping_for_signal():
            return
        # epoch end: train epoch metrics, validation when due, epoch schedulers, then on_train_epoch_end.
        ended_by_hook = self._ended_by_hook
        complete = num_batches is None or state.batch_in_epoch >= num_batches or ended_by_hook
        self._flush_epoch_metrics(metrics.reduce_epoch("train"))
        if complete and not ended_by_hook and self._val_at_epoch_end(epoch):  # (-1: no validation, as Lightning)
            self._run_validation(epoch_end=True)
        metrics.set_stage("train", False, True)
        if complete:
            if automatic:  # (under manual optimisation training_step steps its schedulers: Lightning steps none)
                # the metric-watching ones after the epoch's validation; all of them when on_train_batch_start
                # ended the epoch before its last batch
                self._step_schedulers("epoch", plateau=None if ended_by_hook else True)
            state.epoch_finished = True
        for fn in self._module_hooks["on_train_epoch_end"]:
            fn()
        self._flush_epoch_metrics(metrics.reduce_epoch("train"))
        for fn in self._callback_hooks["on_train_epoch_end"]:
            fn()
        self._stop_agreed(at_interval=False)

    def _training_step(self, module, epochs, batch, batch_idx, window, starts_window, ends_window, ends_epoch):
        """One micro-batch, in the order the module docstring gives; False when the epoch ends after it (a hook's
        -1, a stop request, max_steps). The gradients are zeroed at the window's first backward and the optimizer
        steps at its last micro-batch, and only there (Lightning's order)."""
        state, hooks = self.state, self._all_hooks
        training_step, backward, optimizer_step, zero_grad = self._actions
        batch = self._to_device(batch)
        self._metrics.set_batch(batch)
        skip_rest = False
        for fn in self._module_hooks["on_train_batch_start"]:
            response = fn(batch, batch_idx)
            skip_rest = skip_rest or (type(response) is int and response == -1)
        for fn in self._callback_hooks["on_train_batch_start"]:
            fn(batch, batch_idx)
        if skip_rest:  # Lightning's rule: the module's on_train_batch_start returned -1, the epoch ends here
            self._ended_by_hook = True
            return False
        if module.automatic_optimization:
            with self.strategy.no_backward_sync(not ends_window):
                outputs = training_step(batch, batch_idx)
                loss = self._loss_of(outputs, batch_idx)
                self._loss_window.append(loss.detach())
                if window > 1:
                    loss = loss / window
                optimizer = self.optimizers[0] if self.optimizers else None
                if starts_window:  # Lightning zeroes at a window's first backward, not after the step
                    for fn in hooks["on_before_zero_grad"]:
                        fn(optimizer)
                    zero_grad(optimizer)
                for fn in hooks["on_before_backward"]:
                    fn(loss)
                backward(loss)
                for fn in hooks["on_after_backward"]:
                    fn()
            if ends_window:
                for fn in hooks["on_before_optimizer_step"]:
                    fn(optimizer)
                stepped = optimizer_step(optimizer)
                state.global_step += 1
                if stepped:
                    self._step_schedulers("step")
                if ends_epoch:
                    self._step_schedulers("epoch", plateau=False)  # Lightning: at the epoch's last batch
        else:
            outputs = training_step(batch, batch_idx)
        epochs.advance(batch_idx)

        if ends_window:
            if state.global_step % self.log_every_n_steps == 0:
                self._check_finite_loss()
                self._flush_step_metrics()
            val_every = self._val_every
            if val_every and (batch_idx + 1) % val_every == 0 and batch_idx + 1 != self.num_training_batches:
                self._run_validation(epoch_end=False)
        for fn in hooks["on_train_batch_end"]:
            fn(outputs, batch, batch_idx)
        stop = ends_window and ((self._stop_agreed(at_interval=True) and self._may_stop()) or self._max_steps_reached())
        return not stop

    def _loss_of(self, outputs, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) and "loss" in outputs else outputs
        if not isinstance(loss, torch.Tensor):
            got = "None" if loss is None else type(loss).__name__
            raise TypeError(
                f"training_step returned {got} at batch {batch_idx}; with automatic optimisation it must return the "
                "loss tensor (or a dict with a 'loss' key). Return the loss, or set "
                "`self.automatic_optimization = False` to step optimizers yourself."
            )
        if loss.numel() != 1:
            raise ValueError(f"training_step returned a loss of shape {tuple(loss.shape)} at batch {batch_idx}; the "
                             "loss must be a scalar. Reduce it, e.g. loss.mean().")
        if not loss.requires_grad:
            raise ValueError(
                f"training_step returned a loss with no gradient (requires_grad=False) at batch {batch_idx}: it was "
                "computed without the module's parameters, under torch.no_grad(), or detached (.item(), .detach())."
            )
        return loss

    def _check_finite_loss(self):
        """The losses since the last check are tested in one go, so there is no host sync per step."""
        window = self._loss_window
        if not window:
            return
        finite = torch.isfinite(torch.stack(window).float())
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0, 0])
            batch = self._loss_window_start + first
            value = torch.stack(window)[first].item()
            # float16 runs overflow where bfloat16 (fp32's exponent range) does not: name the counterpart of this one
            bf16 = {"16-mixed": "bf16-mixed", "16-true": "bf16-true"}.get(self.precision)
            raise FloatingPointError(
                f"The training loss became {value} at epoch {self.current_epoch}, batch {batch} (checked at global step "
                f"{self.global_step}). Lower the learning rate, clip gradients (gradient_clip_val=1.0), check the data "
                "for NaN/inf" + (f", or use precision={bf16!r} instead of {self.precision!r}." if bf16 else ".")
            )
        self._loss_window = []
        self._loss_window_start += len(window)

    # -- validation schedule ------------------------------------------------------------------------------------------
    def _val_every_n_batches(self):
        if self._val_loader is None or self.val_check_interval is None:
            return None
        interval = self.val_check_interval
        if isinstance(interval, float):
            if not 0.0 < interval <= 1.0:
                raise ValueError(f"val_check_interval={interval}: a float must be a fraction of the epoch in (0, 1].")
            if interval == 1.0 or self.num_training_batches is None:
                return None
            return max(1, int(self.num_training_batches * interval))
        return int(interval)

    def _val_at_epoch_end(self, epoch):
        if self._val_loader is None:
            return False
        every = self.check_val_every_n_epoch
        return every is not None and (epoch + 1) % every == 0

    def _run_validation(self, epoch_end):
        if self.limit_val_batches == 0:
            return
        module = self.module
        if is_overridden("on_validation_model_zero_grad", module, TaskModule) or module.automatic_optimization:
            module.on_validation_model_zero_grad()  # Lightning clears the gradients before each validation
        values = self._evaluate("validate", self._val_loader, self.num_val_batches)
        if self.is_global_zero and values:
            self.log_to_loggers(self._metrics.logger_epoch_values(values))
        self._metrics.set_stage("train", True, False)

    # -- evaluation ---------------------------------------------------------------------------------------------------
    def _evaluate_entry(self, stage, module, loader, ckpt_path, gather):
        strategy = self.strategy
        with self._profile(f"[Strategy]{strategy.name}.setup_module_and_optimizers"):
            strategy.setup_module_and_optimizers(module, [], Plan(training=False))
        module.zero_grad()  # Lightning clears the gradients when each entry point starts
        limit_arg = {"validate": self.limit_val_batches, "test": self.limit_test_batches,
                     "predict": self.limit_predict_batches}[stage]
        if limit_arg == 0 and stage != "predict":
            return []  # Lightning's: limit_*_batches=0 skips the loop, its loader and its hooks
        name = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}[stage]
        loader = loader if loader is not None else self._loader_of(module, name)
        if loader is None:
            raise ValueError(f"Trainer.{stage} needs data: pass dataloaders= or datamodule=, or define {name}() on "
                             "the module.")
        if ckpt_path is not None:
            path = self._resolve_ckpt_path(ckpt_path)
            if path is not None:
                ckpt = strategy.load_checkpoint(path)
                module.on_load_checkpoint(ckpt)
                strategy.load_module_state_dict(ckpt["state_dict"])
        world_size, rank = self._shards()
        loaders = [prepare_eval_loader(one, world_size, rank) for one in _as_loaders(loader)]
        limits = [self._limit_eval(one, limit_arg) for one in loaders]
        setattr(self, {"validate": "num_val_batches", "test": "num_test_batches",
                       "predict": "num_predict_batches"}[stage], limits)
        self._watch()
        if stage == "predict":
            per_loader = self._predict(module, loaders, limits, gather)
            if per_loader is None:  # return_predictions=False
                return None
            return per_loader if len(loaders) > 1 else per_loader[0]  # a list per loader when there are several
        values = self._evaluate(stage, loaders, limits)
        if self.is_global_zero and values:
            self.log_to_loggers(self._metrics.logger_epoch_values(values))
        if self.is_global_zero and values and getattr(self, "_verbose", True):
            print(f"[tasktrain] {stage}: " + ", ".join(f"{k}={float(v):.4g}" for k, v in sorted(values.items())))
        # One dict per loader (Lightning's shape): its own suffixed metrics and those logged without a suffix.
        if len(loaders) == 1:
            return [{k: float(v) for k, v in values.items()}]
        return [{k: float(v) for k, v in values.items() if "/dataloader_idx_" not in k or
                 k.endswith(f"/dataloader_idx_{idx}")} for idx in range(len(loaders))]

    def _evaluate(self, stage, loaders, limits):
        """Run validation/test batches of each loader under inference_mode; returns the reduced epoch metrics.
        With several loaders the step and batch hooks get dataloader_idx, and self.log adds the
        "/dataloader_idx_N" suffix (Lightning's rule)."""
        module, strategy, metrics = self.module, self.strategy, self._metrics
        prefix = "validation" if stage == "validate" else stage
        step_fn = getattr(module, f"{prefix}_step")
        modes = _training_modes(module)  # each submodule's flag, given back at the end (Lightning's _ModuleMode)
        outer_stage = self.state.stage
        if not self.sanity_checking:
            self.state.stage = RunningStage(stage)
        getattr(module, f"on_{prefix}_model_eval")()
        metrics.set_stage(stage, False, True)
        hooks = self._all_hooks
        eval_step = strategy.eval_step if self.profiler is None else profiled(self.profiler, f"{prefix}_step",
                                                                              strategy.eval_step)
        state = self.state
        self._call(f"on_{prefix}_start")
        self._call(f"on_{prefix}_epoch_start")
        with torch.inference_mode() if self.inference_mode else torch.no_grad():
            for dataloader_idx, (loader, limit) in enumerate(zip(loaders, limits)):
                extra = (dataloader_idx,) if len(loaders) > 1 else ()
                metrics.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if extra else ""
                batches = loader if self.profiler is None else \
                    profiled_iter(loader, self.profiler, f"{prefix}_dataloader_next")
                for batch_idx, batch in watched_batches(self._watchdog, enumerate(batches), f"{prefix}_step",
                                                        lambda: state.global_step,
                                                        end_event=f"end of the {prefix} epoch"):
                    if limit is not None and batch_idx >= limit:
                        break
                    batch = self._eval_to_device(batch, dataloader_idx)
                    metrics.set_batch(batch)
                    for fn in hooks[f"on_{prefix}_batch_start"]:
                        fn(batch, batch_idx, *extra)
                    outputs = eval_step(step_fn, *step_arguments(step_fn, batch, batch_idx, *extra))
                    for fn in hooks[f"on_{prefix}_batch_end"]:
                        fn(outputs, batch, batch_idx, *extra)
            metrics.dataloader_suffix = ""
            for fn in self._module_hooks[f"on_{prefix}_epoch_end"]:
                fn()
            values = metrics.reduce_epoch(stage)
            for fn in self._callback_hooks[f"on_{prefix}_epoch_end"]:
                fn()
        self._call(f"on_{prefix}_end")
        # Lightning's: the module's on_<stage>_model_train where overridden, else each submodule's mode as it was (a
        # frozen BatchNorm the user put in eval mode stays so)
        if is_overridden(f"on_{prefix}_model_train", module, TaskModule):
            getattr(module, f"on_{prefix}_model_train")()
        else:
            _restore_training_modes(module, modes)
        self.state.stage = outer_stage
        return values

    def _predict(self, module, loaders, limits, gather):
        """The predictions of each loader (a list per loader); predict_step and the batch hooks get dataloader_idx
        when there are several."""
        modes = _training_modes(module)
        self.state.stage = RunningStage.PREDICTING
        module.on_predict_model_eval()
        # A prediction writer gets each batch's dataset indices; one that writes at the epoch's end, every prediction.
        from tasktrain.callbacks.prediction_writer import BasePredictionWriter

        writers = [c for c in self.callbacks if isinstance(c, BasePredictionWriter)]
        keep = getattr(self, "_return_predictions", True) or any(w.writes_on_epoch for w in writers)
        if writers:
            recorded = [record_batch_indices(loader) for loader in loaders]
            loaders = [loader for loader, _ in recorded]
            self.predict_batch_indices = [indices for _, indices in recorded]
        per_loader = [[] for _ in loaders]
        # what an epoch writer gets: the one loader's list, or a list per loader (Lightning's shape)
        self.predictions = per_loader[0] if len(loaders) == 1 else per_loader
        self._call("on_predict_start")
        self._call("on_predict_epoch_start")
        state = self.state
        eval_step = self.strategy.eval_step if self.profiler is None else profiled(self.profiler, "predict_step",
                                                                                   self.strategy.eval_step)
        with torch.inference_mode() if self.inference_mode else torch.no_grad():
            for dataloader_idx, (loader, limit) in enumerate(zip(loaders, limits)):
                extra = (dataloader_idx,) if len(loaders) > 1 else ()
                predictions = per_loader[dataloader_idx]
                batches = loader if self.profiler is None else \
                    profiled_iter(loader, self.profiler, "predict_dataloader_next")
                for batch_idx, batch in watched_batches(self._watchdog, enumerate(batches), "predict_step",
                                                        lambda: state.global_step):
                    if limit is not None and batch_idx >= limit:
                        break
                    batch = self._eval_to_device(batch, dataloader_idx)
                    self._call("on_predict_batch_start", batch, batch_idx, *extra)
                    out = eval_step(module.predict_step, *step_arguments(module.predict_step, batch, batch_idx, *extra))
                    if keep:
                        predictions.append(out)
                    self._call("on_predict_batch_end", out, batch, batch_idx, *extra)
        self._call("on_predict_epoch_end")
        self._call("on_predict_end")
        _restore_training_modes(module, modes)  # (Lightning calls no on_predict_model_train)
        self.predictions, self.predict_batch_indices = [], []  # the writers are done with them
        if not getattr(self, "_return_predictions", True):
            return None
        if gather and self.world_size > 1:
            return [_gather_predictions(self.strategy, predictions) for predictions in per_loader]
        return per_loader

    # -- metrics out -----------------------------------------------------------------------------------------------
    def _flush_step_metrics(self):
        values = self._metrics.step_metrics_for_logger()  # every rank: may synchronise sync_dist values
        if self.is_global_zero and values:
            self.log_to_loggers(values)

    def _flush_epoch_metrics(self, values):
        if self.is_global_zero and values:
            self.log_to_loggers(self._metrics.logger_epoch_values(values))

    def log_to_loggers(self, values):
        """Write `values` (numbers or scalar tensors) to every logger at the current global step, with the epoch,
        and record them in trainer.logged_metrics. Call it on rank 0 (loggers write there only)."""
        floats = {k: float(v) for k, v in values.items()}
        if not floats:
            return
        floats["epoch"] = float(self.current_epoch)
        self._logged_metrics.update(floats)
        for logger in self.loggers:
            logger.log_metrics(floats, self.global_step)

    # -- schedulers --------------------------------------------------------------------------------------------------
    def _step_schedulers(self, interval, plateau=None):
        """Step the schedulers of `interval`; plateau=True/False: only those that watch a metric / only the others."""
        module = self.module
        step_scheduler = module.lr_scheduler_step if is_overridden("lr_scheduler_step", module, TaskModule) else \
            _step_scheduler
        for config in self.lr_scheduler_configs:
            if config.interval != interval:
                continue
            if plateau is not None and plateau != (config.monitor is not None):
                continue
            count = self.global_step if interval == "step" else self.current_epoch + 1
            if count % config.frequency:
                continue
            if config.monitor is None:
                step_scheduler(config.scheduler, None)
                continue
            value = self.callback_metrics.get(config.monitor)
            if value is None:
                if self.sanity_checking:
                    continue
                if not config.strict:
                    continue
                raise KeyError(
                    f"The scheduler {type(config.scheduler).__name__} monitors {config.monitor!r}, which was not "
                    f"logged. Logged metrics: {sorted(self.callback_metrics)}. Log it with self.log({config.monitor!r}, "
                    "...) or change 'monitor'."
                )
            step_scheduler(config.scheduler, float(value))

    # -- stopping ------------------------------------------------------------------------------------------------------
    def _stop_agreed(self, at_interval):
        """Stop requests (should_stop, SIGTERM) are agreed by all ranks at fixed points, so they stop together.

        One process: at every step. Several: at every log_every_n_steps-th step and at every epoch end, one
        small all-reduce there; never a collective per step.
        """
        local = self.should_stop or self._preempted
        if self.world_size > 1:
            if at_interval and self.global_step % self.log_every_n_steps:
                return False
            flags = self.strategy.reduce(torch.tensor([float(self.should_stop), float(self._preempted)]), op="max")
            self.should_stop, self._preempted = bool(flags[0]), bool(flags[1])
            local = self.should_stop or self._preempted
        if self._preempted:
            self.should_stop = True
            self._save_preemption_checkpoint()
        return local

    def _stopping_for_signal(self):
        return self._preempted and self.should_stop

    def _install_sigterm_handler(self):
        if threading.current_thread() is not threading.main_thread():
            return None
        strategy = self.strategy

        def on_sigterm(signum, frame):
            if self._preempted:
                return
            self._preempted = True
            if isinstance(strategy, MultiProcess):
                strategy.forward_signal(signal.SIGTERM)  # to the workers it started itself, if any

        return signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm_handler(self, previous):
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

    def _save_preemption_checkpoint(self):
        if self._preempt_path:
            return
        directory = self.checkpoint_callback.dirpath_resolved(self) if self.checkpoint_callback else \
            os.path.join(self.log_dir, "checkpoints")
        path = os.path.join(directory, f"preempted-epoch={self.current_epoch}-step={self.global_step}.ckpt")
        self.save_checkpoint(path)
        self._preempt_path = path
        if self.is_global_zero:
            print(f"[tasktrain] SIGTERM: finished step {self.global_step}, saved {path}", file=sys.stderr, flush=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def dump_checkpoint(self, weights_only=False) -> dict:
        """The checkpoint dict (see tasktrain/checkpoint_io.py for every key). Called on every rank."""
        module = self.module
        checkpoint = self._run_state(weights_only).state_dict()
        checkpoint.update(hyper_parameters=_plain(dict(module.hparams)), weights_only=bool(weights_only),
                          world_size=self.world_size)
        if self.datamodule is not None and self.datamodule.hparams:
            checkpoint["datamodule_hyper_parameters"] = _plain(dict(self.datamodule.hparams))
        module.on_save_checkpoint(checkpoint)
        for cb in self.callbacks:
            if is_overridden("on_save_checkpoint", cb, Callback):
                cb.on_save_checkpoint(self, module, checkpoint)
        return checkpoint

    def _run_state(self, weights_only=False):
        """This run's state as stateful parts (tasktrain/trainer/run_state.py), under the checkpoint's keys."""
        strategy = self.strategy
        parts = {"state_dict": Weights(strategy), "train_state": self.state}
        data = self._loader_data
        if not weights_only and isinstance(data, StatefulLoaderData):
            # a StatefulDataLoader over data whose order is its own: every rank's loader state, in rank order,
            # beside the position (restored on the same number of processes: _restore_train_state)
            def train_state():
                states = strategy.all_gather_object(data.loader_state(self.state.batch_in_epoch))
                return {**self.state.state_dict(), "loader_states": states}

            parts["train_state"] = Value(train_state, self.state.load_state_dict)
        if not weights_only:
            parts.update(
                optimizer_states=Optimizers(strategy, self.optimizers),
                optimizer_param_names=Value(lambda: [strategy.optimizer_param_names(o) for o in self.optimizers]),
                lr_schedulers=Objects([config.scheduler for config in self.lr_scheduler_configs]),
                precision=strategy.precision, callbacks=Callbacks(self.callbacks),
                metrics=self._metrics if self._metrics is not None else Value({}),
                rng_states=RandomStates(strategy))
            if self.datamodule is not None:  # under its class name, as Lightning keeps it
                parts[type(self.datamodule).__qualname__] = self.datamodule
        return RunState(parts)

    def save_checkpoint(self, filepath, weights_only=False):
        """Write a checkpoint (call on every rank; rank 0 writes). A full checkpoint becomes the 'last' pointer."""
        started = time.perf_counter()
        with self.long_event("save_checkpoint"):  # may take long: not a stall (issue 19)
            self.strategy.wait_for_checkpoint()  # issue 29: a background write in flight ends first ("last" moves forward)
            with self._profile("save_checkpoint"):
                checkpoint = self.dump_checkpoint(weights_only)
                self.strategy.save_checkpoint(checkpoint, filepath)
            if not weights_only and self.is_global_zero:
                ckpt_io.write_last_pointer(self.default_root_dir, filepath, self.global_step, self.current_epoch)
        self.checkpoint_seconds += time.perf_counter() - started

    # -- the watchdog (issue 19, tasktrain/strategies/watchdog.py) ----------------------------------------------------
    def long_event(self, name, timeout=None):
        """`with trainer.long_event("generate samples"):` work that may take longer than stall_timeout without
        progress marks; with `timeout` (seconds) it has a deadline of its own. A no-op without a watchdog."""
        if self._watchdog is None:
            return contextlib.nullcontext()
        return self._watchdog.long_event(name, timeout)

    def _watch(self):
        if self._watchdog is not None and not self._watching:
            self._watchdog.arm(self.stall_timeout, self.default_root_dir)
            self._watching = True

    def _unwatch(self):
        if self._watching:
            self._watchdog.disarm()
            self._watching = False
        self._watchdog = None  # the trainer stays picklable between runs

    def _restart_ckpt_path(self, ckpt_path):  # issue 29 (the rule: checkpoint_io.restart_checkpoint)
        resolved = ckpt_io.restart_checkpoint(self.default_root_dir, ckpt_path)
        if ckpt_io.restart_count() and self.is_global_zero:
            print(f"[tasktrain] restart {ckpt_io.restart_count()} of this launch: resuming from "
                  f"{resolved or 'scratch (no complete checkpoint of this launch yet)'}", flush=True)
        return resolved

    def _wait_for_checkpoint_write(self, status):  # issue 29: returns the write's error, for _teardown to raise
        try:
            self.strategy.wait_for_checkpoint(release=True)
        except Exception as err:
            if status != "failed":
                return err
            print(f"[tasktrain] {err}", file=sys.stderr, flush=True)  # the run's own error is the one raised
        return None

    def _resolve_ckpt_path(self, ckpt_path):
        if ckpt_path == "best":
            best = self.checkpoint_callback.best_model_path if self.checkpoint_callback else ""
            if not best:
                raise ValueError("ckpt_path='best': no ModelCheckpoint of this trainer has saved a checkpoint yet; "
                                 "fit first, or pass a path.")
            return best
        if ckpt_path == "last":
            path = ckpt_io.read_last_pointer(self.default_root_dir)
            if path is None and self.is_global_zero:
                print(f"[tasktrain] ckpt_path='last': no checkpoint recorded under {self.default_root_dir}; "
                      "starting from scratch.", flush=True)
            return path
        return os.fspath(ckpt_path)

    def _restore(self, ckpt_path):
        """Load everything but the loop's position and the RNG; returns what _restore_position needs (None: no
        checkpoint)."""
        path = self._resolve_ckpt_path(ckpt_path)
        self._resumed_from = path
        if path is None:
            return None
        strategy, module = self.strategy, self.module
        ckpt = upgrade(strategy.load_checkpoint(path))
        if ckpt.get("weights_only"):
            raise ValueError(
                f"{path} was saved with save_weights_only=True: it holds the weights but no optimizer, scheduler or "
                "loop state, so training cannot resume from it. Use it for inference "
                f"({type(module).__name__}.load_from_checkpoint(path)) or start a new fit from those weights."
            )
        module.on_load_checkpoint(ckpt)
        for cb in self.callbacks:
            if is_overridden("on_load_checkpoint", cb, Callback):
                cb.on_load_checkpoint(self, module, ckpt)
        run_state = self._run_state()
        run_state.load_state_dict(ckpt, only=["state_dict"])
        check_counts(ckpt, "optimizer_states", len(self.optimizers), lambda saved: (
            f"{path} has {saved} optimizer states but configure_optimizers returned {len(self.optimizers)} "
            "optimizers."))
        # the loop's position (train_state) is restored on the data it will continue (_restore_position)
        run_state.load_state_dict(ckpt, only=["optimizer_states", "lr_schedulers", "precision", "callbacks",
                                              "metrics", "rng_states"])
        if self.datamodule is not None and type(self.datamodule).__qualname__ in ckpt:
            run_state.load_state_dict(ckpt, only=[type(self.datamodule).__qualname__])
            self._datamodule_restored = True
        # the data order's seed now: loaders rebuilt after a DataModule restore follow the saved order
        self.state.data_seed = ckpt["train_state"].get("data_seed", self.state.data_seed)
        return (path, ckpt["train_state"], int(ckpt.get("world_size", self.world_size)),
                run_state.parts["rng_states"].loaded)

    def _restore_position(self, path, saved, saved_world, rng_states, data):
        """The loop's position from the checkpoint's train state, on this run's number of processes and batches and
        on the training data as it will be trained (rebuilt after a DataModule restore); returns what restores the
        RNG, to call once the loop is about to continue."""
        state = self.state
        self._restore_train_state(path, saved, saved_world, data)
        if self.is_global_zero:
            print(f"[tasktrain] resumed from {path} at epoch {state.epoch}, global step {state.global_step}, "
                  f"batch {state.batch_in_epoch} of the epoch", flush=True)
        return rng_restore_of_this_rank(rng_states, self.strategy, path, state.data_seed, state.global_step)

    def _restore_train_state(self, path, saved, saved_world, epochs):
        state = self.state
        global_batch = state.global_batch_size  # this run's
        state.load_state_dict(saved)
        state.data_seed = saved.get("data_seed", state.data_seed)
        shard_world = self._shards()[0]  # the global order is sharded over this many (1: use_distributed_sampler=False)
        saved_global_batch = saved.get("global_batch_size") or (
            global_batch // shard_world * saved_world if global_batch else 0)  # written before it was recorded
        state.global_batch_size = global_batch
        if state.epoch_finished:
            state.epoch += 1
            state.batch_in_epoch = state.samples_in_epoch = 0
            state.epoch_finished = False
            return
        accumulate = self.accumulate_grad_batches if self.module.automatic_optimization else 1
        # Each rank read the loader as the user built it (use_distributed_sampler=False): how the ranks split the
        # data is theirs, so the position of each rank's loader says nothing about which samples the ranks of
        # another world have left.
        users_split = None if self.use_distributed_sampler else (
            "with use_distributed_sampler=False each process reads the training loader as you built it, so the "
            "Trainer cannot tell which samples the other processes had trained on, nor which are left for "
            f"{self.world_size}")
        epochs.resume(saved, saved_world, accumulate, source=path, epoch_name=f"epoch {state.epoch}",
                      world=self.world_size, own_order_reason=users_split,
                      order_remedy="let the Trainer shard the data (use_distributed_sampler=True, a plain DataLoader "
                                   "with shuffle=True or False, no sampler) so that the epoch continues exactly")
        loader_states = saved.get("loader_states")
        if isinstance(epochs.data, StatefulLoaderData) and loader_states and len(loader_states) == self.world_size:
            epochs.data.load_loader_state(loader_states[self.global_rank])  # another world: refused just above
        if saved_global_batch and global_batch and saved_global_batch != global_batch and self.is_global_zero:
            per_batch = global_batch // shard_world // accumulate
            warn_global_batch_change(
                path, saved_global_batch, global_batch,
                f"{shard_world} process{'es' if shard_world > 1 else ''} x {per_batch} per batch x {accumulate} "
                "accumulated", state.samples_in_epoch)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _accumulation_schedule(self):
        """The epochs at which a GradientAccumulationScheduler changes the window: the plan tells the strategy, so an
        engine that fixes the window at set-up refuses it there."""
        from tasktrain.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler

        for cb in self.callbacks:
            if isinstance(cb, GradientAccumulationScheduler):
                return tuple(cb.accumulation_schedule.items())
        return ()

    def _clipping_requests(self):
        """The clipping the GradientClipping callbacks (gradient_clip_val adds one) ask for at every optimizer step:
        the plan tells the strategy, so an engine that clips inside its step is set up with it."""
        from tasktrain.callbacks.clipping import GradientClipping

        return tuple(request for cb in self.callbacks if isinstance(cb, GradientClipping) for request in cb.requests)

    def _limit(self, data, limit, name):
        length = len(data) if data.has_len() else None
        return _apply_limit(length, limit, name)

    def _limit_eval(self, loader, limit):
        try:
            length = len(loader)
        except TypeError:
            length = None
        return _apply_limit(length, limit, "limit_*_batches")

    def _sanity_limit(self, loader):
        limit = self._limit_eval(loader, self.limit_val_batches)
        steps = self.num_sanity_val_steps
        if steps == -1:
            return limit
        return steps if limit is None else min(steps, limit)


_ORDER_WARNED = set()


def _warn_hook_order(module, callbacks):
    """Where the module and a callback of the user's both override an event, the module's runs first here and
    second in Lightning (docs/lightning.md, deliberate differences): said once per process and class pair."""
    for cb in callbacks:
        if type(cb).__module__.startswith("tasktrain."):
            continue
        both = [e for e in EVENTS if e not in ("state_dict", "load_state_dict", "on_exception")
                and is_overridden(e, cb, Callback) and is_overridden(e, module, TaskModule)]
        key = (type(module), type(cb))
        if both and key not in _ORDER_WARNED:
            _ORDER_WARNED.add(key)
            warnings.warn(f"{type(module).__name__} and the callback {type(cb).__name__} both override "
                          f"{', '.join(both)}: tasktrain runs the module's hook first, then the callback's (Lightning "
                          "runs the callback's first). See docs/lightning.md, 'Deliberate differences'.")


def _training_modes(module):
    return {name: sub.training for name, sub in module.named_modules()}


def _restore_training_modes(module, modes):
    for name, sub in module.named_modules():
        if name in modes:
            sub.training = modes[name]


def _as_loaders(loader):
    """Evaluation loaders as a list: several in a list, tuple or dict (in its order, Lightning's sequential mode)."""
    if isinstance(loader, dict):
        return list(loader.values())
    if isinstance(loader, (list, tuple)):
        if not loader:
            raise ValueError("An empty list of evaluation dataloaders: pass at least one, or None.")
        return list(loader)
    return [loader]


def _step_scheduler(scheduler, metric):
    if metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)


def _in_call_order(callbacks):
    """Loggers first, checkpointing last: a checkpoint holds the state of every other callback at that point."""
    from tasktrain.callbacks import ModelCheckpoint

    return sorted(callbacks, key=lambda c: 0 if isinstance(c, Logger) else 2 if isinstance(c, ModelCheckpoint) else 1)


# Lightning hooks tasktrain does not call: overriding one is an error at fit() start, with what to do instead.
_REFUSED_HOOKS = {
    "optimizer_step": "the loop steps the optimizer through the strategy (gradient scaler, DeepSpeed's engine). To act "
                      "before the step use on_before_optimizer_step; for learning-rate warm-up, a scheduler with "
                      "interval='step'; for anything else, manual optimisation (self.automatic_optimization = False).",
    "optimizer_zero_grad": "the loop zeroes gradients with set_to_none=True at each accumulation window's first "
                           "backward through the strategy. Remove the override, use on_before_zero_grad, or manual "
                           "optimisation.",
    "backward": "the strategy runs backward (loss scaling, DeepSpeed's engine). Use on_before_backward / "
                "on_after_backward, or manual optimisation with self.manual_backward(loss).",
    "configure_gradient_clipping": "clipping is set with Trainer(gradient_clip_val=..., gradient_clip_algorithm=...) "
                                   "or the GradientClipping callback; for a rule of your own, clip in "
                                   "on_before_optimizer_step with self.trainer.strategy.clip_gradients(optimizer, "
                                   "max_norm=...), which unscales the gradients first.",
    "configure_sharded_model": "it is deprecated in Lightning; rename it to configure_model.",
}


def _check_limit(value, name):
    """A batch limit: a fraction in [0, 1] (float) or a count (int >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
            (isinstance(value, float) and value > 1.0):
        raise ValueError(f"{name}={value!r}: a float is a fraction of the loader in [0, 1]; an int is a batch count.")
    return value


def _apply_limit(length, limit, name):
    if limit is None:
        return length
    if isinstance(limit, float):
        if not 0.0 <= limit <= 1.0:
            raise ValueError(f"{name}={limit}: a float is a fraction of the loader in [0, 1]; an int is a batch count.")
        if length is None:
            raise ValueError(f"{name}={limit} is a fraction, but the loader has no length: use an int batch count.")
        return int(length * limit) if limit < 1.0 else length
    limit = int(limit)
    return limit if length is None else min(limit, length)


class _StageRun:
    """One stage of the Trainer, as strategy.launch runs it on every rank: `run(train_loader, eval_loader)`.

    A strategy that starts the ranks in new processes (ddp_spawn) pickles it to them; rank 0 sends back
    `collect(result)`, and `restore(collected)` puts that into this process's trainer and module."""

    def __init__(self, trainer, stage, module, ckpt_path, gather, compiled=None):
        self.trainer, self.stage, self.module, self.ckpt_path, self.gather = trainer, stage, module, ckpt_path, gather
        self.compiled = compiled  # the torch.compile wrapper the stage was given (its settings compile the module)

    def __call__(self, train_loader, eval_loader):
        return self.trainer._run_stage(self.stage, self.module, train_loader, eval_loader, self.ckpt_path, self.gather,
                                       self.compiled)

    def collect(self, result):
        trainer = self.trainer
        return {
            "state_dict": self.module.state_dict(),
            "train_state": trainer.state.state_dict(),
            "callback_metrics": dict(trainer.callback_metrics),
            "logged_metrics": dict(trainer.logged_metrics),
            "callbacks": Callbacks(trainer.callbacks).state_dict(),
            "result": result,
        }

    def restore(self, collected):
        trainer, module = self.trainer, self.module
        module.load_state_dict(collected["state_dict"])
        module.trainer = trainer
        trainer.module = module
        trainer.state.load_state_dict(collected["train_state"])
        trainer._callback_metrics_cache = collected["callback_metrics"]
        trainer._logged_metrics = collected["logged_metrics"]
        Callbacks(trainer.callbacks).load_state_dict(collected["callbacks"])
        return collected["result"]


_NULL = contextlib.nullcontext()


def _no_profile(action_name):
    return _NULL


def _is_one(value):
    return type(value) is int and value == 1


def _batch_size_of(loader):
    """Samples per micro-batch of a training loader, where it says (None: a custom batch sampler, ...)."""
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if size else None


def _plain(value):
    """Hyper-parameters must load with weights_only=True: keep plain data, turn the rest into strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str, bool, type(None), torch.Tensor)):
        return value
    return repr(value)


def _gather_predictions(strategy, predictions):
    """Every rank's predictions in dataset order (ranks hold samples r, r+W, ... of an unpadded shard)."""
    gathered = strategy.all_gather_object([p.cpu() if isinstance(p, torch.Tensor) else p for p in predictions])
    if all(isinstance(p, torch.Tensor) for rank in gathered for p in rank):
        rows = [torch.cat(rank) if rank else None for rank in gathered]
        total = sum(r.shape[0] for r in rows if r is not None)
        out = [None] * total
        for rank, tensor in enumerate(rows):
            for i in range(0 if tensor is None else tensor.shape[0]):
                out[rank + i * len(rows)] = tensor[i]
        return torch.stack(out) if out else torch.empty(0)
    return gathered


def _check_loggers(loggers):
    loggers = list(loggers)
    for logger in loggers:
        if not isinstance(logger, Logger):
            raise TypeError(f"logger=[..., {logger!r}, ...]: every item must be a Logger (tasktrain.loggers: "
                            "TensorBoardLogger, CSVLogger, WandbLogger, MLFlowLogger, or a Logger subclass).")
    return loggers
