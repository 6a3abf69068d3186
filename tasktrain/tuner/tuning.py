"""Tuner: the learning-rate finder and the batch-size finder, each a few short trial runs on the trainer it is given.

    tuner = Tuner(trainer)
    finder = tuner.lr_find(module, train_loader)   # sweeps the rate, sets module.lr to finder.suggestion()
    size = tuner.scale_batch_size(module)          # grows module.batch_size while a few steps still fit
    trainer.fit(module, ...)                       # the real run, from the module's original weights

The searches are those of the callbacks LearningRateFinder and BatchSizeFinder (tasktrain/callbacks/lr_finder.py,
batch_size_finder.py), which run them from inside a run (at its start, or from any hook of a subclass): `find_lr` and
`find_batch_size` below. The Tuner runs them as Lightning's does: the finder first among the trainer's callbacks,
with its early exit, and a real run of the method (fit, or validate / test / predict), which ends after the search.

A search leaves the module's weights and the run as it found them (the trainer's settings, its counters, loaders,
metrics, hook tables, the strategy's wrapped module and optimizers). The trials run with the trainer's callbacks,
loggers and profiler set aside: nothing is checkpointed, logged or profiled. They change only the attribute they tune
(and the learning rate of the optimizers already built, as Lightning's).
On several processes (Lightning's rules): the learning-rate sweep runs on every rank, stopped early when rank 0's
loss diverges, and every rank takes rank 0's results (so the same suggestion); the batch-size search is refused
(an out-of-memory error on one rank would leave the others waiting).
"""
import copy
import warnings

import tasktrain

from tasktrain.exceptions import MisconfigurationException
from tasktrain.strategies.base import MultiProcess
from tasktrain.trainer import resume
from tasktrain.trainer.seed import isolate_rng
from tasktrain.tuner import batch_size_scaling
from tasktrain.tuner.lr_finder import log as lr_finder_log
from tasktrain.tuner.lr_finder import lr_attr_name, lr_find, set_attr

_METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """Lightning's Tuner: lr_find and scale_batch_size on the trainer it is given."""

    def __init__(self, trainer: "tasktrain.Trainer"):
        self._trainer = trainer

    def lr_find(self, model, train_dataloaders=None, val_dataloaders=None, dataloaders=None, datamodule=None,
                method="fit", min_lr=1e-8, max_lr=1, num_training=100, mode="exponential",
                early_stop_threshold=4.0, update_attr=True, attr_name=""):
        """Train `num_training` steps with the rate growing from min_lr to max_lr ("exponential" or "linear"),
        recording the smoothed loss; stops early once the loss passes early_stop_threshold x its best (None: never).
        Returns an LRFinder (`results` {"lr": [...], "loss": [...]}, `suggestion()`); with update_attr, sets the
        module's `lr` / `learning_rate` attribute or hyper-parameter (or `attr_name`) to the suggestion."""
        if method != "fit":  # (Lightning's checks and words, in its order)
            raise MisconfigurationException("method='fit' is the only valid configuration to run lr finder.")
        _check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        from tasktrain.callbacks.lr_finder import LearningRateFinder

        if any(isinstance(cb, LearningRateFinder) for cb in self._trainer.callbacks):
            raise ValueError("Trainer is already configured with a `LearningRateFinder` callback.Please remove it if "
                             "you want to use the Tuner.")
        check_lr_find_arguments(mode)
        finder = LearningRateFinder(min_lr=min_lr, max_lr=max_lr, num_training_steps=num_training, mode=mode,
                                    early_stop_threshold=early_stop_threshold, update_attr=update_attr,
                                    attr_name=attr_name)
        _run_with(self._trainer, finder, "fit", model, train_dataloaders, val_dataloaders, datamodule)
        return finder.optimal_lr

    def scale_batch_size(self, model, train_dataloaders=None, val_dataloaders=None, dataloaders=None,
                         datamodule=None, method="fit", mode="power", steps_per_trial=3, init_val=2, max_trials=25,
                         batch_arg_name="batch_size", margin=0.05, max_val=8192):
        """The largest batch size (module.<batch_arg_name>, or its hyper-parameter, or the DataModule's, read by
        their own *_dataloader hooks) with which `steps_per_trial` steps of `method` (fit: training, and validation
        where the fit's would run within them) run without running out of memory: doubled from init_val until a
        trial fails ("power"), then, in "binsearch", bisected between the last size that fit and the first that did
        not, less `margin`; never past max_val. Sets it wherever it is held and returns it."""
        _check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        from tasktrain.callbacks.batch_size_finder import BatchSizeFinder

        if isinstance(self._trainer.strategy, MultiProcess):  # (Lightning's rule: a distributed strategy, even of one)
            raise ValueError("Tuning the batch size is currently not supported with distributed strategies.")
        if any(isinstance(cb, BatchSizeFinder) for cb in self._trainer.callbacks):
            raise ValueError("Trainer is already configured with a `BatchSizeFinder` callback.Please remove it if "
                             "you want to use the Tuner.")
        if not 0.0 <= margin < 1.0:  # (Lightning's assert, before its callback checks the mode)
            raise AssertionError(f"`margin` should be between 0 and 1. Found margin={margin!r}")
        finder = BatchSizeFinder(mode=mode, steps_per_trial=steps_per_trial, init_val=init_val,
                                 max_trials=max_trials, batch_arg_name=batch_arg_name, margin=margin, max_val=max_val)
        loaders = dataloaders if method != "fit" else train_dataloaders
        _run_with(self._trainer, finder, method, model, loaders, val_dataloaders, datamodule)
        return finder.optimal_batch_size


