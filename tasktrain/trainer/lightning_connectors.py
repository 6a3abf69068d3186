"""Lightning's connector attributes (`trainer._checkpoint_connector`, `trainer._accelerator_connector`,
`trainer._data_connector`, `trainer._logger_connector`), as thin views of the Trainer: scripts and callbacks written for Lightning reach into them
(a `configure_optimizers` that sizes a schedule with `trainer.fit_loop._data_source.dataloader()`,
a callback that restores the best weights with `trainer._checkpoint_connector.restore(path)`, a DataModule that reads
`trainer._accelerator_connector.is_distributed`).

There are no connectors here: each method calls the Trainer's own room (resume.py for checkpoints, run.py for
prepare_data, the module's / DataModule's hooks for loaders) and each attribute reads the Trainer or its strategy.
A name Lightning's connector has and these views do not raises AttributeError saying so, rather than a bare
"has no attribute".

    _checkpoint_connector   resume_start(path) / resume_end(), restore(path), restore_model(), restore_datamodule(),
                            restore_callbacks(), restore_training_state(), dump_checkpoint(weights_only),
                            _parse_ckpt_path(...), _ckpt_path, _user_managed, _loaded_checkpoint
    _accelerator_connector  read only: strategy, accelerator, precision_plugin, checkpoint_io, cluster_environment,
                            is_distributed, use_distributed_sampler, _precision_flag, _strategy_flag,
                            _accelerator_flag, _devices_flag, _parallel_devices, _num_nodes_flag
    _data_connector         prepare_data(), attach_data(model, ...loaders, datamodule=), attach_dataloaders(model,
                            ...), attach_datamodule(model, datamodule), _datahook_selector (the loop views'
                            setup_data() sets up what they attached: lightning_loops.py)
    _logger_connector       should_update_logs (a callback that writes images at the loggers' cadence reads it)
    the loops' _data_source (trainer.fit_loop._data_source, ...: lightning_loops.py reads data_source here):
                            instance, name, dataloader(), is_defined(), is_module()
"""
import logging

import torch

from tasktrain.strategies.base import MultiProcess
from tasktrain.trainer import resume, run
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.metrics import hook_scope
from tasktrain.trainer.module import TaskModule, is_overridden
from tasktrain.trainer.states import RunningStage, TrainerFn

log = logging.getLogger("tasktrain")


class _View:
    """A connector view: made once per Trainer (ConnectorAttribute); an unknown name is refused by name."""

    _what = ""  # what the view covers, for the refusal
    _instead = ""

    def __init__(self, trainer):
        self.trainer = trainer

    def __getattr__(self, name):  # (only reached for names the view does not define)
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"trainer.{self._what}.{name}: Lightning's connector internal {name!r} is not supported by tasktrain, "
            f"which has no connector objects; trainer.{self._what} offers {self._offers}. {self._instead}")


class ConnectorAttribute:
    """`Trainer._checkpoint_connector`: the view, made once per Trainer. Lightning lets a test replace a connector;
    tasktrain has none, so an assignment is refused rather than ignored."""

    def __init__(self, view):
        self.view = view

    def __set_name__(self, owner, name):
        self.name, self.key = name, f"_{name}_view"

    def __get__(self, trainer, owner=None):
        if trainer is None:
            return self
        view = trainer.__dict__.get(self.key)
        if view is None:
            view = trainer.__dict__[self.key] = self.view(trainer)
        return view

    def __set__(self, trainer, value):
        raise AttributeError(f"trainer.{self.name} cannot be replaced: tasktrain has no connector objects, only this "
                             "read view of the Trainer (tasktrain/trainer/lightning_connectors.py).")


