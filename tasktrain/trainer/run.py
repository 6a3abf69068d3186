"""The run of one stage (fit / validate / test / predict) on a rank, around its loop: the start (environment,
fresh run state, profiler, metric store, the module's callbacks, hook tables, how batches reach the device), the
data hooks (prepare_data, the transfer hooks), the failure path (on_exception) and the teardown.
Trainer._run_stage calls them in that order."""
import contextlib
import logging
import sys
import warnings

from tasktrain.profilers import module_action, strategy_action
from tasktrain.callbacks.base import Callback
from tasktrain.callbacks.timer import Timer
from tasktrain.exceptions import PossibleUserWarning
from tasktrain.strategies.base import MultiProcess
from tasktrain.trainer.arguments import LITMODELS_TIP, _info, in_call_order
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.fit_state import build_hook_tables
from tasktrain.trainer.metrics import MetricStore, hook_scope, in_hook
from tasktrain.trainer import plugin_args
from tasktrain.trainer.module import (TaskModule, drop_unpicklable_hparams, hook_is_called, instance_flag,
                                      is_overridden)
from tasktrain.trainer.runtime import announce_rank
from tasktrain.trainer.seed import reset_seed
from tasktrain.trainer.states import TrainerFn, TrainerStatus


def attach_module_callbacks(trainer, module):
    """The module's configure_callbacks(): each replaces the trainer's callbacks of its exact type."""
    if trainer._pending_litmodels_tip:  # Lightning's tip, once, where its _attach_model_callbacks gives it
        trainer._pending_litmodels_tip = False
        _info(LITMODELS_TIP)
    if not hook_is_called("configure_callbacks", module, TaskModule) and trainer._profiler is None:
        return  # (Lightning calls it always; the base's returns nothing: called here only to be timed, as there)
    if "configure_callbacks" in trainer._trial_skips:  # a tuner's trial inside a run: the run attached them
        return
    with hook_scope(trainer, "configure_callbacks"), \
            trainer._profile(module_action(module, "configure_callbacks")):  # (named for self.log, which refuses it)
        extra = module.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    replaced = {type(c) for c in extra}
    trainer.callbacks = in_call_order([c for c in trainer.callbacks if type(c) not in replaced] + extra)


def prepare_data(trainer, module):
    """prepare_data (the DataModule's, then the module's) once per machine (local rank 0), or once in all
    (prepare_data_per_node=False: local rank 0 of node 0, Lightning's rule, which a cluster whose global rank 0 is
    not there follows too); the other ranks wait at a barrier, so that setup() finds the files."""
    local_zero = trainer.local_rank == 0
    node_zero = local_zero and trainer.node_rank == 0
    for owner, base in ((trainer.datamodule, DataModule), (module, TaskModule)):
        if owner is None or not is_overridden("prepare_data", owner, base):
            continue
        if local_zero if instance_flag(owner, "prepare_data_per_node") else node_zero:
            with hook_scope(trainer, "prepare_data"):  # (named for self.log, which refuses it there)
                if owner is trainer.datamodule:
                    datamodule_call(trainer, "prepare_data")
                else:
                    owner.prepare_data()
        if trainer.world_size > 1:
            trainer.strategy.barrier("prepare_data")


def datamodule_call(trainer, name, *args, **kwargs):
    """The DataModule's hook `name`, profiled as Lightning profiles it: "[LightningDataModule]<class>.<hook>" in
    trainer._profiler's recorded actions."""
    datamodule = trainer.datamodule
    with trainer._profile(f"[LightningDataModule]{type(datamodule).__name__}.{name}"):
        return getattr(datamodule, name)(*args, **kwargs)


SHARED_DATA_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
shared_hook_warned = set()  # each message once per process, as Lightning's warning cache (clear() says them again)