def _run_with(trainer, finder, method, model, loaders, val_loaders, datamodule):
    """Lightning's Tuner: the finder first among the trainer's callbacks, with its early exit, and the run of `method`
    (its set-up hooks, the callbacks' too; the search at the run's start; then the run ends, torn down as a finished
    one); the finder is removed after."""
    finder._early_exit = True
    trainer.callbacks = [finder] + trainer.callbacks
    try:
        if method == "fit":
            trainer.fit(model, loaders, val_loaders, datamodule)
        else:
            getattr(trainer, method)(model, loaders, datamodule=datamodule)
    finally:
        trainer.callbacks = [cb for cb in trainer.callbacks if cb is not finder]


# -- the one implementation (the Tuner's and the callbacks') --------------------------------------------------------
def find_lr(trainer, model, loaders, min_lr, max_lr, num_training, mode, early_stop_threshold, update_attr,
            attr_name):
    """The learning-rate sweep from inside a fit of `model` (the callback's hook; the Tuner's fit too), RNG isolated
    as Lightning's: an LRFinder, or None under fast_dev_run. With update_attr the suggestion is set on the module and
    on the optimizers already built (their configure_optimizers ran before the sweep: Lightning's rule)."""
    if _skipped(trainer, "learning rate finder"):
        return None
    tuning = _tuning(trainer, model, "lr_find")
    # Lightning's fit loop sets its training data up again after the restore (its loader requested now, not later)
    tuning.after_restore = _request_train_data
    name = lr_attr_name(model, attr_name) if update_attr else None
    with isolate_rng(), tuning:
        finder = lr_find(trainer, model, loaders, min_lr, max_lr, num_training, mode, early_stop_threshold)
    if name is not None:
        lr = finder.suggestion()  # (None: it logged Lightning's error; the rate is left as it was)
        if lr is not None:
            set_attr(model, name, lr)
            for optimizer in trainer.optimizers or []:  # (the run goes on at the suggested rate)
                for group in optimizer.param_groups:
                    group["lr"] = lr
            lr_finder_log.info(f"Learning rate set to {lr}")
    return finder


