"""Trainer: the facade. Its arguments, properties and entry points (fit / validate / test / predict) are here; the
work is in rooms of tasktrain/trainer/ a reader can name:

    arguments.py    checks of the arguments, fast_dev_run's rewrites, global torch flags, the callbacks it adds
    fit_state.py    FitState: the state of one fit (optimizers, schedulers, epoch iterator, hook tables, the
                    step's parts, the loss window, stop flags), built once in Trainer._fit
    loop.py         fit_loop -> train_epoch -> training_step: one optimizer step on one screen
    evaluation.py   validate / test / predict (and fit's validation)
    resume.py       what a checkpoint holds (dump_checkpoint) and how a fit resumes from one (restore)
    loaders.py      the fit's data: each loader requested when first needed, the training one prepared once, the
                    validation loaders counted, reloads

Here: the run of a stage on every rank (`_run_stage`), the fit's set-up before its loop (`_fit`, in Lightning's
order: resume, optimizers, strategy, sanity check, data), metrics out to the loggers, save_checkpoint and the watchdog.
"""
import contextlib
import inspect
import logging
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, List, Literal, Optional, Union

import torch

from tasktrain import checkpoint_io as ckpt_io
from tasktrain.callbacks.base import Callback, Logger
from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.compiled import compile_forward_as, unwrap_compiled
from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning, _TunerExitException
from tasktrain.plugins import CheckpointIO, ClusterEnvironment, LayerSync
from tasktrain.plugins.precision import _PRECISION_PLUGIN
from tasktrain.plugins.layer_sync import TorchSyncBatchNorm
from tasktrain.profilers import PassThroughProfiler, Profiler, module_action, resolve_profiler
from tasktrain.strategies import requeue
from tasktrain.strategies.base import MultiProcess, Plan, Sharded, Strategy
from tasktrain.strategies.environment import warn_if_srun_unused
from tasktrain.strategies.loop_hooks import check_loop_overrides
from tasktrain.strategies.parallel import ParallelStrategy
from tasktrain.strategies.watchdog import DEFAULT_STALL_TIMEOUT
from tasktrain.trainer import strategy_hooks
from tasktrain.trainer import (arguments, evaluation, guards, lightning_connectors, lightning_loops, loaders, loop,
                               plugin_args, resume, run)
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.fit_state import (accumulation_schedules, build_fit_state, check_optimization_hooks,
                                         clipping_callbacks)
from tasktrain.trainer.loader_init import recording_init_args
from tasktrain.trainer.metrics import hook_scope
from tasktrain.trainer.module import TaskModule, is_overridden
from tasktrain.trainer.optim import parse_optimizers
from tasktrain.trainer.run_state import Callbacks
from tasktrain.trainer.runtime import broadcast_seed, build_runtime, check_run_allocation
from tasktrain.trainer.seed import isolate_rng, sampler_seed
from tasktrain.trainer.state import TrainState
from tasktrain.trainer.states import GradClipAlgorithmType
from tasktrain.trainer.states import RunningStage, TrainerFn, TrainerStatus


# Lightning's types of the precision and plugins arguments (TaskCLI parses the command line and config files by them)
_PRECISION_INPUT = Union[
    Literal[64, 32, 16],
    Literal["transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
            "32-true", "64-true"],
    Literal["64", "32", "16", "bf16"],
]
_PLUGIN_INPUT = Union[_PRECISION_PLUGIN, ClusterEnvironment, CheckpointIO, LayerSync]