def data_hook_owner(name, module, datamodule, warn=True):
    """Which of `module` and `datamodule` a shared data hook (`SHARED_DATA_HOOKS`) is taken from, by Lightning's rule
    (its _DataHookSelector): the DataModule's where it overrides it (its is_overridden looks through a recording
    wrapper around the base's own hook, which does not count), else the module's. Where both override it, or the
    module does beside a DataModule, one of them runs, never both: Lightning's warning says which, once per process
    (`warn`: this is the rank that says it)."""
    if name not in SHARED_DATA_HOOKS:
        raise ValueError(f"`{name}` is not a shared hook within `TaskModule` and `DataModule`. Valid hooks are "
                         f"{SHARED_DATA_HOOKS}.")
    if datamodule is None:
        return module
    message = None
    # (each against its own base, found from its class, as Lightning's is_overridden)
    if is_overridden(name, datamodule):
        owner = datamodule
        if is_overridden(name, module):
            message = (f"You have overridden `{name}` in both `TaskModule` and `DataModule`. It will use the "
                       "implementation from `DataModule` instance.")
    else:
        owner = module
        if is_overridden(name, module):
            message = (f"You have overridden `{name}` in `TaskModule` but have passed in a `DataModule`. It will "
                       "use the implementation from `TaskModule` instance.")
    if message is not None and warn and message not in shared_hook_warned:
        shared_hook_warned.add(message)
        warnings.warn(message)
    return owner


def data_hook(trainer, name, module):
    """The hook `name` of its owner (data_hook_owner), called as Lightning calls it (a module's: also a wrapper around
    the base's own), or None where there is nothing but the base's own."""
    owner = data_hook_owner(name, module, trainer._attached[1], warn=trainer.is_global_zero)
    if owner is not module:
        return getattr(owner, name)
    return getattr(module, name) if hook_is_called(name, module, TaskModule) else None


def batch_mover(trainer, module):
    """(move, plain): how a batch reaches the device, as Lightning's loops move it: the module's
    on_before_batch_transfer (after a precision plugin's own convert_input), then strategy.batch_to_device(batch,
    dataloader_idx=...), which runs the module's _apply_batch_transfer_handler: transfer_batch_to_device and
    on_after_batch_transfer, the run's `run_transfer` below (kept as trainer._batch_transfer). Each hook runs once per
    batch, the DataModule's where it overrides one (data_hook); a transfer_batch_to_device that is not overridden is
    the strategy's move_batch (with the precision's input cast). plain=True: `move` is strategy.batch_to_device
    itself, called with the batch alone."""
    strategy = trainer.strategy
    before, transfer, after = (data_hook(trainer, name, module) for name in SHARED_DATA_HOOKS)
    # (named for self.log, which refuses them)
    before, transfer, after = (fn if fn is None else in_hook(trainer._metrics, name, fn)
                               for name, fn in zip(SHARED_DATA_HOOKS, (before, transfer, after)))
    own_transfer = transfer is not None
    if not own_transfer:
        def transfer(batch, device, dataloader_idx):
            return strategy.move_batch(batch, device)
    precision = strategy.precision
    if precision is not None and precision.converts_before_transfer:
        # a precision plugin's own convert_input: on the batch as the loader gave it, before the transfer hooks
        # (Lightning's place; the strategy then does not cast it again: Precision.cast_moved_batch)
        before = _converted_first(precision, before)
    to_device, profiled = strategy.batch_to_device, trainer._profiler is not None
    if profiled:  # Lightning times the module's three hooks, overridden or not (the defaults:
        # the batch as it is, moved by the strategy), the last two inside the strategy's batch_to_device
        profile = trainer._profiler.profile
        before, transfer, after = (_profiled_hook(profile, module_action(module, name), fn) for name, fn in zip(
            SHARED_DATA_HOOKS, (before, transfer, after)))
        to_device = _profiled_hook(profile, strategy_action(strategy, "batch_to_device"), to_device)

    def run_transfer(batch, device=None, dataloader_idx=0):
        if device is None and own_transfer:  # (the strategy's own move keeps None: its root device, fast path)
            device = strategy.root_device
        batch = transfer(batch, device, dataloader_idx)
        return batch if after is None else after(batch, dataloader_idx)

    trainer._batch_transfer = run_transfer
    if before is None and after is None and not own_transfer and not profiled:  # (no hook: no dataloader_idx)
        return to_device, True

    def move(batch, dataloader_idx=0):
        if before is not None:
            batch = before(batch, dataloader_idx)
        return to_device(batch, dataloader_idx=dataloader_idx)

    return move, False