def find_batch_size(trainer, model, loaders, mode, steps_per_trial, init_val, max_trials, batch_arg_name, margin,
                    max_val):
    """The batch-size search from inside a run of `model` (the callback's hook; the Tuner's run too): the size found,
    or None under fast_dev_run. The run's loaders are built again with the size found, before the restore's hooks
    (as Lightning resets its loops' data then): a fit's now, an evaluation run's before its first batch."""
    if _skipped(trainer, "batch size scaler"):
        return None
    tuning = _tuning(trainer, model, "scale_batch_size")
    tuning.before_restore = _rebuild_run_data
    with tuning:
        size = batch_size_scaling.scale_batch_size(trainer, model, loaders, mode, steps_per_trial, init_val,
                                                   max_trials, batch_arg_name, margin, max_val)
    return size


# -- checks (Lightning's words) -------------------------------------------------------------------------------------
def check_lr_find_arguments(mode):
    if str(mode).lower() not in ("linear", "exponential"):
        raise ValueError("`mode` should be either of ('linear', 'exponential')")


def check_batch_size_arguments(mode, margin):
    if str(mode).lower() not in ("power", "binsearch"):
        raise ValueError("`mode` should be either of ('power', 'binsearch')")
    if not 0.0 <= margin < 1.0:  # (an AssertionError, as Lightning's assert; raised also under python -O)
        raise AssertionError(f"`margin` should be between 0 and 1. Found margin={margin!r}")


def check_batch_attribute(model, datamodule, name):
    """Lightning's: the batch size must be a field of the module, its hparams, or the DataModule."""
    owners = [model, datamodule]
    if not any(owner is not None and (hasattr(owner, name) or name in getattr(owner, "hparams", {}))
               for owner in owners):
        raise MisconfigurationException(f"Field {name} not found in `model`, `datamodule`, nor their `hparams` "
                                        "attributes.")
    if hasattr(model, name) and name in getattr(model, "hparams", {}):
        warnings.warn(f"Field `model.{name}` and `model.hparams.{name}` are mutually exclusive! `model.{name}` will "
                      "be used as the initial batch size for scaling. If this is not the intended behavior, please "
                      "remove either one.", UserWarning, stacklevel=3)


def check_batch_size_setup(trainer, module, stage, batch_arg_name):
    """BatchSizeFinder.setup's checks (Lightning's, in its order and words): one process, loaders built by the
    module's or the DataModule's hooks (one per evaluation stage), and the attribute to tune."""
    if isinstance(trainer.strategy, MultiProcess):  # (Lightning's rule: a distributed strategy, even of one process)
        raise MisconfigurationException("The Batch size finder is not supported with distributed strategies.")
    stage = str(getattr(stage, "value", stage))
    given_train, given_eval = trainer._given_loaders
    if given_train is not None or (stage != "fit" and given_eval is not None):
        # (Lightning refuses loaders given to fit only; loaders given to validate/test/predict would be run at their
        # own size whatever the search found: refused too, rather than a search that changes nothing)
        raise loaders_passed_error(stage)
    if stage != "fit":
        hook = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}[stage]
        loaders = trainer._loader_of(module, hook)
        if isinstance(loaders, (list, tuple, dict)) and len(loaders) > 1:
            prefix = {"validate": "val"}.get(stage, stage)
            raise MisconfigurationException(f"The Batch size finder cannot be used with multiple {prefix} "
                                            "dataloaders.")
    check_batch_attribute(module, trainer.datamodule, batch_arg_name)


def run_loaders(trainer):
    """The fit in progress's data, as a trial's keyword arguments: its DataModule, else the loaders passed to it
    (None: the module's hooks)."""
    if trainer.datamodule is not None:
        return {"datamodule": trainer.datamodule}
    given_train, given_val = trainer._given_loaders
    return {"train_dataloaders": given_train, "val_dataloaders": given_val}