# -- trainer._checkpoint_connector ------------------------------------------------------------------------------------
class CheckpointConnector(_View):
    """Lightning's _CheckpointConnector's public steps over resume.py: resume_start reads a checkpoint into
    `_loaded_checkpoint`, each restore_* applies its part to the Trainer's module (`trainer.lightning_module`, or the one
    given to `trainer.strategy.connect(model)`), DataModule, callbacks, precision, optimizers, schedulers and counters,
    resume_end lets the dict go. restore(path) runs them all, in Lightning's order."""

    _what = "_checkpoint_connector"
    _offers = ("resume_start(), resume_end(), restore(), restore_model(), restore_datamodule(), restore_callbacks(), "
               "restore_training_state(), dump_checkpoint(), _parse_ckpt_path(), _ckpt_path, _user_managed, "
               "_loaded_checkpoint")
    _instead = ("Pass ckpt_path= to trainer.fit / validate / test / predict, or save with trainer.save_checkpoint; "
                "SLURM's requeue checkpoints are written and found by the Trainer itself (docs/lightning.md).")

    def __init__(self, trainer):
        super().__init__(trainer)
        self._loaded_checkpoint = {}

    @property
    def _ckpt_path(self):
        """Lightning's: the checkpoint the last run (or resume_start) loaded: trainer.ckpt_path."""
        return self.trainer.ckpt_path

    @property
    def _user_managed(self):
        """Lightning's: `trainer.ckpt_path = path` was set (every run loads it until set to None)."""
        return self.trainer._ckpt_user_path is not None

    def resume_start(self, checkpoint_path=None, weights_only=None):
        """Read `checkpoint_path` into `_loaded_checkpoint` (nothing without one); trainer.ckpt_path names it."""
        self.trainer._resumed_from = checkpoint_path  # (Lightning's _ckpt_path, which trainer.ckpt_path reads)
        if not checkpoint_path:
            return
        if self.trainer.is_global_zero:
            log.info(f"Restoring states from the checkpoint path at {checkpoint_path}")
        self._loaded_checkpoint = resume.read(self.trainer, checkpoint_path, weights_only)

    def resume_end(self):
        """Let the checkpoint's dict go (trainer.ckpt_path keeps its path), then meet the other ranks."""
        trainer = self.trainer
        if trainer.state.fn is None:
            raise RuntimeError("trainer._checkpoint_connector.resume_end() needs trainer.state.fn (the entry point "
                               "the checkpoint is restored for): set it, or pass ckpt_path= to the entry point.")
        if trainer.ckpt_path and trainer.is_global_zero:
            what = "Restored all states" if trainer.state.fn == TrainerFn.FITTING else "Loaded model weights"
            log.info(f"{what} from the checkpoint at {trainer.ckpt_path}")
        self._loaded_checkpoint = {}
        trainer.strategy.barrier("_CheckpointConnector.resume_end")

    def restore(self, checkpoint_path=None, weights_only=None):
        """Everything at once, in Lightning's order: read, DataModule, module, callbacks, training state, release."""
        self.resume_start(checkpoint_path, weights_only)
        self.restore_datamodule()
        self.restore_model()
        self.restore_callbacks()
        self.restore_training_state()
        self.resume_end()

    def _module(self):
        module = self.trainer.lightning_module
        if module is None:
            raise RuntimeError(f"trainer.{self._what}: no module is attached to the Trainer; run an entry point or "
                               "call trainer.strategy.connect(model) first.")
        return module

    def restore_model(self):
        """The module's on_load_checkpoint, then its weights (strict as module.strict_loading)."""
        if self._loaded_checkpoint:
            resume.restore_module(self.trainer, self._module(), self._loaded_checkpoint)

    def restore_datamodule(self):
        if self._loaded_checkpoint:
            resume.restore_datamodule(self.trainer, self._loaded_checkpoint)

    def restore_callbacks(self):
        """Each callback's on_load_checkpoint, then their states."""
        if self._loaded_checkpoint:
            resume.restore_callbacks(self.trainer, self._module(), self._loaded_checkpoint)

    def restore_training_state(self):
        """The precision plugin's state; while fitting also the optimizers, schedulers and the loop's counters (the
        optimizers must exist: from on_fit_start on). A weights-only checkpoint raises Lightning's KeyError there."""
        ckpt, trainer = self._loaded_checkpoint, self.trainer
        if not ckpt:
            return
        if trainer.state.fn != TrainerFn.FITTING:
            resume.restore_precision(trainer, ckpt)
            return
        # (resume.load's checks: a weights-only file, or one without tasktrain's loop state, is refused there)
        loaded = resume.Loaded(trainer.ckpt_path, ckpt)
        resume.check_resumable(trainer, loaded)
        resume.restore_training_state(trainer, loaded)

    def _parse_ckpt_path(self, state_fn, ckpt_path, model_provided, model_connected):
        """The file an entry point `state_fn` loads for `ckpt_path` ("best", "last", a path or None), by the rules
        and with the warnings of the Trainer's runs (resume.py): None with a module given; "best" of the last fit
        for an evaluation of the connected module; "last" for a fit beside an OnExceptionCheckpoint."""
        from tasktrain.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

        trainer, fn = self.trainer, TrainerFn(state_fn).value
        if ckpt_path is None and trainer.state.fn == TrainerFn.FITTING and \
                any(isinstance(c, OnExceptionCheckpoint) for c in trainer.callbacks):
            ckpt_path = resume.on_exception_default(trainer, fn)
        if model_provided and ckpt_path is None:
            return None
        if model_connected and ckpt_path is None:
            ckpt_path = resume.default_eval_ckpt_path(trainer, fn)
        return resume.resolve_ckpt_path(trainer, ckpt_path, fn)

    def dump_checkpoint(self, weights_only=None):
        """The checkpoint dict trainer.save_checkpoint writes (weights_only None: False, as Lightning's)."""
        return resume.dump_checkpoint(self.trainer, bool(weights_only))

    def restore_loops(self):
        raise NotImplementedError(
            "trainer._checkpoint_connector.restore_loops(): tasktrain's loop counters are one record "
            "(trainer.state), restored with the optimizers: call restore_training_state() (while fitting).")