class Trainer:
    checkpoint_seconds = 0.0  # this process's time in save_checkpoint, summed (read by ThroughputMonitor)
    _batch_transfer = None  # the run's transfer_batch_to_device + on_after_batch_transfer (run.batch_mover)
    # Lightning's loop attributes: views of this Trainer's state (lightning_loops.py)
    fit_loop = lightning_loops.LoopAttribute(lightning_loops.FitLoop)
    validate_loop = lightning_loops.LoopAttribute(lightning_loops.EvaluationLoop, "validate")
    test_loop = lightning_loops.LoopAttribute(lightning_loops.EvaluationLoop, "test")
    predict_loop = lightning_loops.LoopAttribute(lightning_loops.PredictionLoop)
    # Lightning's connector attributes: read views of this Trainer (lightning_connectors.py), no connectors
    _checkpoint_connector = lightning_connectors.ConnectorAttribute(lightning_connectors.CheckpointConnector)
    _accelerator_connector = lightning_connectors.ConnectorAttribute(lightning_connectors.AcceleratorConnector)
    _data_connector = lightning_connectors.ConnectorAttribute(lightning_connectors.DataConnector)
    _logger_connector = lightning_connectors.ConnectorAttribute(lightning_connectors.LoggerConnector)

    @property
    def _detect_anomaly(self):
        """Lightning's private name of Trainer(detect_anomaly=...) (read only; tasktrain's is `detect_anomaly`)."""
        return self.detect_anomaly

    @property
    def _evaluation_loop(self):
        """Lightning's: the evaluation loop of the run in progress (callbacks such as ThroughputMonitor read its
        batch_progress)."""
        loop = {TrainerFn.FITTING: self.fit_loop.epoch_loop.val_loop, TrainerFn.VALIDATING: self.validate_loop,
                TrainerFn.TESTING: self.test_loop}.get(self.state.fn)
        if loop is None:
            raise RuntimeError("The `Trainer._evaluation_loop` property isn't defined. Accessed outside of scope")
        return loop

    @arguments.defaults_from_env
    def __init__(
        self,
        *,
        accelerator: Union[str, Accelerator] = "auto",
        strategy: Union[str, Strategy] = "auto",  # (Lightning's annotations throughout: TaskCLI parses by them)
        devices: Union[list[int], str, int] = "auto",
        num_nodes: Optional[int] = None,
        precision: Optional[_PRECISION_INPUT] = None,
        max_epochs: Optional[int] = None,
        max_steps: int = -1,
        limit_train_batches: Optional[Union[int, float]] = None,
        limit_val_batches: Optional[Union[int, float]] = None,
        limit_test_batches: Optional[Union[int, float]] = None,
        limit_predict_batches: Optional[Union[int, float]] = None,
        val_check_interval: Optional[Union[int, float, str, timedelta, dict[str, int]]] = None,
        check_val_every_n_epoch: Optional[int] = 1,
        num_sanity_val_steps: Optional[int] = None,  # None: Lightning's (2; barebones: 0 and a given one refused)
        accumulate_grad_batches: int = 1,
        gradient_clip_val: Optional[Union[int, float]] = None,
        gradient_clip_algorithm: Optional[str] = None,
        callbacks: Optional[Union[List[Callback], Callback]] = None,
        logger: Optional[Union[Logger, Iterable[Logger], bool]] = None,
        enable_progress_bar: Optional[bool] = None,
        enable_checkpointing: Optional[bool] = None,
        log_every_n_steps: Optional[int] = None,
        default_root_dir: Optional[Union[str, Path]] = None,
        deterministic: Optional[Union[bool, Literal["warn"]]] = None,
        max_time: Optional[Union[str, timedelta, dict[str, int]]] = None,
        stall_timeout: Optional[float] = DEFAULT_STALL_TIMEOUT,
        enable_model_summary: Optional[bool] = None,
        profiler: Optional[Union[Profiler, str]] = None,
        fast_dev_run: Union[int, bool] = False,
        min_epochs: Optional[int] = None,
        min_steps: Optional[int] = None,
        overfit_batches: Union[int, float] = 0.0,
        benchmark: Optional[bool] = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        detect_anomaly: bool = False,
        barebones: bool = False,
        plugins: Optional[Union[_PLUGIN_INPUT, list[_PLUGIN_INPUT]]] = None,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        max_restarts: int = 0,
        enable_autolog_hparams: bool = True,
        model_registry: Optional[str] = None,
    ):
        self.barebones = barebones  # Lightning's: checked before anything else is built
        (logger, enable_checkpointing, enable_progress_bar, log_every_n_steps, enable_model_summary,
         num_sanity_val_steps) = arguments.barebones_settings(
            barebones, logger, enable_checkpointing, enable_progress_bar, log_every_n_steps, enable_model_summary,
            num_sanity_val_steps, fast_dev_run, detect_anomaly, profiler)
        # as given, for Lightning's trainer._accelerator_connector._strategy_flag (lightning_connectors.py)
        self._given_flags = {"strategy": strategy.lower() if isinstance(strategy, str) else strategy}  # (as Lightning's)
        found = plugin_args.plugins_of(plugins, precision, sync_batchnorm, strategy)  # Lightning's plugins= rules
        # The Accelerator's rules too; arguments left at their defaults let `tasktrain launch`'s config fill them.
        runtime = build_runtime(
            accelerator=accelerator, strategy=strategy, devices=devices, num_nodes=num_nodes,
            precision=precision if found.precision is None else found.precision.name,
            accumulate_grad_batches=None if arguments.is_one(accumulate_grad_batches) else accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val, stall_timeout=stall_timeout,
            fp16_on_cpu_as_bf16=found.precision is None,  # (a MixedPrecision("16-mixed", "cpu") plugin keeps fp16)
        )
        arguments.refuse_lightning_only(barebones, plugins, max_restarts)
        self._model_registry = arguments.model_registry_name(model_registry)  # Lightning's (the name, no version)
        self.enable_autolog_hparams = enable_autolog_hparams  # Lightning's: False skips _log_hyperparams entirely
        # Lightning's connector, where no environment is given, asks torchrun first, then SLURM (whose detect() gives
        # the srun hint), then LSF and MPI (apply_plugins): the hint is said before LSF / MPI are looked for
        if found.environment is None and runtime.strategy.cluster_environment is None and \
                not torch.distributed.is_torchelastic_launched():
            warn_if_srun_unused()
        self._requeue_settings = plugin_args.apply_plugins(found, runtime.strategy, runtime.env)  # SLURMEnvironment's
        # A LayerSync wraps the module of a fit under a multi-process strategy (_fit) and is reverted at its end, as
        # Lightning's parallel strategies do; sync_batchnorm=True is TorchSyncBatchNorm(), as Lightning's connector
        sync_batchnorm = sync_batchnorm or type(found.layer_sync) is TorchSyncBatchNorm
        self._layer_sync = TorchSyncBatchNorm() if found.layer_sync is None and sync_batchnorm else found.layer_sync
        self._applied_layer_sync = None  # the one applied to this fit's module, reverted at its end (run.py)
        self._stage_plugins_ended = True  # a run's plugins torn down (run.end_stage_plugins)
        self.env, self.strategy = runtime.env, runtime.strategy
        check_loop_overrides(self.strategy)  # an override of Lightning's the Trainer cannot call: refused here
        if self._layer_sync is not None and isinstance(self.strategy, ParallelStrategy):
            self.strategy._layer_sync = self._layer_sync  # (Lightning's connector: a custom strategy may read it)
        self.accelerator  # Lightning's strategy.accelerator: the Accelerator object from here on (the property below)
        self.devices, self.num_nodes, self.accumulate_grad_batches = (
            runtime.devices, runtime.num_nodes, runtime.accumulate_grad_batches)
        # read by the step's clipping (TaskModule.configure_gradient_clipping's values) and TaskModule.clip_gradients
        self.gradient_clip_val, self.gradient_clip_algorithm = runtime.gradient_clip_val, gradient_clip_algorithm
        self.stall_timeout = runtime.stall_timeout  # watchdog (issue 19): seconds without progress, or None
        self.max_restarts = self.strategy.max_restarts = max_restarts  # issue 29: torch elastic's restarts
        arguments.log_device_info(self.strategy, found.precision)  # (Lightning's place: before the profiler)
        # None without a profiler: the loop then wraps nothing (trainer.profiler reads a PassThroughProfiler, as
        # Lightning's, so that `with trainer.profiler.profile(name):` in a module's code always works)
        self._profiler = resolve_profiler(profiler)  # bound again at each run's start (run.start_stage)
        self._no_profiler = None
        self._profile = run.no_profile
        limits, logger = arguments.loop_limits(
            fast_dev_run, overfit_batches, min_epochs, min_steps, max_epochs, max_steps,
            (limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches),
            num_sanity_val_steps, val_check_interval, check_val_every_n_epoch, logger)
        self.__dict__.update(limits)  # fast_dev_run, max_epochs, max_steps, limit_*_batches, ... (arguments.py)
        self._max_epochs_unset = max_epochs is None and not fast_dev_run  # decided at fit's start (run.start_stage)
        self.__dict__.update(arguments.run_flags(  # log_every_n_steps, default_root_dir, ... (arguments.py)
            min_steps, log_every_n_steps, default_root_dir, enable_checkpointing, inference_mode,
            use_distributed_sampler, detect_anomaly, sync_batchnorm, reload_dataloaders_every_n_epochs))
        arguments.set_torch_flags(deterministic, benchmark)
        self._loggers = arguments.resolve_loggers(logger, self.default_root_dir)  # what logger= gave (Lightning's)
        self.callbacks = arguments.default_callbacks(
            callbacks, self.default_root_dir, self._loggers, enable_progress_bar, enable_checkpointing,
            self.gradient_clip_val, gradient_clip_algorithm, max_time, enable_model_summary)
        # Lightning, without litmodels' LitModelCheckpoint, says once (at the first run's start) that litmodels would
        # upload the checkpoints of the default ModelCheckpoint it adds (run.attach_module_callbacks)
        self._pending_litmodels_tip = arguments.adds_default_checkpoint(callbacks, enable_checkpointing)
        if gradient_clip_algorithm is not None:  # (checked there) Lightning's enum, what the clipping hooks receive
            self.gradient_clip_algorithm = GradClipAlgorithmType(gradient_clip_algorithm.lower())
        self.state, self.optimizers, self.lr_scheduler_configs = TrainState(), [], []
        self._module = self.datamodule = None  # datamodule: the last entry point's (Lightning's trainer.datamodule)
        self._given_module = None  # what the last run was given: the module, or torch.compile(module)
        # (module, datamodule) the last entry point or _data_connector.attach_data was given (the datamodule None
        # where none was): whose shared data hooks run, Lightning's _DataHookSelector, which each attach replaces
        # (trainer.datamodule stays for the loaders of later runs)
        self._attached = (None, None)
        self._metrics, self._callback_metrics_cache, self._logged_metrics = None, {}, {}
        self._fx_outside_run = None  # the hook called outside a run (metrics.hook_scope), for module._current_fx_name
        self._set_hook_tables(None)
        self._watchdog, self._watching = None, False
        # the last fit stopped inside an epoch (current_epoch counts it, as Lightning's); kept past that fit's end
        # (validate/test after it see the same current_epoch), folded into the counters when the next fit starts
        self._epoch_cut_short = False
        self._ckpt_user_path = None  # trainer.ckpt_path = ...: what every run loads until it is set to None
        self._said_once = set()  # messages Lightning's loops say once per Trainer (their warning caches)
        # evaluation batches completed, [total, in the run] (lightning_loops.py): fit's validations (the total from
        # each training epoch's start, as Lightning's val_loop), validate's and test's (over the Trainer's runs)
        self._eval_phase = {"val": None, "validate": None, "test": None}  # (the batch being evaluated: evaluation.py)
        self._eval_has_run = {"val": False, "validate": False, "test": False}  # (Lightning's loops' _has_run)
        # predict_loop's view: batches completed [total, in the run], how far the batch in progress got, whether it
        # is the last, the batch writer's indices of the batch, the last run's predictions (evaluation._predict)
        self._predict_counts, self._predict_phase, self._predict_is_last = [0, 0], None, False
        self._predict_current_indices, self._predict_kept = [], []
        # The batch counts of each loop (Lightning's num_*_batches): one per loader (None: no length), set when the
        # loop's loaders are, kept after its run until they are set again (Lightning's loops keep theirs). The
        # properties below read them in Lightning's form (inf for no length).
        self._num_training_batches = None  # batches of the epoch being trained (a resumed epoch: what is left + done)
        self._counts = {"fit": [], "validate": [], "test": [], "predict": []}  # ("fit": its validation)
        # Lightning's: set by the SIGTERM handler, False again where each run installs it (guards.py, issue 37), kept
        # after the run (its on_exception hooks and the script read it)
        self.received_sigterm = False
        self._sigterm_previous = None  # the SIGTERM handler the run replaced (guards.restore_sigterm_handler)
        # Hooks a tuner's trial run does not call (tuning._tuning sets them): Lightning's trials run its fit loop
        # alone, without on_fit_start / on_fit_end, and from inside a run without the set-up and teardown hooks
        self._trial_skips = ()
        # a finder's (tuning._tuning): the callbacks of the run it searches from, and the checkpoint dict it "saved"
        self._trial_callbacks = self._trial_checkpoint = None
        self._trial_counters_shown = None  # (TrainState, epoch cut short) a trial's loader hooks read (_loader_of)
        self._predict_none_warned = False  # Lightning warns once per Trainer (its loop's cache) when predict_step returns None
        self._reset_run_state()

    def _reset_run_state(self):
        """What belongs to one run (fit, validate, ...): fresh at the start of each, so nothing leaks into the next."""
        self.should_stop = False
        self.sanity_checking = False
        self.training = False
        self.val_check_batch = None  # Lightning's: set with the training data (loaders.val_check_batch)
        self._epoch_length = None  # batches of a whole epoch (limit_train_batches applied)
        self._loader_data = None  # the TrainData being trained (a StatefulDataLoader's state is checkpointed)
        self.train_dataloader = None  # Lightning's: the loaders of the run in progress (or the last), set as requested
        self._test_loaders = self._predict_loaders = None  # (evaluation.run_evaluation)
        self._loader_views = {}  # each stage's loaders in the structure they were given (trainer.val_dataloaders, ...)
        self._val_loader = self._pending_val = None  # _pending_val: the fit's loader not requested yet (loaders.py)
        self._fit_validates = False  # whether the running fit validates (_run_stage; loaders.plan_fit_val)
        self._resumed_from = None
        self._fit_state = None  # the FitState of the fit in progress (fit_state.py)
        self.predictions, self.predict_batch_indices = [], []  # of the predict run in progress (prediction writers)
        self._predict_started = None  # its batches started per loader (evaluation._predict)
        self._given_loaders = (None, None)  # (_run_stage)
        # what trainer._data_connector.attach_dataloaders / attach_datamodule recorded (the loop views' setup_data()
        # reads it; a run attaches its own loaders, so it is dropped here): {"train": source, "val", "test", "predict"}
        self._attached_sources = None
        self._eval_data_stale = False  # a hook changed what an evaluation run's loaders read (BatchSizeFinder)

    # -- properties ----------------------------------------------------------------------------------------------
    @property
    def loggers(self):
        """Every logger: the tasktrain Loggers given in callbacks= (a Logger is a callback too), then logger='s, in
        the order given. Any object with Lightning's Logger methods is one (a Mock, a class of the user's)."""
        in_callbacks = [c for c in self.callbacks if isinstance(c, Logger)]
        # a tasktrain Logger counts while it is among the callbacks (the tuner's trials set them aside)
        given = [g for g in self._loggers if not isinstance(g, Logger) or any(g is c for c in in_callbacks)]
        return [c for c in in_callbacks if not any(c is g for g in given)] + given

    @loggers.setter
    def loggers(self, loggers):
        loggers = arguments.check_loggers(loggers or [])  # (Lightning's: None or [] means none)
        others = [c for c in self.callbacks if not isinstance(c, Logger)]
        self._loggers = loggers
        self.callbacks = [c for c in loggers if isinstance(c, Logger)] + others

    @property
    def logger(self):
        loggers = self.loggers
        return loggers[0] if loggers else None

    @logger.setter
    def logger(self, logger):
        self.loggers = [logger] if logger else []  # (Lightning's: a falsy value, None or False, means none)

    @property
    def log_dir(self):
        """Lightning's rule: a TensorBoardLogger's or CSVLogger's log_dir, any other first logger's save_dir (None for
        a logger without a local folder, e.g. MLflow on a server), default_root_dir without a logger."""
        from tasktrain.loggers import CSVLogger, TensorBoardLogger

        logger = self.logger
        if logger is None:
            return self.default_root_dir
        if isinstance(logger, (TensorBoardLogger, CSVLogger)):
            return logger.log_dir
        return logger.save_dir

    @property
    def checkpoint_callbacks(self):
        """Every Checkpoint in the callbacks (ModelCheckpoint, OnExceptionCheckpoint, ...), Lightning's rule."""
        from tasktrain.callbacks.base import Checkpoint

        return [c for c in self.callbacks if isinstance(c, Checkpoint)]

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
        """The checkpoint the current (or last) run loaded (fit, validate, test or predict), or None."""
        return self._resumed_from

    @ckpt_path.setter
    def ckpt_path(self, path):
        """Lightning's: every following run loads `path` (one given to the run itself wins, with a warning, and ends
        this), until it is set back to None."""
        self._resumed_from = path
        self._ckpt_user_path = path or None

    @property
    def interrupted(self):
        """Lightning's: the last entry point ended with an exception (a failure, KeyboardInterrupt)."""
        return self.state.status == TrainerStatus.INTERRUPTED

    @property
    def model(self):
        """Lightning's trainer.model: what the module's forward goes through in the run (a DDP / DeepSpeed / FSDP
        wrapper, or the module itself); outside a run, the module."""
        wrapped = self.strategy.model if self.strategy is not None else None
        return wrapped if wrapped is not None else self.module

    @property
    def module(self):
        """The TaskModule of the current (or last) run; before any run, the one given to
        `trainer.strategy.connect(model)` (Lightning's: the strategy holds it)."""
        return self._module if self._module is not None else self.strategy.module

    @module.setter
    def module(self, module):
        self._module = module

    @property
    def profiler(self):
        """The profiler given (Trainer(profiler=...)); without one, Lightning's PassThroughProfiler, which records
        nothing (the loop does not call it: nothing is wrapped)."""
        if self._profiler is not None:
            return self._profiler
        if self._no_profiler is None:
            self._no_profiler = PassThroughProfiler()
        return self._no_profiler

    @profiler.setter
    def profiler(self, profiler):
        self._profiler = resolve_profiler(profiler)

    @property
    def lightning_module(self):
        """Lightning's name for `trainer.module`."""
        return self.module

    @property
    def global_step(self):
        return self.state.global_step

    @property
    def current_epoch(self):
        """The finished epochs (Lightning's count: an epoch the run stopped inside counts once the loop ended)."""
        return self.state.epoch + (1 if self._epoch_cut_short else 0)

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
    def precision_plugin(self):
        """Lightning's trainer.precision_plugin: the strategy's precision plugin."""
        return self.strategy.precision_plugin

    # -- Lightning's attributes a callback reads (issue 37): views of the strategy's and the loops' state ----------
    @property
    def accelerator(self):
        """Lightning's Accelerator object of the run's device (CPUAccelerator, CUDAAccelerator: tasktrain.accelerators),
        which is also trainer.strategy.accelerator (as in Lightning: the Trainer resolves it into its strategy)."""
        from tasktrain.accelerators import Accelerator, accelerator_for

        device, current = self.strategy.root_device, self.strategy.accelerator
        if not isinstance(current, Accelerator) or current.name() != device.type:
            self.strategy.accelerator = current = accelerator_for(device)
        return current

    @property
    def device_ids(self):
        """The device indices of this node (Lightning's): one per process of a multi-process world, else the one."""
        if isinstance(self.strategy, MultiProcess):
            return list(range(self.devices))
        return [self.strategy.root_device.index or 0]

    @property
    def num_devices(self):
        return len(self.device_ids)

    @property
    def distributed_sampler_kwargs(self):
        """What a DistributedSampler of this world takes (num_replicas, rank), None on one process (Lightning's)."""
        if not isinstance(self.strategy, MultiProcess):
            return None
        return dict(num_replicas=self.strategy.data_parallel_size, rank=self.strategy.data_parallel_rank)

    @property
    def scaler(self):
        """The fp16 GradScaler of the precision plugin, or None."""
        return getattr(self.precision_plugin, "scaler", None)

    @property
    def evaluating(self):
        return self.state.stage is not None and RunningStage(self.state.stage).evaluating

    @property
    def is_last_batch(self):
        """The training batch being run is its epoch's last (kept until the next epoch starts, as Lightning's)."""
        return self.state.is_last_batch

    @property
    def num_training_batches(self):
        """Training batches of the epoch being (or last) trained; inf before the fit knows them (Lightning's)."""
        return float("inf") if self._num_training_batches is None else self._num_training_batches

    @num_training_batches.setter
    def num_training_batches(self, batches):
        self._num_training_batches = batches

    @property
    def num_val_batches(self):
        """The validation counts of the last validate run while one runs (state.fn), else the fit's (Lightning's)."""
        return _inf_counts(self._counts["validate" if self.state.fn == TrainerFn.VALIDATING else "fit"])

    @num_val_batches.setter
    def num_val_batches(self, counts):
        self._counts["validate" if self.state.fn == TrainerFn.VALIDATING else "fit"] = counts

    @property
    def num_sanity_val_batches(self):
        """The fit's validation counts cut to num_sanity_val_steps, worked out at each read as Lightning's: a write
        to fit_loop.epoch_loop.val_loop._max_batches (during the sanity check too) shows here at once, and the fit's
        validations after the sanity check run that many batches (the running sanity check keeps its own)."""
        steps = self.num_sanity_val_steps
        steps = float("inf") if steps == -1 else steps
        return [min(steps, count) for count in _inf_counts(self._counts["fit"])]

    @property
    def num_test_batches(self):
        return _inf_counts(self._counts["test"])

    @num_test_batches.setter
    def num_test_batches(self, counts):
        self._counts["test"] = counts

    @property
    def num_predict_batches(self):
        return _inf_counts(self._counts["predict"])

    @num_predict_batches.setter
    def num_predict_batches(self, counts):
        self._counts["predict"] = counts

    @property
    def test_dataloaders(self):
        """The test loader(s) of the current (or last) test run, as this rank reads them, in the structure they were
        given (Lightning's: a CombinedLoader's iterables, a dict as a dict, a list of one as a list)."""
        return None if self._test_loaders is None else self._loader_views["test"]

    @property
    def predict_dataloaders(self):
        return None if self._predict_loaders is None else self._loader_views["predict"]

    @property
    def enable_validation(self):
        """Whether this fit runs a validation loop: a validation loader, validation_step, limit_val_batches != 0."""
        return (self._val_loader is not None or self._pending_val is not None) and self.limit_val_batches != 0

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

    @validating.setter
    def validating(self, value):
        self._set_stage(RunningStage.VALIDATING, value)

    @property
    def testing(self):
        return self.state.stage == RunningStage.TESTING

    @testing.setter
    def testing(self, value):
        self._set_stage(RunningStage.TESTING, value)

    @property
    def predicting(self):
        return self.state.stage == RunningStage.PREDICTING

    @predicting.setter
    def predicting(self, value):
        self._set_stage(RunningStage.PREDICTING, value)

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
    def _set_hook_tables(self, tables):
        """The run's hook tables (fit_state.build_hook_tables), under the names the module and callbacks read."""
        self._hook_tables = tables
        self._module_hooks = tables.module if tables else {}
        self._callback_hooks = tables.callbacks if tables else {}
        self._all_hooks = tables.all if tables else {}
        self._plain_hooks = tables.plain if tables else {}
        self._monitoring_hooks = tables.monitoring if tables else {}

    def __getstate__(self):
        """A Trainer pickles (a callback that holds it, e.g. a progress bar, pickles as in Lightning): the run's hook
        tables and its batch transfer (run.batch_mover) are closures, built again at each run's start, so they are
        left out."""
        state = dict(self.__dict__)
        state.update(_hook_tables=None, _module_hooks={}, _callback_hooks={}, _all_hooks={}, _plain_hooks={},
                     _monitoring_hooks={}, _attached_sources=None)  # (attached loaders: a run attaches its own)
        state.pop("_batch_transfer", None)
        return state

    def _call(self, event, *args, **kwargs):
        for fn in self._all_hooks[event]:
            fn(*args, **kwargs)




    def _loader_of(self, module, name):
        """`name` ("train_dataloader", ...) of the DataModule the run was given (or attach_data), else of the module,
        as Lightning's loop sources: a run given none takes the module's loaders even where trainer.datamodule stays
        from an earlier run (whose prepare_data / setup / teardown Lightning still calls); profiled as Lightning's
        ("[LightningDataModule]<class>.<name>", "[LightningModule]<class>.<name>")."""
        datamodule = self._attached[1]
        if datamodule is not None and not is_overridden(name, datamodule, DataModule):
            return None  # (the base's hook raises Lightning's "must be implemented")
        if self._trial_counters_shown is not None:
            # a batch-size search's trial requests its loaders where Lightning's search requested them, between its
            # trials: with the counters the last trial left (tuner/batch_size_scaling.py); the trial's own are put back
            own = self.state, self._epoch_cut_short
            self.state, self._epoch_cut_short = self._trial_counters_shown
            try:
                return self._loader_of_now(module, name)
            finally:
                self.state, self._epoch_cut_short = own
        return self._loader_of_now(module, name)

    def _loader_of_now(self, module, name):
        # (the DataLoaders the hook builds keep their constructor arguments: one the Trainer must build again, e.g.
        # around a distributed sampler, is built as the user's class with them, as Lightning's _request_dataloader)
        with hook_scope(self, name), recording_init_args():  # (named for self.log, which refuses it there)
            if self._attached[1] is not None:
                return run.datamodule_call(self, name)
            if not is_overridden(name, module, TaskModule):
                return None  # (the base's hook raises Lightning's "must be implemented")
            with self._profile(module_action(module, name)):
                return getattr(module, name)()


    def _eval_to_device(self, batch, dataloader_idx):
        return self._to_device(batch) if self._plain_transfer else self._to_device(batch, dataloader_idx)

    # -- entry points ----------------------------------------------------------------------------------------------
    def init_module(self, empty_init=None):
        """`with trainer.init_module(empty_init=True): module = Model()`: build the module the way the strategy wants
        it built (strategy.module_init_context): FSDP on the meta device with empty_init=True (each rank then
        materialises only its shard), DeepSpeed's zero3_init partitioned; elsewhere as usual. (Lightning's path:
        strategy.tensor_init_context, which a script's own strategy may override; empty_init defaults to None, "the
        strategy decides", as Lightning's, so an override can tell it from an explicit False.)"""
        return self.strategy.tensor_init_context(empty_init=empty_init)

    def print(self, *args, **kwargs):
        """print() on global rank 0 only (the other ranks print nothing), as LightningModule.print."""
        if self.is_global_zero:
            print(*args, **kwargs)

    def fit(
        self,
        model: TaskModule,
        train_dataloaders: Optional[Union[Any, DataModule]] = None,
        val_dataloaders: Optional[Any] = None,
        datamodule: Optional[DataModule] = None,
        ckpt_path: Optional[Union[str, Path]] = None,
        weights_only: Optional[bool] = None,
    ):
        """Train `model` (a TaskModule; Lightning's parameter name) on loaders, or on a DataModule's (`datamodule=`,
        or passed as train_dataloaders).
        weights_only (Lightning's): how ckpt_path is read. None or True: tensors and plain data only (a file holding
        other pickled objects is refused); False: any pickled object, for a file you trust."""
        _check_weights_only("fit", weights_only)
        return self._run("fit", model, train_dataloaders, val_dataloaders, ckpt_path=ckpt_path, datamodule=datamodule,
                         weights_only=weights_only)

    def validate(
        self,
        model: Optional[TaskModule] = None,
        dataloaders: Optional[Union[Any, DataModule]] = None,
        ckpt_path: Optional[Union[str, Path]] = None,
        verbose: bool = True,
        datamodule: Optional[DataModule] = None,
        weights_only: Optional[bool] = None,
    ):
        """weights_only (Lightning's, as fit's): how ckpt_path is read; False: any pickled object."""
        _check_weights_only("validate", weights_only)
        self._verbose = verbose  # False: the results are returned, not printed
        return self._run("validate", model, None, dataloaders, ckpt_path=ckpt_path, datamodule=datamodule,
                         weights_only=weights_only)

    def test(
        self,
        model: Optional[TaskModule] = None,
        dataloaders: Optional[Union[Any, DataModule]] = None,
        ckpt_path: Optional[Union[str, Path]] = None,
        verbose: bool = True,
        datamodule: Optional[DataModule] = None,
        weights_only: Optional[bool] = None,
    ):
        """weights_only (Lightning's, as fit's): how ckpt_path is read; False: any pickled object."""
        _check_weights_only("test", weights_only)
        self._verbose = verbose
        return self._run("test", model, None, dataloaders, ckpt_path=ckpt_path, datamodule=datamodule,
                         weights_only=weights_only)

    def predict(
        self,
        model: Optional[TaskModule] = None,
        dataloaders: Optional[Union[Any, DataModule]] = None,
        datamodule: Optional[DataModule] = None,
        return_predictions: Optional[bool] = None,
        ckpt_path: Optional[Union[str, Path]] = None,
        weights_only: Optional[bool] = None,
        *,
        gather: bool = False,
    ):
        """Predictions of this rank, in loader order (a list per loader when there are several); with gather=True,
        every rank's, in dataset order. return_predictions=False keeps none in memory and returns None (a
        BasePredictionWriter writes them). Under a strategy that spawns its processes ("ddp_spawn"), as Lightning's:
        None by default and return_predictions=True refused; gather=True still brings every rank's back.
        weights_only (Lightning's, as fit's): how ckpt_path is read; False: any pickled object."""
        _check_weights_only("predict", weights_only)
        from tasktrain.strategies.spawn import SpawnedRunRefused, SpawnLauncher

        spawned = isinstance(self.strategy.launcher, SpawnLauncher)  # (this process starts the ranks by spawning)
        if spawned and return_predictions and not gather:  # Lightning's words, here before the processes start
            raise SpawnedRunRefused(
                "`return_predictions` should be set to `False` when using the strategies that spawn or fork. Found "
                f"{return_predictions} with strategy {type(self.strategy)}. (tasktrain: `predict(..., gather=True)` "
                "brings every rank's predictions back from the spawned processes.)")
        if return_predictions is None:
            return_predictions = gather or not spawned
        self._return_predictions = bool(return_predictions)
        return self._run("predict", model, None, dataloaders, ckpt_path=ckpt_path, gather=gather,
                         datamodule=datamodule, weights_only=weights_only)

    def _run(self, stage, module, train_loader, eval_loader, ckpt_path=None, gather=False, datamodule=None,
             weights_only=None):
        self._ckpt_weights_only = weights_only  # how this run reads ckpt_path (the entry point's weights_only=)
        if self._ckpt_user_path is not None:  # trainer.ckpt_path = ... (Lightning's rule and words)
            if ckpt_path:
                if self.is_global_zero:
                    warnings.warn(f"`trainer.ckpt_path = {self._ckpt_user_path!r}` was called but then you passed "
                                  f"`trainer.fit(ckpt_path={ckpt_path!r})`. The latter will be loaded.", UserWarning,
                                  stacklevel=3)
                self._ckpt_user_path = None
            else:
                ckpt_path = self._ckpt_user_path
        # Lightning's checkpoint connector asks for SLURM's requeue checkpoint where no path is given (its srun hint),
        # in the process that runs the stage: a spawned child under ddp_spawn (_StageRun)
        hint_srun = ckpt_path is None
        if stage != "fit" and module is None and ckpt_path is None and self._given_module is not None:
            ckpt_path = resume.default_eval_ckpt_path(self, stage)  # Lightning's: the best of the previous fit
        given = module if module is not None else self._given_module if self._given_module is not None else self.module
        # fit(torch.compile(module)): the module inside is trained, its forward compiled for the run (compiled.py).
        module, compiled = unwrap_compiled(given)
        if given is None and stage != "fit":  # (Lightning's words)
            raise TypeError(f"`Trainer.{stage}()` requires a `TaskModule` when it hasn't been passed in a previous "
                            "run")
        if not isinstance(module, TaskModule):  # (Lightning's words first)
            raise TypeError(f"`model` must be a `TaskModule` or `torch._dynamo.OptimizedModule`, got "
                            f"`{type(module).__qualname__}`. Trainer.{stage} trains a tasktrain.TaskModule.")
        _check_module(module, stage, self.gradient_clip_val, self.accumulate_grad_batches)
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
        if stage == "fit" and self.is_global_zero:
            _warn_unused_validation(module, eval_loader, datamodule)
        # Lightning's entry points name the module and the stage before the launch: a spawned run's parent shows
        # them too, also when the run raised (lightning_module, state.fn, state.status INTERRUPTED)
        self.module = module
        self.state.fn, self.state.status = TrainerFn(stage), TrainerStatus.RUNNING
        # The strategy runs the stage on every rank: here, or in the processes it starts (ddp_spawn).
        from tasktrain.strategies.spawn import SpawnLauncher

        if self.strategy.environment_plugin is None:  # (SLURM's world as the variables say it, not a user's own)
            # before any process group forms, on every rank alike: the batch script run without srun, devices and
            # nodes against the job step (Trainer(...) reads that world as Lightning's, which then hangs or fails at
            # its launch)
            check_run_allocation(self.env, self.devices, self.num_nodes)
        launcher = self.strategy.launcher
        spawned = isinstance(launcher, SpawnLauncher)
        if spawned:  # Lightning's entry points give the strategy the module in the parent too: trainer.save_checkpoint
            self.strategy.connect(module)  # works there after the run (the weights it sent back)
        try:
            if spawned and stage == "fit" and launcher._already_fit:
                # Lightning's refusal (its words and type): this process holds the weights a spawned fit sent back,
                # not its optimizers' state (Lightning-AI/pytorch-lightning#18775), so a second fit would not go on
                # from the first
                raise NotImplementedError(
                    "Calling `trainer.fit()` twice on the same Trainer instance using a spawn-based strategy is not "
                    "supported. You can work around this limitation by creating a new Trainer instance and passing "
                    "the `fit(ckpt_path=...)` argument.")
            result = self.strategy.launch(_StageRun(self, stage, module, datamodule, ckpt_path, gather, compiled,
                                                    hint_srun), train_loader, eval_loader)
        except BaseException as exc:
            self.state.status = TrainerStatus.INTERRUPTED
            if spawned:  # Lightning's entry point calls these around its launcher, in this process
                run.on_spawned_failure(self, module, exc)
            raise
        if spawned and stage == "fit":
            launcher._already_fit = True
        return result

    def _attach_run_data(self, module, datamodule):
        """What a run attaches where Lightning's _fit_impl / _validate_impl / ... attach it, inside the launch (so a
        spawned run's children, never its parent: Lightning's parent keeps trainer.datamodule None): the DataModule
        given (trainer.datamodule, which stays for later runs), and the (module, datamodule) whose data hooks run."""
        if datamodule is not None:
            self.datamodule = datamodule
            datamodule.trainer = self
        self._attached = (module, datamodule)

    def _run_stage(self, stage, module, train_loader, eval_loader, ckpt_path, gather, compiled=None):
        strategy = self.strategy
        run.start_stage(self, stage, module)
        # the loaders passed to this run's entry point (None: from the module's or the DataModule's hooks), for the
        # callbacks that need to know (BatchSizeFinder, LearningRateFinder)
        self._given_loaders = (train_loader, eval_loader)
        self.state.stage = _RUNNING_STAGE[stage]  # Lightning's: from the setup hooks to the teardown ones
        if stage == "fit":
            # whether the fit validates is known from its start (Lightning attaches the data before prepare_data and
            # setup, so trainer.enable_validation and _should_check_val_epoch() read it in those hooks); the loader
            # itself is requested later (val_data_now)
            self._fit_validates = loaders.plan_fit_val(self, module, eval_loader)
        result = None
        status = "success"  # what the loggers' finalize hears
        restore_forward = compile_forward_as(module, compiled)  # undone in the finally below
        sigint = guards.sigint_once()  # issue 38: the first Ctrl-C interrupts, a second cannot land mid-shutdown
        try:
            if strategy.is_global_zero and not getattr(Trainer, "_announced", False):
                print(f"[tasktrain] {strategy.describe()}, precision={self.precision}", flush=True)
                Trainer._announced = True
            if "prepare_data" not in self._trial_skips:  # (a tuner's trial inside a run: done by the run)
                run.prepare_data(self, module)
            from tasktrain.loggers.wandb import WandbLogger

            # Lightning reads each logger's experiment here (every rank) so that it exists before the setup hooks:
            # the version folder is there, and a file a setup hook writes in it (a CLI's config) is no "used folder"
            # warning. tasktrain's loggers learn their rank first (what their setup does), so that only global rank
            # 0 makes one (a spawned worker's environment may not say). W&B's run first, as Lightning's: wandb.init
            # must come before any TensorBoard writer for sync_tensorboard=True to see its logs.
            for logger in sorted(self.loggers, key=lambda one: not isinstance(one, WandbLogger)):
                if isinstance(logger, Logger):
                    logger._global_rank = self.global_rank
                if hasattr(logger, "experiment"):
                    logger.experiment
            # (Lightning passes the stage by keyword, as its TrainerFn: a str enum, == "fit" and .value both work)
            if "setup" not in self._trial_skips:  # (a tuner's trial inside a run: the run's set-up stands)
                if self.datamodule is not None:
                    run.datamodule_call(self, "setup", stage=TrainerFn(stage))
                self._call("setup", stage=TrainerFn(stage))
            if is_overridden("configure_model", module, TaskModule) and "configure_model" not in self._trial_skips:
                # (named for self.log, which refuses it there); the layers it builds get the precision's dtype
                # ("64-true": float64, "bf16-true": bfloat16), under the precision's contexts Lightning enters there
                # (its strategy's tensor_init_context, which enters the precision's, then module_init_context)
                with hook_scope(self, "configure_model"), strategy.precision.tensor_init_context(), \
                        strategy.precision.module_init_context():
                    module.configure_model()
            with torch.autograd.set_detect_anomaly(self.detect_anomaly):
                if stage == "fit":
                    self._fit(module, train_loader, eval_loader, ckpt_path)
                else:
                    result = evaluation.run_evaluation(self, stage, module, eval_loader, ckpt_path, gather)
        except _TunerExitException:
            # the Tuner's finder ended the run after its search (Lightning's): a finished run, torn down as one (its
            # teardown hooks, its loggers' finalize("success")), nothing trained after the search, nothing returned
            result = None
        except BaseException as exc:
            # a job that saved and was requeued (issue 40) finished its part: Lightning's SLURM handler says so
            requeued = isinstance(exc, SystemExit) and getattr(exc, "requeued", False)
            status = "finished" if requeued else "failed"
            self.state.status = TrainerStatus.INTERRUPTED
            interrupt = guards.interrupt_begin(exc, self.strategy)  # issue 38: Ctrl-C: one line, exit 1
            run.on_failure(self, exc)
            if interrupt is not None:
                raise interrupt.exit() from None
            raise
        finally:
            try:
                run.teardown(self, stage, module, status)
            finally:
                restore_forward()
                guards.restore_sigterm_handler(self)  # (an exception's path: after the on_exception hooks)
                guards.restore_sigint(sigint, strategy)
                self.state.stage = None
        self.state.status = TrainerStatus.FINISHED
        return result




    # -- fit ---------------------------------------------------------------------------------------------------------
    def _fit(self, module, train_loader, val_loader, ckpt_path):
        """The fit's set-up in Lightning's order, then the loop (loop.fit_loop) over the FitState built here:
        the checkpoint's module-and-callbacks part (resume.py: before configure_optimizers, or after on_fit_start
        where the strategy's engine reads it), configure_optimizers and the strategy's set-up, on_fit_start, the
        training state, the sanity check (on_sanity_check_start, then val_dataloader), then train_dataloader, the
        position in the epoch and the RNG, and on_train_start. The training loader comes earlier where
        configure_optimizers reads estimated_stepping_batches or the strategy needs the micro-batch size."""
        strategy = self.strategy
        self._loaders_from_hooks = (train_loader is None, val_loader is None)  # reload_dataloaders_every_n_epochs
        if strategy.applies_layer_sync:  # (where it is not applied, torch's SyncBatchNorm never runs)
            _refuse_sync_batchnorm_on_cpus(strategy, self.sync_batchnorm)
        if self._layer_sync is not None and not strategy.applies_layer_sync:
            # Lightning's DeepSpeed and ModelParallel strategies take the LayerSync and never apply it, silently: the
            # same here, said on every rank rather than silent
            given = ("sync_batchnorm=True" if type(self._layer_sync) is TorchSyncBatchNorm
                     else f"plugins=[{type(self._layer_sync).__name__}(...)]")
            warnings.warn(f"{given} is not applied under {type(strategy).__name__}: Lightning's DeepSpeed and "
                          "ModelParallel strategies never apply a LayerSync, nor does tasktrain's; the module's layers "
                          "stay as they are (each process normalises with its own batch statistics). Remove it, or "
                          "convert the layers yourself in configure_model.", UserWarning, stacklevel=3)
        elif self._layer_sync is not None and isinstance(strategy, MultiProcess):
            # Lightning's DDP / FSDP setup of a fit: apply, then the precision's conversion, the wrapper, the optimizers
            if self._layer_sync.apply(module) is not module:
                raise ValueError(f"{type(self._layer_sync).__name__}.apply(model) returned another module: convert the "
                                 "layers of the module it is given in place and return that module (as torch's "
                                 "SyncBatchNorm.convert_sync_batchnorm does for a module that is not a BatchNorm).")
            self._applied_layer_sync = self._layer_sync
        check_optimization_hooks(module, strategy)
        # A used Trainer goes on from its last fit's counters (Lightning's); a checkpoint's win (resume.py). Data
        # order: a function of (seed, epoch), the same seed on every rank: Lightning's (0 without seed_everything).
        self.state.start_fit(broadcast_seed(strategy, sampler_seed()), stopped_inside_epoch=self._epoch_cut_short)
        self._epoch_cut_short = False
        self._pending_train, self._train_data = (module, train_loader), None  # requested by train_data_now
        has_val = self._fit_validates  # (planned at the stage's start: _run_stage)
        ckpt_path = resume.resume_path(self, ckpt_path)  # restarts (issue 29), requeues (issue 40), "best"/"last"
        after_setup = resume.restores_after_setup(strategy)
        loaded = None if after_setup else resume.restore_module_and_callbacks(self, ckpt_path)
        if "configure_optimizers" in self._trial_skips:
            # a tuner's trial inside a run (tuning._tuning): Lightning's runs its fit loop on what the run's set-up
            # built, its optimizers and schedulers (a copy of the list: the lr sweep puts its own scheduler there);
            # configure_optimizers is not called and the strategy sets nothing up again
            self.lr_scheduler_configs = list(self.lr_scheduler_configs)
        else:
            def set_up():  # (inside strategy.setup(trainer) where a subclass overrides it: Lightning's place)
                with self._profile(module_action(module, "configure_optimizers")):  # (Lightning's timed action)
                    optimizers, self.lr_scheduler_configs = parse_optimizers(module)
                _check_optimizers(module, optimizers, self.accumulate_grad_batches, self.gradient_clip_val)
                plan = self._plan(module, loaders.train_data_early(self, strategy))
                _, self.optimizers = strategy.setup_module_and_optimizers(module, optimizers, plan)
                run.connect_precision(strategy, self.optimizers, self.lr_scheduler_configs)
            strategy_hooks.run_setup(self, strategy, set_up)
        fit = self._fit_state = build_fit_state(self, module, self.optimizers, self.lr_scheduler_configs, None)
        if "on_fit_start" not in self._trial_skips:  # (a tuner's trial: Lightning's runs its fit loop only)
            self._call("on_fit_start")
        if after_setup:
            loaded = resume.restore_module_and_callbacks(self, ckpt_path)
        if loaded is not None:
            resume.restore_training_state(self, loaded)
        fit.restarting = resume.skips_sanity_check(self, loaded)  # (Lightning's fit_loop.restarting)
        finished = loaded is not None and guards.finished_run(self, loaded.path)  # issue 38: says so
        module.zero_grad()  # Lightning clears the gradients when each entry point starts
        if not finished:  # a finished run resumed writes no new log folder (issue 38)
            self._log_hyperparams(module)
        self._watch()  # from the sanity check on; set-up is not watched
        guards.install_sigterm_handler(self)  # (Lightning's place: before the sanity check; issue 37)
        # (isolate_rng: no draw moves); a resumed fit too, unless it continues inside an epoch or counts steps
        if has_val and self.num_sanity_val_steps and not resume.skips_sanity_check(self, loaded):
            self._sanity_check()
        # Lightning's fit loop: limit_train_batches=0 skips it before its data is set up, so train_dataloader() is
        # not called (nor val_dataloader() beyond the sanity check's)
        skipped = self.limit_train_batches == 0
        fit.epochs = None if skipped else loaders.train_data_now(self)
        if not skipped and loaders.train_reload_due(self):  # requested early (configure_optimizers) at another
            loaders.reload(self, fit)  # epoch: Lightning's rule
        resume.start_after_finished_epoch(self)  # (a fit resumed from an epoch's end: current_epoch moves on here)
        if not skipped:
            loaders.val_data_at_train_start(self)  # (without a sanity check)
        if loaded is not None and not skipped:  # the position in the epoch, on the loader that will be trained on;
            # then the RNG
            restore_rng = resume.restore_position(self, loaded, fit.epochs)
            if restore_rng is not None:
                restore_rng()
        requeue_handler = requeue.RequeueHandler(lambda: setattr(fit, "preempted", True),  # issue 40
                                                 self._requeue_settings)
        try:
            # issue 38: limit_train_batches=0 skips the loop (Lightning's rule); so does a fit with nothing left to
            # train (a used Trainer or a checkpoint at max_epochs / max_steps): no on_train_start / on_train_end
            fit.resumed = loaded is not None
            self._trial_counters_shown = None  # (a search's trial: its loaders are requested; it trains from 0)
            if not guards.trains_nothing(self):
                loop.start_training(self, fit)  # (Lightning's iter() of the training data, before on_train_start)
                if not loop.nothing_left(self):
                    loop.fit_loop(self, fit)
        finally:
            requeue_handler.restore()  # issue 40
        # Lightning gives the SIGTERM handler back before on_fit_end (its _teardown); after an exception, once the
        # on_exception hooks ran (_run_stage)
        guards.restore_sigterm_handler(self)
        if "teardown" not in self._trial_skips:  # (a tuner's trial inside a run: the run's end does it)
            run.end_stage_plugins(self, module)  # (Lightning's strategy teardown, before on_fit_end)
        if "on_fit_end" not in self._trial_skips:
            self._call("on_fit_end")
        skipped = self.strategy.precision.skipped_steps
        if skipped and self.is_global_zero:
            print(f"[tasktrain] GradScaler skipped {skipped} optimizer step(s) with inf/NaN gradients.", flush=True)
        if fit.preempt_path and requeue_handler.agreed(self.strategy):  # issue 40: SLURM's warning signal
            exit = SystemExit(requeue.requeue(self.default_root_dir, fit.preempt_path, self.global_step,
                                              self.is_global_zero))
            exit.requeued = exit.code == requeue.REQUEUED_EXIT_CODE  # (the loggers' finalize hears "finished")
            raise exit
        requeue.finished(self.default_root_dir, self.is_global_zero and not fit.preempt_path)  # issue 40

    def _plan(self, module, train_loader):
        """What the loop will do, for the strategy's set-up (strategies/base.py Plan); train_loader None: the
        micro-batch size is not asked for (strategy.needs_micro_batch_size)."""
        return Plan(
            training=True, calls_steps=True, micro_batch_size=loaders.batch_size_of(train_loader),
            accumulate_grad_batches=self.accumulate_grad_batches,
            automatic_optimization=module.automatic_optimization, loss_divided_by_window=True,
            clipping=tuple(request for cb in clipping_callbacks(self.callbacks) for request in cb.requests),
            has_lr_schedulers=bool(self.lr_scheduler_configs),
            accumulation_schedule=tuple(item for schedule in accumulation_schedules(self.callbacks)
                                        for item in schedule.accumulation_schedule.items()),
        )

    def _sanity_check(self):
        outer_stage = self.state.stage
        self.sanity_checking = True
        with isolate_rng():  # the training draws as it would without a sanity check (Lightning's rule)
            self._call("on_sanity_check_start")
            if loaders.val_data_now(self) is not None:  # val_dataloader is requested here, as in Lightning
                # (the counts as they are now: a later write moves the fit's validations, not this sanity check)
                sanity_counts = [None if count == float("inf") else count for count in self.num_sanity_val_batches]
                evaluation.evaluate(self, "validate", self._val_loader, sanity_counts)
            self._call("on_sanity_check_end")
        self.state.stage = outer_stage  # (training again, Lightning's)
        self.state.eval_batches["val"] = [0, 0]  # (Lightning resets its validation progress after the sanity check)
        self.state.eval_is_last_batch["val"] = False
        self._metrics.callback_metrics.clear()
        self._metrics.epoch_values.clear()
        self._metrics.eval_bar_values.clear()  # (Lightning resets its metrics after the sanity check: these too)
        self._logged_metrics.clear()

    def _log_hyperparams(self, module):
        """Lightning's rule, at the start of each run: the hyper-parameters save_hyperparameters() stored (with
        logger=True) of the module and the DataModule, then log_graph and save, for every logger; none of it with
        Trainer(enable_autolog_hparams=False) (Lightning skips the whole call there too)."""
        if not self.enable_autolog_hparams or not self.loggers:
            return
        from tasktrain.loggers.utilities import hyperparameters_to_log

        hparams = hyperparameters_to_log(module, self.datamodule)  # (its error on every rank)
        for logger in self.loggers:  # every rank, as Lightning: tasktrain's loggers act on global rank 0 only
            if hparams is not None:
                logger.log_hyperparams(hparams)
            logger.log_graph(module)
            logger.save()


    @property
    def estimated_stepping_batches(self):
        """The optimizer steps this fit will take (Lightning's): per epoch ceil(batches / accumulate_grad_batches)
        of this rank's shard, times max_epochs, capped by max_steps; readable from configure_optimizers on."""
        if self.state.fn == "fit" and getattr(self, "_train_data", 0) is None and self.limit_train_batches != 0:
            loaders.train_data_now(self)  # read in configure_optimizers: the training loader is requested now (Lightning's)
        if self._num_training_batches in (None, float("inf")):  # no length (an iterable), a zero limit
            if self.max_steps != -1:
                return self.max_steps
            if self.state.fn != "fit":
                raise RuntimeError("estimated_stepping_batches is known once fit() has its training data: read it "
                                   "in configure_optimizers or later.")
            # Lightning's answer: infinite training is inf, a finite number of epochs of unknown length is max_steps
            return float("inf") if self.max_epochs == -1 else self.max_steps
        accumulate = self.accumulate_grad_batches if self.module is None or self.module.automatic_optimization else 1
        per_epoch = -(-self._num_training_batches // accumulate)
        steps = per_epoch * max(self.max_epochs, 1) if self.max_epochs != -1 else float("inf")
        return min(steps, self.max_steps) if self.max_steps != -1 else steps

    @property
    def val_dataloaders(self):
        """The validation loader(s) of the fit or validate run, as this rank reads them, in the structure they were
        given (as test_dataloaders)."""
        return None if self._val_loader is None else self._loader_views["validate"]

    # -- the loop's state, read by code outside the loop (tasktrain/trainer/guards.py of issue 38) -------------------
    @property
    def _loss_window(self):
        """The training losses not yet checked for finiteness (loop.check_finite_loss), of the fit in progress."""
        return self._fit_state.loss_window if self._fit_state is not None else []

    def _done(self):
        return loop.done(self)

    def _max_steps_reached(self):
        return loop.max_steps_reached(self)

    # -- metrics out -----------------------------------------------------------------------------------------------
    def _flush_step_metrics(self, step=None):
        values = self._metrics.step_metrics_for_logger()  # (sync_dist values were synchronised when logged)
        if values:  # every rank (log_to_loggers)
            self.log_to_loggers(values, step)

    def _flush_epoch_metrics(self, values, step=None):
        if values:
            self.log_to_loggers(self._metrics.logger_epoch_values(values), step, add_epoch=True)

    @property
    def should_update_logs(self):
        """Lightning's rule for a training log step: the batch about to be counted, batches_that_stepped + 1, is a
        multiple of log_every_n_steps (also read before the step, in on_train_batch_start), or a stop was asked. On
        several processes a stop request counts once agreed (at those multiples): one rank's own request would make
        a log step, and the collectives of its writes (sync_dist values, ThroughputMonitor's split), there alone."""
        if not self.log_every_n_steps:  # 0: no step values at all (Lightning's)
            return False
        stop = bool(self.should_stop) and self.world_size == 1
        return (self.state.batches_that_stepped + 1) % self.log_every_n_steps == 0 or stop

    def log_to_loggers(self, values, step=None, add_epoch=None, save=True):
        """Write `values` (numbers or scalar tensors) to every logger and record them in trainer.logged_metrics.
        Lightning's rule for the step: `step` when given (for epoch-end values, add_epoch=True, a "step" value among
        them wins: Lightning writes those with no step of its own); else a "step" value among them (taken out); else
        trainer.state.batches_that_stepped (Lightning's _batches_that_stepped), with the current epoch added as
        "epoch" (not recorded in logged_metrics, as Lightning). Each logger's `save()` follows its `log_metrics`
        (Lightning's logger connector does so: a CSV file or TensorBoard event file holds each write once it
        returns); save=False for a callback's own write (LearningRateMonitor's, which Lightning writes without a
        save). Called on every rank, as Lightning's logger connector is: tasktrain's loggers write on global rank 0
        only, another logger (a class of the user's, a Mock) is called on each rank, as in Lightning."""
        if not self.loggers or not values:  # (Lightning's: nothing is logged, nor recorded, without a logger)
            return
        # logged_metrics: the values as given (tensors stay tensors), before "step" is taken out and "epoch" added
        self._logged_metrics.update(values)
        # Lightning's conversion: a one-element tensor becomes its Python number (`.item()`: a float tensor a float, an
        # int tensor an int), anything else is passed on as given, and "epoch" is the int current_epoch: a CSV file
        # shows `epoch` 0 and a callback's count `train/batches` 1, not 0.0 / 1.0
        scalars = {k: _to_scalar(k, v) for k, v in values.items()}
        # (Lightning writes epoch-end values with no step of its own: a logged "step" is theirs too, without "epoch")
        if "step" in scalars and (step is None or add_epoch):
            step = int(scalars.pop("step"))
            add_epoch = False
        if add_epoch if add_epoch is not None else step is None:
            scalars.setdefault("epoch", self.current_epoch)
        step = self.state.batches_that_stepped if step is None else int(step)
        for logger in self.loggers:
            logger.log_metrics(metrics=scalars, step=step)  # by keyword, as Lightning calls it
            if save:
                logger.save()

    # -- checkpoints (what a checkpoint holds and how a fit resumes: resume.py) ---------------------------------------
    def dump_checkpoint(self, weights_only=False) -> dict:
        """The checkpoint dict (see tasktrain/checkpoint_io.py for every key). Called on every rank."""
        return resume.dump_checkpoint(self, weights_only)

    def save_checkpoint(self, filepath, weights_only=None, storage_options=None):
        """Write a checkpoint (call on every rank; rank 0 writes). In a launch that can restart, a full checkpoint is
        recorded for the restart (checkpoint_io.record_for_restarts). Lightning's signature: weights_only None is
        False (said at INFO, as Lightning says it); storage_options is for a CheckpointIO plugin of the user's
        (trainer.strategy.checkpoint_io; the default TorchCheckpointIO refuses it, as Lightning's does)."""
        if self.module is None:  # (Lightning's words)
            raise AttributeError("Saving a checkpoint is only possible if a model is attached to the Trainer. Did you "
                                 "call `Trainer.save_checkpoint()` before calling `Trainer.{fit,validate,test,predict}`?")
        self.strategy.check_can_save()  # (DeepSpeed after its run: its engine is gone)
        if isinstance(self.strategy, Sharded) and ckpt_io.is_remote(os.fspath(filepath)):
            # the engines (DeepSpeed's, torch.distributed.checkpoint's) write with the local file system's calls: a
            # URL would become a local folder named "s3:"; one file (ddp, one device) is written through fsspec
            raise ValueError(f"Trainer.save_checkpoint({os.fspath(filepath)!r}): {type(self.strategy).__name__} "
                             "writes its checkpoint with its engine on a local (or mounted) file system, not at a file "
                             "system URL. Save to a local folder (ModelCheckpoint(dirpath=...), default_root_dir) and "
                             "copy it, or mount the bucket.")
        if weights_only is None:
            weights_only = False
            if self.is_global_zero:
                logging.getLogger("tasktrain").info("`weights_only` was not set, defaulting to `False`.")
        if not self.may_save_checkpoint(filepath):  # issue 38: a non-finite state is never saved
            return False
        started = time.perf_counter()
        with self.long_event("save_checkpoint"):  # may take long: not a stall (issue 19)
            self.strategy.wait_for_checkpoint()  # issue 29: a background write in flight ends first ("last" moves forward)
            with self._profile("save_checkpoint"):
                checkpoint = self.dump_checkpoint(weights_only)
                if storage_options is None:
                    self.strategy.save_checkpoint(checkpoint, filepath)
                elif isinstance(self.strategy, Sharded):  # its engine writes, no CheckpointIO (Lightning's words)
                    raise TypeError("`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is "
                                    f"not supported for `{type(self.strategy).__name__}` as `CheckpointIO` is not used.")
                else:  # for a CheckpointIO plugin (TorchCheckpointIO refuses it, in Lightning's words)
                    self.strategy.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
            if not weights_only and self.is_global_zero:  # issue 29: a restarted worker resumes from it
                ckpt_io.record_for_restarts(self.default_root_dir, filepath, self.global_step, self.current_epoch)
        self.checkpoint_seconds += time.perf_counter() - started
        return True

    def may_save_checkpoint(self, filepath):
        """False (with a warning) when the loss or weights went non-finite: a checkpoint of it is not written;
        inside fit's loop that raises FloatingPointError instead (tasktrain/trainer/guards.py). Every rank calls it."""
        return guards.may_save_checkpoint(self, filepath)


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

    def _teardown(self):
        """Lightning's private end of a run (its strategy's teardown; not the teardown hooks), which scripts copied
        from Lightning's tests call again in a `finally` after fit. Every run's end here already did it
        (run.teardown); called again it drops only what a strategy kept for a save_checkpoint after the run
        (DeepSpeed's engine), as Lightning's second strategy.teardown() does."""
        self.strategy.teardown()


def _check_module(module, stage, gradient_clip_val=None, accumulate_grad_batches=1):
    # (TaskModule has no configure_sharded_model: any definition is the user's)
    if stage in ("fit", "validate", "test", "predict") and callable(getattr(module, "configure_sharded_model", None)):
        raise NotImplementedError(f"{type(module).__name__} overrides configure_sharded_model, which tasktrain does "
                                  "not call: it is deprecated in Lightning; rename it to configure_model.")
    steps = {"fit": ("training_step", "validation_step"), "validate": ("validation_step",), "test": ("test_step",),
             "predict": ("predict_step",)}.get(stage, ())
    for name in steps:  # Lightning's experimental step that draws its own batches: refused, not fed a batch
        if is_overridden(name, module, TaskModule) and \
                "dataloader_iter" in inspect.signature(getattr(module, name)).parameters:
            raise NotImplementedError(
                f"{type(module).__name__}.{name}(self, dataloader_iter): tasktrain does not run Lightning's "
                f"experimental `dataloader_iter` step flavor. Take the batch instead: {name}(self, batch, batch_idx).")
    if stage == "fit":  # (Lightning's configuration check and words first, before the loggers make their folders)
        check_fit_configuration(module)
        if not module.automatic_optimization:
            _check_manual_optimization(module, gradient_clip_val, accumulate_grad_batches)
    elif stage in ("validate", "test", "predict"):
        check_eval_configuration(module, stage)


def check_fit_configuration(module):
    """Lightning's checks of a module before fit (its configuration_validator's, its words first): training_step
    and configure_optimizers defined, no Lightning 1.x optimizer_idx argument, no Lightning 1.x epoch-end hooks
    (which no loop would call)."""
    for name in ("training_step", "configure_optimizers"):
        if not is_overridden(name, module, TaskModule):
            raise MisconfigurationException(
                f"No `{name}()` method defined. Lightning `Trainer` expects as minimum a `training_step()`, "
                f"`train_dataloader()` and `configure_optimizers()` to be defined. ({type(module).__name__}: "
                "training_step(self, batch, batch_idx) returns the loss; configure_optimizers(self) returns an "
                "optimizer, e.g. `return torch.optim.AdamW(self.parameters(), lr=1e-3)`.)")
    for name in ("training_epoch_end", "validation_epoch_end"):
        _refuse_epoch_end_hook(module, name)
    if module.automatic_optimization and "optimizer_idx" in inspect.signature(module.training_step).parameters:
        # Lightning 1.x's multi-optimizer loop; Lightning 2's error, its words
        raise RuntimeError(
            "Training with multiple optimizers is only supported with manual optimization. Remove the "
            "`optimizer_idx` argument from `training_step`, set `self.automatic_optimization = False` and access "
            "your optimizers in `training_step` with `opt1, opt2, ... = self.optimizers()`.")


def check_eval_configuration(module, stage):
    """Lightning's checks of a module before validate / test / predict (`stage`), its words: the stage's step
    defined (predict: predict_step not None, and a forward where predict_step is the base's, which calls it), no
    Lightning 1.x epoch-end hook."""
    if stage == "predict":
        if module.predict_step is None:
            raise MisconfigurationException("`predict_step` cannot be None to run `Trainer.predict`")
        if not is_overridden("predict_step", module, TaskModule) and \
                not is_overridden("forward", module, TaskModule):
            raise MisconfigurationException(
                "`Trainer.predict` requires `forward` method to run. (The base predict_step returns self(batch): "
                f"define {type(module).__name__}.forward, or predict_step(self, batch, batch_idx).)")
        return
    name = "validation_step" if stage == "validate" else "test_step"
    if not is_overridden(name, module, TaskModule):
        raise MisconfigurationException(f"No `{name}()` method defined to run `Trainer.{stage}`. (Define "
                                        f"{type(module).__name__}.{name}(self, batch, batch_idx).)")
    _refuse_epoch_end_hook(module, "validation_epoch_end" if stage == "validate" else "test_epoch_end")


def _refuse_epoch_end_hook(module, name):
    """Lightning 2 removed training_epoch_end / validation_epoch_end / test_epoch_end: no loop calls them, so a module
    that still defines one is refused (Lightning's error and words) rather than silently not called."""
    if callable(getattr(module, name, None)):
        raise NotImplementedError(
            f"Support for `{name}` has been removed in v2.0.0. `{type(module).__name__}` implements this method. You "
            f"can use the `on_{name.replace('training', 'train')}` hook instead. To access outputs, save them in-memory as instance attributes. You "
            "can find migration examples in https://github.com/Lightning-AI/pytorch-lightning/pull/16520.")


def _warn_unused_validation(module, val_loaders, datamodule):
    """Lightning's notes when fit's validation cannot run: loaders without a validation_step, or a validation_step
    without loaders (its rule: loaders given to fit, or a val_dataloader the datamodule or the module defines)."""
    has_loader = val_loaders is not None or is_overridden("val_dataloader", module, TaskModule) or (
        datamodule is not None and is_overridden("val_dataloader", datamodule, DataModule))
    warn_unused_validation(module, has_loader)


def warn_unused_validation(module, has_loader, stacklevel=5):
    has_step = is_overridden("validation_step", module, TaskModule)
    if has_loader and not has_step:
        warnings.warn("You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.",
                      UserWarning, stacklevel=stacklevel)
    if has_step and not has_loader:
        warnings.warn("You defined a `validation_step` but have no `val_dataloader`. Skipping val loop.",
                      PossibleUserWarning, stacklevel=stacklevel)


def _check_optimizers(module, optimizers, accumulate_grad_batches, gradient_clip_val=None):
    # (several optimizers under automatic optimisation: parse_optimizers, where Lightning checks it; manual
    # optimisation again: a setup hook may have switched automatic_optimization off after the run's first check)
    if not module.automatic_optimization:
        _check_manual_optimization(module, gradient_clip_val, accumulate_grad_batches)


def _check_manual_optimization(module, gradient_clip_val, accumulate_grad_batches):
    if gradient_clip_val:  # (Lightning's error, its words first)
        raise MisconfigurationException(
            "Automatic gradient clipping is not supported for manual optimization. Remove "
            f"`Trainer(gradient_clip_val={gradient_clip_val})` or switch to automatic optimization. (Clip in "
            "training_step: self.clip_gradients(optimizer, gradient_clip_val=..., gradient_clip_algorithm=...) "
            "between manual_backward and step.)")
    if accumulate_grad_batches != 1:
        # The loop would step the user's optimizers at every batch regardless: say so instead of ignoring it.
        raise MisconfigurationException(
            "Automatic gradient accumulation is not supported for manual optimization. Remove "
            f"`Trainer(accumulate_grad_batches={accumulate_grad_batches})` or switch to automatic optimization. ("
            f"accumulate_grad_batches={accumulate_grad_batches} (Trainer argument or the launch config's "
            "gradient_accumulation_steps) does nothing under manual optimisation (automatic_optimization = "
            "False): training_step steps the optimizers itself. Remove it, and accumulate in training_step "
            "(call opt.step() and opt.zero_grad() every N batches).)"
        )


def _refuse_sync_batchnorm_on_cpus(strategy, sync_batchnorm):
    # Lightning's run stops at the first training forward with torch's error; said here before training. (A world of
    # one is left to torch as under Lightning: its SyncBatchNorm syncs nothing in eval mode, and raises in training.)
    if sync_batchnorm and strategy.world_size > 1 and strategy.root_device.type == "cpu":
        raise ValueError("sync_batchnorm=True: torch's SyncBatchNorm runs on GPUs only, and this run is on "
                         "the CPU. Remove it (each process then normalises with its own batch statistics).")


class _StageRun:
    """One stage of the Trainer, as strategy.launch runs it on every rank: `run(train_loader, eval_loader)`.

    A strategy that starts the ranks in new processes (ddp_spawn) pickles it to them; rank 0 sends back
    `collect(result)`, and `restore(collected)` puts that into this process's trainer and module."""

    def __init__(self, trainer, stage, module, datamodule, ckpt_path, gather, compiled=None, hint_srun=False):
        self.trainer, self.stage, self.module, self.ckpt_path, self.gather = trainer, stage, module, ckpt_path, gather
        self.datamodule = datamodule  # (the run's, None where none was given: attached where the stage runs)
        self.compiled = compiled  # the torch.compile wrapper the stage was given (its settings compile the module)
        self.hint_srun = hint_srun  # no checkpoint path given: Lightning's srun hint, by the rank 0 that runs it

    def __call__(self, train_loader, eval_loader):
        self.trainer._attach_run_data(self.module, self.datamodule)
        if self.hint_srun:  # (pointing at the user's trainer.fit(...): here, strategy.launch, _run, fit, the user)
            warn_if_srun_unused(self.trainer.global_rank, stacklevel=6)
        return self.trainer._run_stage(self.stage, self.module, train_loader, eval_loader, self.ckpt_path, self.gather,
                                       self.compiled)

    def collect(self, result):
        trainer = self.trainer
        return {
            "state_dict": self.module.state_dict(),
            "train_state": trainer.state.state_dict(),
            "status": (trainer.state.status, trainer.state.fn),  # (Lightning's parent takes the child's state)
            "callback_metrics": dict(trainer.callback_metrics),
            "logged_metrics": dict(trainer.logged_metrics),
            "callbacks": Callbacks(trainer.callbacks).state_dict(),
            "epoch_cut_short": trainer._epoch_cut_short,
            "result": result,
        }

    def restore(self, collected):
        trainer, module = self.trainer, self.module
        module.load_state_dict(collected["state_dict"])
        module.trainer = trainer
        trainer.module = module
        trainer.state.load_state_dict(collected["train_state"])
        trainer._epoch_cut_short = collected["epoch_cut_short"]  # (current_epoch, and where the next fit starts)
        trainer.state.status, trainer.state.fn = collected["status"]
        # Lightning's parent updates its callback_metrics with each spawned run's (it runs no stage that would reset
        # them): a validate after a fit still shows the fit's train_loss beside its own
        trainer._callback_metrics_cache.update(collected["callback_metrics"])
        trainer._logged_metrics = collected["logged_metrics"]
        Callbacks(trainer.callbacks).load_state_dict(collected["callbacks"])
        return collected["result"]


_NULL = contextlib.nullcontext()
_RUNNING_STAGE = {"fit": RunningStage.TRAINING, "validate": RunningStage.VALIDATING, "test": RunningStage.TESTING,
                  "predict": RunningStage.PREDICTING}


def _inf_counts(counts):
    return [float("inf") if count is None else count for count in counts]


def _to_scalar(key, value):
    """A logged value as loggers receive it (Lightning's convert_tensors_to_scalars): a tensor's one element as a
    Python number; anything else unchanged."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"The metric `{key}` does not contain a single element, thus it cannot be converted to a "
                             f"scalar. Found `{value}`")
        return value.item()
    return value


def _check_weights_only(stage, weights_only):
    if weights_only not in (None, True, False):
        raise ValueError(f"Trainer.{stage}(weights_only={weights_only!r}): use None, True or False.")