def loaders_passed_error(method):
    return MisconfigurationException(
        f"The Batch size finder cannot be used with dataloaders passed directly to `.{method}()`. Please disable the "
        "feature or incorporate the dataloader into your TaskModule or DataModule (the size it finds is read by "
        "their *_dataloader hooks; a loader passed in is already built with one size).")


def _check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method):
    if method not in _METHODS:
        raise ValueError(f"method {method!r} is invalid. Should be one of {_METHODS}.")
    if method == "fit":
        if dataloaders is not None:
            raise MisconfigurationException(
                f"In tuner with method={method!r}, `dataloaders` argument should be None, please consider setting "
                "`train_dataloaders` and `val_dataloaders` instead.")
    elif train_dataloaders is not None or val_dataloaders is not None:
        raise MisconfigurationException(
            f"In tuner with `method`={method!r}, `train_dataloaders` and `val_dataloaders` arguments should be None, "
            "please consider setting `dataloaders` instead.")


def _is_datamodule(value):
    from tasktrain.trainer.datamodule import DataModule

    return isinstance(value, DataModule)


def _skipped(trainer, what):
    """Lightning's rule: a fast_dev_run trainer only checks that the code runs, so nothing is tuned (None)."""
    if trainer.fast_dev_run:
        warnings.warn(f"Skipping {what} since `fast_dev_run` is enabled.", UserWarning, stacklevel=4)
        return True
    return False


class _tuning:
    """Set the trainer up for trials (no callbacks, loggers or sanity check; the run's profiler records them) and put
    everything back after: the trainer's attributes as they were (its settings, its counters, and inside a run that
    run's loaders, metric store, hook tables and fit state), the strategy's (the run's wrapped module and optimizers:
    a trial's teardown drops them), the module's weights, buffers and train/eval modes, and the state of the
    optimizers and schedulers already built (a configure_optimizers that returns the same objects each time trains
    them)."""

    def __init__(self, trainer, model, name):
        # (several processes: the batch-size search is refused before this, in Lightning's words; the lr sweep runs on
        # every rank, its early stop and results rank 0's: lr_finder.py)
        if trainer._metrics is None:
            raise RuntimeError(f"{name} runs from a hook of a run in progress (a finder callback's, or the Tuner's "
                               "run): use tasktrain.tuner.Tuner(trainer).{name}(module) outside a run.")
        self.trainer, self.model = trainer, model
        self.before_restore = self.after_restore = None  # f(trainer): the run's data set up again, around the restore

    def __enter__(self):
        trainer, strategy = self.trainer, self.trainer.strategy
        # (shallow: the run in progress holds these very objects, e.g. trainer.state, and must find them again)
        self.attributes = dict(trainer.__dict__)
        self.predict_counts = list(trainer._predict_counts)  # (a list the trials count in, in place)
        self.callbacks = list(trainer.callbacks)
        self.strategy_attributes = dict(strategy.__dict__)
        self.precision = copy.deepcopy(strategy.precision.state_dict()) if hasattr(
            strategy.precision, "state_dict") else None
        self.weights = copy.deepcopy(self.model.state_dict())
        self.modes = [(module, module.training) for module in self.model.modules()]
        self.optimizers = [(o, copy.deepcopy(o.state_dict())) for o in (trainer.optimizers or [])]
        self.schedulers = [(c.scheduler, copy.deepcopy(c.scheduler.state_dict()))
                           for c in (getattr(trainer, "lr_scheduler_configs", None) or [])]
        # Lightning's finders save the run to a checkpoint and restore it after: its hooks run here too (resume.py:
        # trial_save now, trial_restored at the end)
        trainer._trial_callbacks = self.callbacks
        trainer._trial_checkpoint = resume.trial_save(trainer)
        # (the Trainer's own gradient clipping, gradient_clip_val, stays: a callback here, no callback in Lightning,
        # whose trials clip)
        trainer.callbacks = [cb for cb in self.callbacks if getattr(cb, "from_trainer", False)]
        trainer._loggers = []  # (loggers that are not callbacks too)
        # (the profiler stays: Lightning's records the trials' actions; a trial neither sets it up nor reports it)
        trainer.num_sanity_val_steps = 0
        # Lightning's trials run its loop alone (_try_loop_run) on what the run set up: no on_fit_start / on_fit_end,
        # none of the set-up and teardown hooks, nothing of the run's set-up again (prepare_data, configure_callbacks,
        # configure_model, configure_optimizers: the trial steps the run's optimizers, put back after)
        trainer._trial_skips = ("on_fit_start", "on_fit_end", "setup", "teardown", "prepare_data",
                                "configure_callbacks", "configure_model", "configure_optimizers")
        return self

    def __exit__(self, *exc):
        trainer, strategy = self.trainer, self.trainer.strategy
        checkpoint = trainer._trial_checkpoint
        trainer.__dict__.clear()
        trainer.__dict__.update(self.attributes)
        trainer.callbacks[:] = self.callbacks  # (the same list object, its items as they were)
        trainer._predict_counts[:] = self.predict_counts  # (Lightning's loop state, put back after its trials)
        strategy.__dict__.clear()
        strategy.__dict__.update(self.strategy_attributes)
        if self.precision is not None:
            strategy.precision.load_state_dict(self.precision)
        self.model.load_state_dict(self.weights)
        for module, training in self.modes:
            module.training = training
        for optimizer, state in self.optimizers:
            optimizer.load_state_dict(state)
        for scheduler, state in self.schedulers:
            scheduler.load_state_dict(state)
        self.model.trainer = trainer
        searched = exc[0] is None  # (after a failed trial its error is raised, not a loader hook's)
        if searched and self.before_restore is not None:
            self.before_restore(trainer)
        # (Lightning restores in a `finally`: after a failed trial too)
        resume.trial_restored(trainer, self.model, checkpoint)
        if searched and self.after_restore is not None:
            self.after_restore(trainer)
        return False