# -- trainer._accelerator_connector -----------------------------------------------------------------------------------
class AcceleratorConnector(_View):
    """Lightning's _AcceleratorConnector, read only: what the Trainer resolved from accelerator=, strategy=, devices=,
    num_nodes=, precision= (their `_*_flag` values as Lightning's hold them once resolved)."""

    _what = "_accelerator_connector"
    _offers = ("strategy, accelerator, precision_plugin, checkpoint_io, cluster_environment, is_distributed, "
               "use_distributed_sampler, _precision_flag, _strategy_flag, _accelerator_flag, _devices_flag, "
               "_parallel_devices, _num_nodes_flag (read only)")
    _instead = "Pass accelerator=, strategy=, devices=, num_nodes=, precision=, plugins= to the Trainer."

    def __setattr__(self, name, value):
        if name == "trainer":
            return object.__setattr__(self, name, value)
        raise AttributeError(f"trainer._accelerator_connector.{name} is read only in tasktrain: pass the setting to "
                             "the Trainer (use_distributed_sampler=, strategy=, devices=, ...).")

    @property
    def strategy(self):
        return self.trainer.strategy

    @property
    def accelerator(self):
        return self.trainer.accelerator

    @property
    def precision_plugin(self):
        return self.trainer.precision_plugin

    @property
    def checkpoint_io(self):
        return self.trainer.strategy.checkpoint_io

    @property
    def cluster_environment(self):
        return self.trainer.strategy.cluster_environment

    @property
    def is_distributed(self):
        """Lightning's: a strategy of several processes (DDP, FSDP, DeepSpeed, ...), even a world of one."""
        return isinstance(self.trainer.strategy, MultiProcess)

    @property
    def use_distributed_sampler(self):
        return self.trainer.use_distributed_sampler

    @property
    def _precision_flag(self):
        return self.trainer.precision

    @property
    def _strategy_flag(self):
        """The strategy name given to the Trainer; the strategy object where it was chosen ("auto") or given."""
        given = self.trainer._given_flags["strategy"]
        return given if isinstance(given, str) and given != "auto" else self.trainer.strategy

    @property
    def _accelerator_flag(self):
        return self.trainer.strategy.root_device.type

    @property
    def _devices_flag(self):
        """Lightning's parsed devices: the count on CPU, the device indices on CUDA."""
        if self._accelerator_flag == "cpu":
            return self.trainer.num_devices
        return list(self.trainer.device_ids)

    @property
    def _parallel_devices(self):
        kind = self._accelerator_flag
        if kind == "cpu":
            return [torch.device("cpu")] * self.trainer.num_devices
        return [torch.device(kind, index) for index in self.trainer.device_ids]

    @property
    def _num_nodes_flag(self):
        return self.trainer.num_nodes