def _profiled_hook(profile, action, fn):
    """`fn` timed as the profiler's `action`; None (a hook that is not overridden): the batch as it is, timed too."""
    def timed(batch, *args, **kwargs):
        with profile(action):
            return batch if fn is None else fn(batch, *args, **kwargs)
    return timed


def _converted_first(precision, before):
    def convert(batch, dataloader_idx=0):
        batch = precision.convert_input(batch)
        return batch if before is None else before(batch, dataloader_idx)
    return convert


def connect_precision(strategy, optimizers, lr_scheduler_configs):
    """Lightning's precision.connect(model, optimizers, lr_schedulers), once the strategy set the module and the
    optimizers up (every entry point; validate/test/predict with no optimizers). The run goes on with what the
    strategy set up: a plugin that returns other objects is refused, saying so."""
    precision = strategy.precision
    model = strategy.model if strategy.model is not None else strategy.module
    given = (model, list(optimizers), list(lr_scheduler_configs))
    returned = precision.connect(*given)
    same = (isinstance(returned, (tuple, list)) and len(returned) == 3 and returned[0] is given[0]
            and all(len(list(r)) == len(g) and all(a is b for a, b in zip(r, g)) for r, g in zip(returned[1:],
                                                                                                 given[1:])))
    if not same:
        raise ValueError(f"{type(precision).__name__}.connect(model, optimizers, lr_schedulers) returned other objects "
                         "than it was given: tasktrain trains the module, optimizers and schedulers its strategy set "
                         "up. Return them as given (wrap or change them in configure_model / configure_optimizers).")


def start_stage(trainer, stage, module):
    """The run's environment, fresh run state, profiler, metric store, callbacks and hook tables."""
    strategy = trainer.strategy
    strategy.setup_environment()
    if isinstance(strategy, MultiProcess) and strategy.environment_plugin is None and \
            strategy.cluster_environment is not None:  # Lightning's set_world_ranks again at its set-up (a spawned
        plugin_args.tell_ranks(strategy)  # rank's own); a user's environment got them from setup_environment
    trainer._stage_plugins_ended = False  # (end_stage_plugins)
    if isinstance(strategy, MultiProcess):
        reset_seed()  # Lightning's distributed strategies seed again as they set up their processes
    trainer._reset_run_state()
    trainer.state.fn, trainer.state.status = TrainerFn(stage), TrainerStatus.RUNNING  # Lightning's trainer.state
    # watchdog (issue 19): None on one process; the loops are observed through watched_batches/watched_action
    trainer._watchdog = strategy.watchdog
    trainer.module = module
    module.trainer = trainer
    trainer._profile = trainer._profiler.profile if trainer._profiler is not None else no_profile
    if trainer._profiler is not None and "setup" not in trainer._trial_skips:  # (a tuner's trial: the run's profiler
        # records its actions, set up by the run)
        trainer._profiler.setup(stage, strategy.local_rank if strategy.world_size > 1 else None,
                               trainer.log_dir or trainer.default_root_dir,
                               strategy.is_global_zero, module)
    announce_rank(strategy.global_rank)  # @rank_zero_only functions of the user's script know their rank
    trainer._metrics = MetricStore(strategy)
    # self.log fills trainer.logged_metrics as it logs; each run starts it afresh (Lightning's reset_metrics)
    trainer._logged_metrics = trainer._metrics.logged_metrics = {}
    attach_module_callbacks(trainer, module)
    for callback in trainer.callbacks:  # Lightning's: a callback logs with self.log / self.log_dict, the module's
        mine = getattr(callback, "log", None)  # (a callback's own `log`, a method or a list, is kept)
        if mine is None or isinstance(getattr(mine, "__self__", None), TaskModule):
            callback.log, callback.log_dict = module.log, module.log_dict
    if stage == "fit" and trainer._max_epochs_unset:  # Lightning's defaults, decided when fit starts
        if trainer.max_steps == -1 and not any(isinstance(cb, Timer) for cb in trainer.callbacks):
            trainer.max_epochs = 1000
            warnings.warn("`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, "
                          "set `max_epochs=-1`.", PossibleUserWarning, stacklevel=2)
        else:  # max_steps or a Timer (max_time=) ends the run
            trainer.max_epochs = -1
        trainer._max_epochs_unset = False  # decided once (Lightning's Trainer does at init): a later fit keeps it,
        # or the value the user set in between (trainer.max_epochs = N to train on)
    if trainer.barebones and strategy.is_global_zero:  # (Lightning's: nothing shows the run)
        logging.getLogger("tasktrain").info(
            "`Trainer(barebones=True)` started running. The progress bar is disabled so you might want to manually "
            "print the progress in your model.")
    drop_unpicklable_hparams(module, warn=strategy.is_global_zero)
    if stage == "fit" and trainer.min_epochs is None:  # Lightning's: 0, or 1 with min_steps (so that a stop asked
        trainer.min_epochs = 1 if trainer.min_steps is not None else 0  # for at fit start is looked at again)
    trainer._set_hook_tables(build_hook_tables(trainer, module))
    trainer._to_device, trainer._plain_transfer = batch_mover(trainer, module)