def _request_train_data(trainer):
    """After an lr sweep at a fit's start: the training loader is requested now, as Lightning's fit loop sets its data
    up again after its restore (where the fit has not requested it yet; limit_train_batches=0 requests none)."""
    from tasktrain.trainer import loaders

    fit = trainer._fit_state
    if trainer.state.fn == "fit" and fit is not None and fit.epochs is None and trainer.limit_train_batches != 0:
        loaders.train_data_now(trainer)


def _rebuild_run_data(trainer):
    """After a batch-size search, before the restore's hooks: the run's loaders of the hooks are requested again
    now (at the size found), as Lightning's loops set up their data again there, and the run uses these (it does not
    request them again). A fit's training loader in use is replaced (an epoch starting now runs on the new one:
    loop.train_epoch), as are its validation loaders; an evaluation run takes its own before its first batch
    (evaluation.py)."""
    from tasktrain.trainer import loaders

    fit = trainer._fit_state
    if trainer.state.fn == "fit":
        if trainer._loaders_from_hooks[0] and trainer.limit_train_batches != 0:
            if fit is not None and fit.epochs is not None:
                loaders.reload(trainer, fit)
                trainer._train_data = fit.epochs
            else:  # (not requested yet, or requested early at the size before: requested now at the size found)
                trainer._train_data = None
                loaders.train_data_now(trainer)
        if trainer._loaders_from_hooks[1]:
            if trainer._val_loader is not None:
                loaders.setup_val(trainer, trainer._loader_of(trainer.module, "val_dataloader"))
            else:
                loaders.val_data_now(trainer)  # (where the fit validates)
    else:  # (the loaders and their counts, requested now; the run takes them before its first batch)
        from tasktrain.trainer.evaluation import eval_loaders

        stage = str(getattr(trainer.state.fn, "value", trainer.state.fn))
        trainer._eval_data_stale = eval_loaders(trainer, stage, trainer.module, None)