# -- trainer._data_connector, and the loops' _data_source ------------------------------------------------------------
class DataLoaderSource:
    """Lightning's _DataLoaderSource(instance, name), as `trainer.fit_loop._data_source` (and
    `fit_loop.epoch_loop.val_loop`'s, `validate_loop`'s, `test_loop`'s, `predict_loop`'s): where the current (or last)
    run takes one kind of loader from. `instance`: the loaders given to the entry point, else the DataModule, else the
    module (tasktrain's order, the one its runs use; None before any run); `name`: the hook. Read only: a run attaches
    its loaders itself."""

    def __init__(self, instance, name):
        object.__setattr__(self, "instance", instance)
        object.__setattr__(self, "name", name)

    def __setattr__(self, name, value):
        raise AttributeError(f"_data_source.{name} cannot be set in tasktrain: a run takes the loaders given to its "
                             "entry point (trainer.fit(module, train_dataloaders=...)), else the DataModule's or the "
                             "module's hooks.")

    def __repr__(self):
        return f"DataLoaderSource(instance={type(self.instance).__name__}, name={self.name!r})"

    def is_module(self):
        return isinstance(self.instance, (TaskModule, DataModule))

    def is_defined(self):
        """Loaders were given, or the module / DataModule overrides the hook."""
        if not self.is_module():
            return True
        base = DataModule if isinstance(self.instance, DataModule) else TaskModule
        return is_overridden(self.name, self.instance, base)

    def dataloader(self):
        """The loaders: the given ones, or what the hook of the module / DataModule returns now (called again, as
        Lightning's), inside the Trainer it is attached to (named for self.log, profiled as a run's hook)."""
        if self.is_module():
            trainer = self.instance.trainer  # (a module not attached raises its own error)
            if trainer is None:
                raise RuntimeError(f"{type(self.instance).__name__}.{self.name}(): the DataModule is not attached "
                                   "to a Trainer (a run, or trainer._data_connector.attach_datamodule, attaches it).")
            kind = "LightningDataModule" if isinstance(self.instance, DataModule) else "LightningModule"
            with hook_scope(trainer, self.name), \
                    trainer._profile(f"[{kind}]{type(self.instance).__name__}.{self.name}"):
                return getattr(self.instance, self.name)()
        if self.instance is None:
            raise RuntimeError(f"No {self.name.split('_')[0]} loaders are attached yet: a Trainer entry point "
                               "(fit / validate / test / predict) attaches them.")
        return self.instance


_GIVEN_TO = {  # which of _given_loaders (train, eval) the last run's entry point filled, by the loop's loader kind
    "train": {TrainerFn.FITTING: 0},
    "val": {TrainerFn.FITTING: 1, TrainerFn.VALIDATING: 1},
    "test": {TrainerFn.TESTING: 1},
    "predict": {TrainerFn.PREDICTING: 1},
}


def data_source(trainer, kind):
    """The DataLoaderSource of a loop's loaders (`kind`: "train", "val", "test", "predict"): what
    trainer._data_connector.attach_dataloaders / attach_datamodule recorded since the last run started, else as of the
    last run."""
    attached = trainer._attached_sources
    if attached is not None:
        return DataLoaderSource(attached[kind], f"{kind}_dataloader")
    module = trainer.lightning_module
    if module is None:  # (Lightning's before any entry point: a source of nothing)
        return DataLoaderSource(None, f"{kind}_dataloader")
    slot = _GIVEN_TO[kind].get(trainer.state.fn)
    given = trainer._given_loaders[slot] if slot is not None else None
    if given is not None:
        instance = given
    elif trainer._attached[1] is not None:
        instance = trainer._attached[1]
    else:
        instance = module
    return DataLoaderSource(instance, f"{kind}_dataloader")