def on_failure(trainer, exc):
    if not isinstance(exc, SystemExit) and isinstance(trainer.strategy, MultiProcess):
        trainer.strategy.mark_failed()
    handlers = list(trainer._all_hooks.get("on_exception", []))
    if trainer.datamodule is not None:
        handlers.append(lambda exception: datamodule_call(trainer, "on_exception", exception))
    handlers.append(trainer.strategy.on_exception)  # last, as Lightning's
    for fn in handlers:
        try:
            fn(exc)
        except Exception as hook_error:  # the original error is what is raised; this one is reported
            print(f"[tasktrain] an on_exception hook failed too ({getattr(getattr(fn, 'func', fn), '__qualname__', fn)}): "
                  f"{type(hook_error).__name__}: {hook_error}", file=sys.stderr, flush=True)
    if trainer.world_size > 1 and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        print(f"[tasktrain] rank {trainer.global_rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def on_spawned_failure(trainer, module, exc):
    """A spawned run (ddp_spawn) failed, or was refused before it started: in this, the parent process, what
    Lightning's entry point does around its launcher (call.py's _interrupt): the callbacks' on_exception, the
    strategy's, then the loggers' finalize("failed") (tasktrain's children called theirs too, where the run's state
    is: an OnExceptionCheckpoint saves there, and writes nothing here). The DataModule's only where this process's
    trainer.datamodule is set (by trainer._data_connector.attach_datamodule): a run attaches its DataModule in its
    children, never in the parent (Trainer._attach_run_data), as Lightning's. (The children ran their own
    on_failure.)"""
    calls = [(cb.on_exception, (trainer, module, exc)) for cb in trainer.callbacks]
    if trainer.datamodule is not None:
        calls.append((trainer.datamodule.on_exception, (exc,)))
    calls.append((trainer.strategy.on_exception, (exc,)))
    calls += [(logger.finalize, ("failed",)) for logger in trainer.loggers]
    for fn, args in calls:
        try:
            fn(*args)
        except Exception as hook_error:  # the original error is what is raised; this one is reported
            print(f"[tasktrain] {getattr(fn, '__qualname__', fn)} failed too, after a spawned run's error: "
                  f"{type(hook_error).__name__}: {hook_error}", file=sys.stderr, flush=True)


def end_stage_plugins(trainer, module):
    """Lightning's strategy teardown of a run's plugins, once per run: the user's LayerSync applied to a fit's module
    (Trainer._fit) reverted, then the precision plugin's teardown(). Where Lightning's trainer tears its strategy
    down: before on_fit_end and the teardown hooks, or after the on_exception hooks of a failed run; the run's loader
    workers stop there too."""
    if trainer._stage_plugins_ended:
        return
    trainer._stage_plugins_ended = True
    # (Lightning's _teardown stops its loops' fetchers there too: the run's loader workers are gone before on_fit_end
    # and the teardown hooks, or after the on_exception hooks)
    shutdown_loader_workers(trainer)
    sync, trainer._applied_layer_sync = trainer._applied_layer_sync, None
    if trainer.strategy.precision is not None:
        trainer.strategy.precision.teardown()
    if sync is not None and sync.revert(module) is not module:
        raise ValueError(f"{type(sync).__name__}.revert(model) returned another module: convert the layers of the "
                         "module it is given in place and return that module (as torch's "
                         "SyncBatchNorm.convert_sync_batchnorm does for a module that is not a BatchNorm).")


def teardown(trainer, stage, module, status):
    trainer._unwatch()
    if "teardown" not in trainer._trial_skips:  # (a tuner's trial inside a run: the run's end does it)
        end_stage_plugins(trainer, module)  # (a fit that finished did it before on_fit_end)
    try:
        # Lightning calls the teardown hooks at a run's end only: a run that raised had on_exception instead
        if status != "failed" and "teardown" not in trainer._trial_skips:  # (a tuner's trial: tuning._tuning)
            if trainer.datamodule is not None:  # (Lightning passes the stage by keyword, as its TrainerFn)
                datamodule_call(trainer, "teardown", stage=TrainerFn(stage))
            trainer._call("teardown", stage=TrainerFn(stage))
    finally:
        for logger in trainer.loggers:  # every rank, as Lightning (tasktrain's loggers act on rank 0 only)
            logger.finalize(status)
        trainer._callback_metrics_cache = dict(trainer._metrics.callback_metrics) if trainer._metrics else {}
        write_error = wait_for_checkpoint_write(trainer, status)  # issue 29: fit end, error, SIGTERM: wait for it
        trainer._last_metrics = trainer._metrics
        trainer._fit_state = None  # nothing of the fit (its loaders, bound parts) outlives the strategy's teardown
        if "teardown" not in trainer._trial_skips:  # (a tuner's trial: the run it is inside goes on reading)
            shutdown_loader_workers(trainer)
        # A run that ended keeps what trainer.save_checkpoint(...) after it needs (end_run: DeepSpeed keeps its
        # engine until the next run sets up, as Lightning's keeps it); a failed one is torn down now.
        if "teardown" in trainer._trial_skips:
            pass  # a tuner's trial inside a run: the run's wrappers and engines are still in use (its end drops them)
        elif status == "failed":
            trainer.strategy.teardown()
        else:
            trainer.strategy.end_run()
        trainer._metrics = None
        if trainer._profiler is not None and "teardown" not in trainer._trial_skips:  # (a tuner's trial: the run's
            # profiler goes on; the run reports it)
            trainer._profiler.describe()
            trainer._profiler.teardown(stage)
            trainer._profile = no_profile  # a save_checkpoint after the run would restart a torn-down profiler
        if write_error is not None:  # issue 29: a failed background write, raised once the rest is torn down
            raise write_error


def shutdown_loader_workers(trainer):
    """Lightning's end of a run (its data fetchers' teardown): the worker processes of the run's loaders stop, the
    persistent ones too, and each loader forgets its iterator (a later run starts its workers again). Without it a
    loader's persistent workers outlived fit / validate / test / predict as long as the loader lived."""
    from torch.utils.data.dataloader import DataLoader, _MultiProcessingDataLoaderIter

    seen, todo = set(), [trainer._loader_data, trainer.train_dataloader, trainer._val_loader, trainer._test_loaders,
                         trainer._predict_loaders]
    while todo:
        one = todo.pop()
        if one is None or isinstance(one, (str, bytes)) or id(one) in seen:
            continue
        seen.add(id(one))
        if isinstance(one, DataLoader):
            if isinstance(one._iterator, _MultiProcessingDataLoaderIter):
                one._iterator._shutdown_workers()
            one._iterator = None
        elif isinstance(one, dict):
            todo.extend(one.values())
        elif isinstance(one, (list, tuple)):
            todo.extend(one)
        else:  # the Trainer's training data kinds (data.py, combined.py) hold their loaders here
            todo.extend(getattr(one, name, None) for name in ("loader", "inner"))


def wait_for_checkpoint_write(trainer, status):  # issue 29: returns the write's error, for _teardown to raise
    try:
        trainer.strategy.wait_for_checkpoint(release=True)
    except Exception as err:
        if status != "failed":
            return err
        print(f"[tasktrain] {err}", file=sys.stderr, flush=True)  # the run's own error is the one raised
    return None



_NULL = contextlib.nullcontext()


def no_profile(action_name):
    """The profiler's `profile` without a profiler: one shared no-op context."""
    return _NULL