class DataConnector(_View):
    """Lightning's _DataConnector: prepare_data(), attach_data() / attach_dataloaders() / attach_datamodule() (where
    the loop views' setup_data() and _data_source take each kind of loader from, until the next run attaches its
    own) and `_datahook_selector` (whose transfer hooks a run calls)."""

    _what = "_data_connector"
    _offers = ("prepare_data(), attach_data(), attach_dataloaders(), attach_datamodule() and _datahook_selector")
    _instead = ("Loaders are attached when an entry point runs: pass them (or a DataModule) to trainer.fit / "
                "validate / test / predict; where a run takes them from is trainer.fit_loop._data_source (and "
                "validate_loop's, test_loop's, predict_loop's), the loaders in use trainer.train_dataloader, "
                "trainer.val_dataloaders, ...")

    def prepare_data(self):
        """The DataModule's and the module's prepare_data, once per machine (or once in all), as a run calls them."""
        run.prepare_data(self.trainer, self.trainer.lightning_module)

    def attach_data(self, model, train_dataloaders=None, val_dataloaders=None, test_dataloaders=None,
                    predict_dataloaders=None, datamodule=None):
        """Lightning's: attach_dataloaders, then attach_datamodule, then give `model` this Trainer."""
        self.attach_dataloaders(model, train_dataloaders, val_dataloaders, test_dataloaders, predict_dataloaders)
        self.attach_datamodule(model, datamodule)
        model.trainer = self.trainer

    def attach_dataloaders(self, model, train_dataloaders=None, val_dataloaders=None, test_dataloaders=None,
                           predict_dataloaders=None):
        """Record each kind's source, the loaders given, else `model`'s hook (Lightning's rule), for the loop views'
        `setup_data()` and `_data_source`; the loaders set up before are let go (trainer.train_dataloader,
        val_dataloaders, ... read None until set up again), as Lightning's attach drops its loops' loaders. A run
        does not read this record: each entry point attaches its own loaders (they replace it when it starts)."""
        trainer = self.trainer
        trainer._attached_sources = {
            "train": train_dataloaders if train_dataloaders is not None else model,
            "val": val_dataloaders if val_dataloaders is not None else model,
            "test": test_dataloaders if test_dataloaders is not None else model,
            "predict": predict_dataloaders if predict_dataloaders is not None else model,
        }
        trainer.train_dataloader = trainer._train_data = None
        trainer._val_loader = trainer._test_loaders = trainer._predict_loaders = None

    def attach_datamodule(self, model, datamodule=None):
        """Make `datamodule` the Trainer's (a run's datamodule= does the same) and every kind's source, and note
        `model` for _datahook_selector (as an entry point's run does: the next run replaces both); None attaches no
        DataModule (Lightning's)."""
        self.trainer._attached = (model, datamodule)
        if datamodule is not None:
            self.trainer._attached_sources = dict.fromkeys(("train", "val", "test", "predict"), datamodule)
            self.trainer.datamodule = datamodule
            datamodule.trainer = self.trainer

    @property
    def _datahook_selector(self):
        """Lightning's _DataHookSelector over the module and the DataModule (None where none was given) of the last
        attach: the last entry point's run, or attach_data / attach_datamodule since: get_instance(hook) says whose
        transfer hook runs, by the rule the runs follow (run.data_hook_owner). None before any, as Lightning's."""
        from tasktrain.trainer.connectors.data_connector import _DataHookSelector

        model, datamodule = self.trainer._attached
        return None if model is None else _DataHookSelector(model, datamodule)


# -- trainer._logger_connector ----------------------------------------------------------------------------------------
class LoggerConnector(_View):
    """Lightning's _LoggerConnector: `should_update_logs` only (what self.log records is read through
    trainer.callback_metrics / logged_metrics / progress_bar_metrics)."""

    _what = "_logger_connector"
    _offers = "should_update_logs"
    _instead = ("What self.log records is read through trainer.callback_metrics, trainer.logged_metrics and "
                "trainer.progress_bar_metrics; the loggers through trainer.loggers.")

    @property
    def should_update_logs(self):
        """Lightning's rule: whether the batch being run is one at which step values go to the loggers: in training
        the loggers' step + 1 (it may be read before the batch steps), in an evaluation or prediction the batches
        started in the loop, a multiple of log_every_n_steps; always when a stop was asked, never with
        log_every_n_steps=0, always outside a run."""
        trainer = self.trainer
        if trainer.log_every_n_steps == 0:
            return False
        stage = trainer.state.stage
        if stage is None:
            return True
        if stage == RunningStage.TRAINING:
            step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        else:
            fitting = trainer.state.fn == TrainerFn.FITTING
            loop = {RunningStage.SANITY_CHECKING: trainer.fit_loop.epoch_loop.val_loop,
                    RunningStage.VALIDATING: trainer.fit_loop.epoch_loop.val_loop if fitting else trainer.validate_loop,
                    RunningStage.TESTING: trainer.test_loop, RunningStage.PREDICTING: trainer.predict_loop}[stage]
            step = loop.batch_progress.current.ready
        return step % trainer.log_every_n_steps == 0 or trainer.should_stop
