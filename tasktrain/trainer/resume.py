"""The Trainer's run state: what a checkpoint holds (dump) and how a fit resumes from one (restore).

    run_state(trainer)                      the stateful parts under the checkpoint's keys (run_state.py)
    dump_checkpoint(trainer)                the checkpoint dict (Trainer.save_checkpoint writes it)
    restore_module_and_callbacks(trainer, ckpt_path)   the DataModule, the module's weights, the callbacks
                                            (read, check_resumable, restore_module, restore_datamodule,
                                            restore_callbacks: also the steps of Lightning's
                                            trainer._checkpoint_connector, lightning_connectors.py)
    restore_training_state(trainer, loaded)            optimizers, schedulers, precision, metrics, the counters
    start_after_finished_epoch(trainer)                an epoch-end checkpoint's next epoch, as the loop starts
    restore_position(trainer, loaded, data)            the position in the epoch, on the data it will continue

In Lightning's order (Trainer._fit): the first part before configure_optimizers, or after on_fit_start where the
strategy's engine reads the checkpoint (restores_after_setup); the second after on_fit_start; the position once
the training loader is requested, after the sanity check; the RNG last, as the loop starts.

The Accelerator's save_state / load_state use the same parts (RunState, Weights, Optimizers, ...), the same upgrade of
old formats and count checks, and the same global-batch check (`check_global_batch`).
"""
import os

from tasktrain.profilers import module_action
from tasktrain import checkpoint_io as ckpt_io
from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning
from tasktrain.strategies import requeue
from tasktrain.strategies.base import Sharded
from tasktrain.strategies.loop_hooks import overrides
from tasktrain.trainer import loaders, run, strategy_hooks
from tasktrain.trainer.combined import CombinedTrainData
from tasktrain.trainer.data import StatefulLoaderData
from tasktrain.trainer.metrics import hook_scope
from tasktrain.trainer.module import hook_is_called
from tasktrain.trainer.run_state import (Callbacks, Objects, Optimizers, RandomStates, RunState, Value, Weights,
                                         check_counts, check_global_batch, upgrade)
from tasktrain.trainer.runtime import rng_restore_of_this_rank
from tasktrain.version import __version__

import torch


def run_state(trainer, weights_only=False):
    """This run's state as stateful parts (tasktrain/trainer/run_state.py), under the checkpoint's keys: Lightning's
    at the top level, tasktrain's own under "loops"."""
    strategy, state = trainer.strategy, trainer.state
    data = trainer._loader_data
    has_data = not weights_only and data is not None

    def train_state():
        saved = state.state_dict()
        fit = trainer._fit_state
        if fit is not None and fit.validates_counted_batch:
            # saved in a validation that runs after the batch it follows was counted (the epoch's end, a stop):
            # Lightning's checkpoint there does not count that batch yet (its restarted loop does), as one saved in
            # a mid-epoch validation or in on_train_batch_end (lightning_loops.py: _batches_that_stepped)
            saved["saved_in_stepping_batch"] = True
        # Lightning's checkpoints keep its predict loop's progress too (the Trainer's predict batches so far): a
        # predict given this file goes on from it (evaluation.restore_eval_total)
        saved["predict_batches"] = int(trainer._predict_counts[0])
        if has_data:
            if isinstance(data, StatefulLoaderData) or (isinstance(data, CombinedTrainData) and
                                                        data.keeps_loader_states()):
                # a StatefulDataLoader over data whose order is its own: every rank's loader state, in rank order,
                # beside the position (restored on the same number of processes: restore_train_state)
                saved["loader_states"] = strategy.all_gather_object(data.loader_state(state.batch_in_epoch))
            order = data.drawn_order()
            if order is not None:  # an epoch's order drawn as Lightning's RandomSampler draws it (trainer/data.py)
                saved["drawn_order"] = order
                if trainer.world_size > 1 and data.draws_own_order():
                    # use_distributed_sampler=False: each rank drew from its own generator; every rank's, in rank order
                    saved["drawn_orders"] = strategy.all_gather_object(order)
        pending = pending_plateau_step(trainer)
        if pending is not None and not weights_only:
            saved["plateau_step_values"] = pending
        return saved

    # Lightning's loop progress first, as a Lightning checkpoint keeps it (fit_loop, validate_loop, test_loop,
    # predict_loop: what Lightning's Trainer reads when it resumes this file), then tasktrain's own keys
    own = {"fit_loop": Value(lambda: trainer.fit_loop.state_dict()),
           "validate_loop": Value(lambda: trainer.validate_loop.state_dict()),
           "test_loop": Value(lambda: trainer.test_loop.state_dict()),
           "predict_loop": Value(lambda: trainer.predict_loop.state_dict()),
           "weights_only": Value(bool(weights_only)), "world_size": Value(trainer.world_size),
           "train_state": Value(train_state, state.load_state_dict)}
    # Lightning's keys, in its order (the counters are saved for scripts that read them; the resume uses train_state)
    parts = {"epoch": Value(trainer.current_epoch), "global_step": Value(trainer.global_step),
             "pytorch-lightning_version": Value(ckpt_io.LIGHTNING_LAYOUT_VERSION), "state_dict": Weights(strategy),
             "loops": RunState(own)}
    if not weights_only:
        optimizers = trainer.optimizers
        own.update(optimizer_param_names=Value(lambda: [strategy.optimizer_param_names(o) for o in optimizers]),
                   metrics=trainer._metrics if trainer._metrics is not None else Value({}),
                   rng_states=RandomStates(strategy))
        parts["loops"] = RunState(own)
        parts.update(callbacks=Callbacks(trainer.callbacks), optimizer_states=Optimizers(strategy, optimizers),
                     lr_schedulers=Objects([config.scheduler for config in trainer.lr_scheduler_configs]))
        parts[precision_key(strategy)] = strategy.precision  # (dropped by dump_checkpoint when empty, as Lightning's)
    return RunState(parts, header=False)


def precision_key(strategy):
    """Where the precision plugin's state is (Lightning's: its class's __qualname__; an engine's plugin subclass of the
    user's, attached to the engine's own, names its class: checkpoint_key)."""
    return strategy.precision.checkpoint_key or type(strategy.precision).__qualname__


def dump_checkpoint(trainer, weights_only=False) -> dict:
    """The checkpoint dict (see tasktrain/checkpoint_io.py for every key). Called on every rank."""
    module, datamodule = trainer.module, trainer.datamodule
    checkpoint = run_state(trainer, weights_only).state_dict()
    if not checkpoint.get(precision_key(trainer.strategy), True):  # Lightning's: an empty state is not saved
        del checkpoint[precision_key(trainer.strategy)]
    if not weights_only:  # Lightning's: once its state is in (before the hyper-parameters and the other hooks)
        trainer.strategy.precision.on_save_checkpoint(checkpoint)
    for obj, prefix in ((module, ""), (datamodule, "datamodule_")):
        if obj is not None and obj.hparams:  # (Lightning's: its hparams_name where save_hyperparameters set one)
            if hasattr(obj, "_hparams_name"):
                checkpoint[f"{prefix}hparams_name"] = obj._hparams_name
            checkpoint[f"{prefix}hyper_parameters"] = plain(dict(obj.hparams))
    datamodule_state = run.datamodule_call(trainer, "state_dict") if datamodule is not None else None
    if datamodule_state:  # under its class name, as Lightning keeps it
        checkpoint[type(datamodule).__qualname__] = datamodule_state
    with hook_scope(trainer, "on_save_checkpoint"):  # (named for self.log, which refuses it there)
        # the callbacks', then the module's (Lightning's order); a weights-only save calls the module's only, as
        # Lightning's (no callback state goes into such a file)
        profile = trainer._profile  # (Lightning times each call, overridden or not: so does a profiler here)
        for cb in trainer.callbacks if not weights_only else ():
            if hook_is_called("on_save_checkpoint", cb, Callback) or (
                    trainer._profiler is not None and callable(getattr(cb, "on_save_checkpoint", None))):
                with profile(f"[Callback]{cb.state_key}.on_save_checkpoint"):
                    cb.on_save_checkpoint(trainer, module, checkpoint)
        with profile(module_action(module, "on_save_checkpoint")):
            module.on_save_checkpoint(checkpoint)
    return checkpoint


def trial_save(trainer):
    """Lightning's finders save the run to a checkpoint before their trials and restore it after; tasktrain keeps that
    state in memory (tuner/tuning._tuning), and runs the checkpoint's hooks as Lightning's save does: the DataModule's
    state_dict, the callbacks' (those of the run searched from: trainer._trial_callbacks) state_dict and
    on_save_checkpoint, the module's on_save_checkpoint. The dict, for trial_restored."""
    trial_callbacks, trainer.callbacks = trainer.callbacks, list(trainer._trial_callbacks)
    try:
        return dump_checkpoint(trainer)
    finally:
        trainer.callbacks = trial_callbacks


def trial_restored(trainer, module, ckpt):
    """After the trials, once tuning._tuning put the state back: the restore's hooks, in Lightning's order, with the
    dict trial_save made: the DataModule's load_state_dict, the module's on_load_checkpoint, the callbacks'
    on_load_checkpoint and load_state_dict."""
    datamodule = trainer.datamodule
    if datamodule is not None and type(datamodule).__qualname__ in ckpt:
        run.datamodule_call(trainer, "load_state_dict", ckpt[type(datamodule).__qualname__])
    with hook_scope(trainer, "on_load_checkpoint"):  # (named for self.log, which refuses it there)
        module.on_load_checkpoint(ckpt)
    for cb in trainer.callbacks:
        if hook_is_called("on_load_checkpoint", cb, Callback):
            cb.on_load_checkpoint(trainer, module, ckpt)
    if "callbacks" in ckpt:
        Callbacks(trainer.callbacks).load_state_dict(ckpt["callbacks"])


def resolve_ckpt_path(trainer, ckpt_path, fn="fit"):
    """"best" and "last" as Lightning resolves them (fn: the entry point, for the messages). "best": the first
    checkpoint callback's best_model_path. "last": of the ModelCheckpoints' `last` files and the
    OnExceptionCheckpoints' files, the newest (file time); where there is none, the record an earlier tasktrain wrote
    in the root dir (`.last_checkpoint.json`: such runs still resume), else None with Lightning's warning."""
    if ckpt_path == "best":
        if len(trainer.checkpoint_callbacks) > 1:
            _warn(trainer, f'`.{fn}(ckpt_path="best")` is called with Trainer configured with multiple '
                           "`ModelCheckpoint` callbacks. It will use the best checkpoint path from first checkpoint "
                           "callback.")
        callback = trainer.checkpoint_callback
        if callback is None:
            raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured.')
        if hasattr(callback, "best_model_path") and not callback.best_model_path:
            if trainer.fast_dev_run:
                raise ValueError(f'You cannot execute `.{fn}(ckpt_path="best")` with `fast_dev_run=True`. Please pass '
                                 f"an exact checkpoint path to `.{fn}(ckpt_path=...)`")
            raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the '
                             "best model.")
        return getattr(callback, "best_model_path", None) or None  # (an OnExceptionCheckpoint first: none)
    if ckpt_path == "last":
        path = last_checkpoint(trainer)
        if path is None:
            path = ckpt_io.read_last_pointer(trainer.default_root_dir)
            if path is not None and trainer.is_global_zero:
                print(f"[tasktrain] ckpt_path='last': no last checkpoint in the checkpoint folders; resuming from "
                      f"{path}, recorded by an earlier run in {trainer.default_root_dir}.", flush=True)
        if path is None:  # not an error (Lightning's): "last" can be set before the first fit
            _warn(trainer, f'.{fn}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint '
                           "will be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`.")
        return path
    return os.fspath(ckpt_path)


def default_eval_ckpt_path(trainer, fn):
    """validate/test/predict with no module and no ckpt_path after a fit: Lightning's "best", with its warning."""
    from tasktrain.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

    tip = (" There is also an on-exception checkpoint available, however it is used by default only when fitting."
           if any(isinstance(c, OnExceptionCheckpoint) for c in trainer.callbacks) else "")
    _warn(trainer, f"`.{fn}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call "
                   f"will be used.{tip} You can pass `.{fn}(ckpt_path='best')` to use the best model or "
                   f"`.{fn}(ckpt_path='last')` to use the last model. If you pass a value, this warning will be "
                   "silenced.")
    return "best"


def last_checkpoint(trainer):
    """The newest (file time) of what the trainer's checkpoint callbacks keep as `last`: each ModelCheckpoint's
    `last` files (_find_last_checkpoints) and each OnExceptionCheckpoint's file, or None. Every checkpoint appears
    under its name only once complete (atomic renames; sharded folders once every rank's part is in), so whatever is
    found is whole."""
    from tasktrain.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

    candidates = set()
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, OnExceptionCheckpoint):
            candidates.add(os.fspath(callback.ckpt_path))
        elif hasattr(callback, "_find_last_checkpoints"):
            candidates |= set(callback._find_last_checkpoints(trainer))
            candidates |= preemption_checkpoints(callback.dirpath_resolved(trainer))
    times = {path: os.path.getmtime(path) for path in candidates if os.path.exists(path)}
    return max(times, key=times.get) if times else None


def preemption_checkpoints(directory):
    """The checkpoints SLURM's requeue signal left in `directory` (loop.save_preemption_checkpoint: tasktrain's,
    issue 40; SIGTERM writes none since issue 37, as Lightning's): "last" candidates too, so that the resume the
    message advises continues from them."""
    if not os.path.isdir(directory):
        return set()
    return {os.path.join(directory, f) for f in os.listdir(directory) if f.startswith("preempted-")
            and f.endswith(".ckpt")}


def _warn(trainer, message):
    if trainer.is_global_zero:
        import warnings

        warnings.warn(message, UserWarning, stacklevel=3)


def restart_ckpt_path(trainer, ckpt_path):  # issue 29 (the rule: checkpoint_io.restart_checkpoint)
    resolved = ckpt_io.restart_checkpoint(trainer.default_root_dir, ckpt_path)
    if ckpt_io.restart_count() and trainer.is_global_zero:
        print(f"[tasktrain] restart {ckpt_io.restart_count()} of this launch: resuming from "
              f"{resolved or 'scratch (no complete checkpoint of this launch yet)'}", flush=True)
    return resolved


def restores_after_setup(strategy):
    """Lightning's strategy.restore_checkpoint_after_setup: True (an engine that shards the module, DeepSpeed, FSDP,
    reads a checkpoint into the module and optimizers it has set up; or a subclass of one's own that says so): the
    module's and callbacks' part is restored after the set-up and on_fit_start; False: before configure_optimizers."""
    after = bool(strategy.restore_checkpoint_after_setup)
    if not after and isinstance(strategy, Sharded):
        raise NotImplementedError(
            f"{type(strategy).__name__}.restore_checkpoint_after_setup is False: {type(strategy).__name__}'s engine "
            "reads a checkpoint into the module and optimizers it has set up (sharded), so it cannot restore one "
            "before its set-up. Leave restore_checkpoint_after_setup as it is (True) for this strategy.")
    return after


class Loaded:
    """A checkpoint read for a resume: its path and dict."""

    def __init__(self, path, ckpt):
        self.path, self.ckpt = path, ckpt


def resume_path(trainer, ckpt_path):
    """The checkpoint this fit resumes from (None: a fresh fit), known from the fit's start (trainer.ckpt_path): a
    restarted worker's newest (issue 29), a requeued job's (issue 40), "best" / "last" resolved."""
    ckpt_path = restart_ckpt_path(trainer, ckpt_path)
    ckpt_path = requeue.resume_path(trainer.default_root_dir, ckpt_path, trainer.is_global_zero)
    from tasktrain.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

    if ckpt_path is None and any(isinstance(c, OnExceptionCheckpoint) for c in trainer.callbacks):
        ckpt_path = on_exception_default(trainer)
    trainer._resumed_from = None if ckpt_path is None else resolve_ckpt_path(trainer, ckpt_path)
    return trainer._resumed_from


def read(trainer, path, weights_only=None):
    """The checkpoint at `path` as a dict, older formats upgraded; nothing refused yet (load's checks, the view
    trainer._checkpoint_connector.resume_start). weights_only: fit's weights_only= (False: any pickle)."""
    if weights_only is None:
        weights_only = getattr(trainer, "_ckpt_weights_only", None)
    with ckpt_io.trusted_pickles(weights_only is False):
        return upgrade(strategy_hooks.load_checkpoint(trainer.strategy, path, weights_only))


def on_exception_default(trainer, fn="fit"):
    """Lightning's: a fit without ckpt_path, beside an OnExceptionCheckpoint, continues the one a failure left
    ("last"), and says so."""
    _warn(trainer, f"`.{fn}(ckpt_path=None)` was called without a model. The last model of the previous `fit` call "
                   f"will be used. You can pass `{fn}(ckpt_path='best')` to use the best model or "
                   f"`{fn}(ckpt_path='last')` to use the last model. If you pass a value, this warning will be "
                   "silenced.")
    return "last"


def load(trainer, path):
    """Read the checkpoint at `path` (resume_path's; None: none); a weights-only one is refused here, before any
    of it is restored."""
    if path is None:
        return None
    loaded = Loaded(path, read(trainer, path))
    from_lightnings_loops(trainer, loaded)
    without_loops(trainer, loaded)
    check_resumable(trainer, loaded)
    return loaded


def without_loops(trainer, loaded):
    """Lightning's rule for a checkpoint with no loop state at all (no "loops" key: NeMo's experiment manager writes
    such files and passes them as ckpt_path; Lightning's test_stateful_trainer_ckpt_path_support): the fit restores
    what it holds (the weights, the optimizer and scheduler states, the callbacks' states) and the loop counters are
    the Trainer's own, not the file's (a fresh Trainer starts at epoch 0, step 0; the file's "epoch" and
    "global_step" are not read, as Lightning reads only its loops). It must hold "optimizer_states" and
    "lr_schedulers" (empty is fine: the optimizers and schedulers then start fresh), as Lightning requires: a file
    of weights alone gets Lightning's KeyError. Rank 0 says what was restored."""
    ckpt = loaded.ckpt
    if "loops" in ckpt or "state_dict" not in ckpt or ckpt_io.format_version(ckpt) is not None or \
            isinstance(ckpt_io.own_state(ckpt).get("train_state"), dict):
        return
    for key, what in (("optimizer_states", "optimizer"), ("lr_schedulers", "learning rate scheduler")):
        if key not in ckpt:
            raise KeyError(  # Lightning's type and first sentences (restore_optimizers_and_schedulers); then the fix
                f"Trying to restore {what} state but checkpoint contains only the model. This is probably due to "
                f"`ModelCheckpoint.save_weights_only` being set to `True`. {loaded.path} holds the weights but no "
                f"{key!r} (and no loop state), so a fit cannot continue from it. Load its weights into the module "
                f"before fit ({type(trainer.lightning_module).__name__}.load_state_dict(torch.load(path)"
                f"['state_dict'])), or give it empty {key!r} to start those fresh."
            )
    saved = trainer.state.state_dict()
    saved["without_loops"] = True  # (check_epochs_left, skips_sanity_check: the Trainer's counters, not the file's)
    ckpt["loops"] = {"format_version": ckpt_io.CHECKPOINT_FORMAT_VERSION, "weights_only": False,
                     "world_size": trainer.world_size, "train_state": saved}
    if trainer.is_global_zero:
        fresh = [key for key in ("optimizer_states", "lr_schedulers") if not ckpt[key]]
        print(f"[tasktrain] {loaded.path} holds no loop state: its weights"
              f"{'' if 'optimizer_states' in fresh else ', optimizer states'}"
              f"{'' if 'lr_schedulers' in fresh else ', scheduler states'} are restored and the fit goes on from "
              f"epoch {trainer.current_epoch}, step {trainer.global_step}"
              f"{' (the ' + ' and '.join(k.replace('_', ' ') for k in fresh) + ' are empty: those start fresh)' if fresh else ''}.",
              flush=True)


def from_lightnings_loops(trainer, loaded):
    """A checkpoint Lightning's fit wrote (its loop state is its loop objects' progress, ckpt["loops"]["fit_loop"]):
    tasktrain's train state read from it, so that a fit resumes from it where Lightning's restarted loop does.

    Saved at an epoch's boundary (ModelCheckpoint's default places: on_train_epoch_end, the epoch-end validation's
    end; an epoch's start; after a fit), the fit goes on at the next epoch's first batch. Saved inside an epoch
    (every_n_train_steps, a validation inside the epoch, an exception), it goes on inside that epoch as Lightning's
    restart does: the batch indices, global_step and the loggers' step go on from the saved batch (one saved in its
    on_train_batch_end counts that batch done; a validation due after it is not run again), and the data is Lightning's
    too: a loader Lightning kept a state of (a StatefulDataLoader: fit_loop's "combined_loader") continues from that
    state, any other is read again from its first batch (TrainState.data_from_batch), the epoch ending at its usual
    batch count, with Lightning's warning (restore_train_state)."""
    ckpt = loaded.ckpt
    loops = ckpt.get("loops")
    if isinstance(ckpt_io.own_state(ckpt).get("train_state"), dict) or not isinstance(loops, dict) or \
            not isinstance(loops.get("fit_loop"), dict) or "global_step" not in ckpt:
        return
    fit = loops["fit_loop"]
    try:
        epochs = fit["epoch_progress"]["current"]
        batches = fit["epoch_loop.batch_progress"]
        stepped = int(fit["epoch_loop.state_dict"]["_batches_that_stepped"])
        current, run_total = batches["current"], batches["total"]
    except (KeyError, TypeError):
        return  # (not a fit loop's state that can be read: check_resumable refuses it)
    ended = epochs["processed"] > epochs["completed"]  # the epoch's training ran to its end (its end hooks ran)
    between = epochs["started"] == epochs["processed"] == epochs["completed"] or (
        epochs["started"] > epochs["processed"] and current["started"] == 0)
    inside = not ended and not between

    def total(progress, key="completed"):
        return int(((progress or {}).get("total") or {}).get(key, 0))

    def now(progress, key="completed"):
        return int(((progress or {}).get("current") or {}).get(key, 0))

    optim = fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
    val = fit.get("epoch_loop.val_loop.batch_progress") or {}
    train_state = {
        "epoch": int(epochs["completed"]), "global_step": int(ckpt["global_step"]), "batches_that_stepped": stepped,
        "batch_in_epoch": int(current["completed"]) if ended else 0,
        "epoch_finished": ended, "epoch_started": ended, "epoch_validated": ended,
        "batches_taken": total(batches), "zero_grads": total(optim.get("zero_grad")),
        "scheduler_steps": total(fit.get("epoch_loop.scheduler_progress")),
        "eval_batches": {"val": [total(val), 0],
                         "validate": [total((loops.get("validate_loop") or {}).get("batch_progress")), 0],
                         "test": [total((loops.get("test_loop") or {}).get("batch_progress")), 0]},
        "predict_batches": total((loops.get("predict_loop") or {}).get("batch_progress")),
    }
    if inside:
        train_state.update(inside_an_epoch(trainer, fit, current, run_total, stepped))
        train_state["eval_batches"]["val"][1] = now(val)
        train_state["eval_is_last_batch"] = {"val": bool(val.get("is_last_batch")), "validate": False, "test": False}
        train_state["epoch_steps_from"] = train_state["global_step"] - now(optim.get("step"))
        train_state["epoch_zero_grads_from"] = train_state["zero_grads"] - now(optim.get("zero_grad"))
        train_state["epoch_scheduler_steps_from"] = (train_state["scheduler_steps"]
                                                     - now(fit.get("epoch_loop.scheduler_progress")))
    # tasktrain's own keys beside Lightning's loop state (kept as it was): the file then reads as one the Trainer
    # wrote there, on this run's number of processes
    ckpt["loops"] = dict(loops, format_version=ckpt_io.CHECKPOINT_FORMAT_VERSION, weights_only=False,
                         world_size=trainer.world_size, train_state=train_state)


def inside_an_epoch(trainer, fit, current, run_total, stepped):
    """The train state's position for a checkpoint Lightning saved inside an epoch, by where in a batch it was saved
    (Lightning's restart stages, its _TrainingEpochLoop.update_restart_stage and reset): in on_train_batch_end
    ("processed": the batch done once the loop goes on), after the batch (a validation inside the epoch: completed),
    or inside it (an exception before its end: Lightning trains the next batch, at the same batch index)."""
    in_batch_end = (run_total["started"] == run_total["ready"] == run_total["processed"]
                    and run_total["completed"] == run_total["processed"] - 1)
    after_batch = run_total["ready"] == run_total["started"] == run_total["processed"] == run_total["completed"]
    position = int(current["processed"] if in_batch_end else current["completed"])
    # the saved batch ended an accumulation window (Lightning's _should_accumulate, as its reset reads it): the loggers'
    # step counts it once the loop goes on (tasktrain's files count it when saved: saved_in_stepping_batch)
    accumulate = trainer.accumulate_grad_batches if trainer.module.automatic_optimization else 1
    steps = int(current["ready"]) % accumulate == 0 or bool(fit["epoch_loop.batch_progress"].get("is_last_batch"))
    loader_states = (fit.get("state_dict") or {}).get("combined_loader") or []
    if len(loader_states) > 1:
        raise ValueError(
            f"The checkpoint holds the states of {len(loader_states)} stateful training loaders (Lightning's "
            "CombinedLoader): tasktrain continues one stateful training loader's state. Resume from an epoch-end "
            "checkpoint, or load its weights into the module and start a new fit.")
    state = {
        "batch_in_epoch": position, "epoch_started": True,
        "batches_that_stepped": stepped + int(steps), "saved_in_stepping_batch": steps and (in_batch_end or after_batch),
        "batch_phase": "processed" if in_batch_end else None,
        # (a validation after the last batch: the epoch's, its end left to run)
        "epoch_validated": after_batch and bool(fit["epoch_loop.batch_progress"].get("is_last_batch")),
        "is_last_batch": bool(fit["epoch_loop.batch_progress"].get("is_last_batch")),
        "epoch_batches_from": int(run_total["ready"]) - position,
        "batches_taken": int(run_total["ready"]),
    }
    if loader_states:  # a StatefulDataLoader's state: its data goes on from there (restore_train_state)
        state["loader_states"] = [loader_states[0]]
    else:  # any other loader: Lightning reads it again from its first batch, the batch indices going on
        state["data_from_batch"], state["samples_in_epoch"] = position, 0
    return state


def check_resumable(trainer, loaded):
    """A fit resumes from a full checkpoint the Trainer wrote: a weights-only one, or one without tasktrain's loop
    state, is refused before any of it is restored."""
    module, path, ckpt = trainer.lightning_module, loaded.path, loaded.ckpt
    if ckpt_io.own_state(ckpt).get("weights_only"):
        raise KeyError(  # Lightning's type and first sentence; the rest says what to do
            "Trying to restore optimizer state but checkpoint contains only the model. This is probably due to "
            f"`ModelCheckpoint.save_weights_only` being set to `True`. {path} holds the weights but no optimizer, "
            "scheduler or loop state, so training cannot resume from it. Use it for inference "
            f"({type(module).__name__}.load_from_checkpoint(path)) or start a new fit from those weights."
        )
    if not isinstance(ckpt_io.own_state(ckpt).get("train_state"), dict):
        raise ValueError(
            f"{path} holds no tasktrain loop state (its 'loops' has no train_state dict): it was not written by the "
            "Trainer (a Lightning checkpoint, a plain state dict, the Accelerator's save_state?), so a fit cannot "
            f"resume from it. Load its weights into the module before fit ({type(module).__name__}.load_state_dict), "
            "or resume from a checkpoint the Trainer wrote."
        )


def restore_module_and_callbacks(trainer, path):
    """The checkpoint's first part, in Lightning's order: the module's on_load_checkpoint and weights, the
    DataModule's state, the callbacks' on_load_checkpoint and state. Returns the Loaded checkpoint (None: no checkpoint)
    for restore_training_state. Before the strategy's set-up the weights go into the module itself."""
    loaded = load(trainer, path)
    if loaded is None:
        return None
    ckpt = loaded.ckpt
    restore_module(trainer, trainer.module, ckpt)
    restore_datamodule(trainer, ckpt)
    restore_callbacks(trainer, trainer.module, ckpt)
    # the data order's seed: the training loader, requested after this, follows the saved order
    trainer.state.data_seed = ckpt_io.own_state(ckpt)["train_state"].get("data_seed", trainer.state.data_seed)
    return loaded


def restore_module(trainer, module, ckpt):
    """The module's on_load_checkpoint, then its weights (strict as module.strict_loading: Lightning's). Before the
    strategy's set-up the weights go into the module itself."""
    strategy = trainer.strategy
    with hook_scope(trainer, "on_load_checkpoint"):  # (named for self.log, which refuses it there)
        module.on_load_checkpoint(ckpt)
    if "state_dict" in ckpt and overrides(strategy, "load_model_state_dict"):  # a subclass's (Lightning's call)
        if not restores_after_setup(strategy):
            strategy.connect(module)  # (before the set-up: the strategy's lightning_module is this run's module)
        strategy.load_model_state_dict(ckpt, strict=module.strict_loading)
    elif "state_dict" in ckpt:
        strategy.load_module_state_dict(ckpt["state_dict"], None if restores_after_setup(strategy) else module,
                                        strict=module.strict_loading)  # (Lightning's)


def restore_datamodule(trainer, ckpt):
    """The DataModule's state, under its class name as Lightning keeps it."""
    datamodule = trainer.datamodule
    if datamodule is not None and type(datamodule).__qualname__ in ckpt:
        run.datamodule_call(trainer, "load_state_dict", ckpt[type(datamodule).__qualname__])
        loaders.datamodule_restored(trainer)


def restore_callbacks(trainer, module, ckpt):
    """Each callback's on_load_checkpoint, then the callbacks' states by state_key (Lightning's order)."""
    for cb in trainer.callbacks:
        if hook_is_called("on_load_checkpoint", cb, Callback):
            cb.on_load_checkpoint(trainer, module, ckpt)
    if "callbacks" in ckpt:
        Callbacks(trainer.callbacks).load_state_dict(ckpt["callbacks"])


def restore_precision(trainer, ckpt):
    """The precision plugin's state (a GradScaler's), where the checkpoint has one."""
    key = precision_key(trainer.strategy)
    trainer.strategy.precision.on_load_checkpoint(ckpt)  # (Lightning's: before its state is loaded)
    if key in ckpt:
        trainer.strategy.precision.load_state_dict(ckpt[key])
    elif ckpt_io.own_state(ckpt).get("precision"):  # a format 2 file's (upgrade_layout)
        trainer.strategy.precision.load_state_dict(ckpt_io.own_state(ckpt)["precision"])


def restore_training_state(trainer, loaded):
    """The checkpoint's second part, once the strategy holds the optimizers (Lightning's restore_training_state):
    optimizers, schedulers, precision, metrics and the loop's counters. The position inside the epoch waits for the
    training loader (restore_position), the RNG for the loop's start."""
    path, ckpt, optimizers, strategy = loaded.path, loaded.ckpt, trainer.optimizers, trainer.strategy
    # Lightning's strategy.lightning_restore_optimizer (False: the strategy restores them itself; the schedulers are
    # restored either way) and load_optimizer_state_dict(checkpoint), where a subclass of one's own overrides them
    restore_optimizers = strategy.lightning_restore_optimizer
    if restore_optimizers and not (ckpt_io.own_state(ckpt)["train_state"].get("without_loops")
                                   and not ckpt["optimizer_states"]):
        check_counts(ckpt, "optimizer_states", len(optimizers), lambda saved: (
        f"{path} has {saved} optimizer states but configure_optimizers returned {len(optimizers)} optimizers."))
    parts, own = run_state(trainer), ckpt_io.own_state(ckpt)
    if restore_optimizers and overrides(strategy, "load_optimizer_state_dict"):
        strategy.load_optimizer_state_dict(ckpt)
        parts.load_state_dict(ckpt, only=["lr_schedulers"])
    else:
        parts.load_state_dict(ckpt, only=["optimizer_states", "lr_schedulers"] if restore_optimizers
                              else ["lr_schedulers"])
    restore_precision(trainer, ckpt)
    parts.parts["loops"].load_state_dict(own, only=["metrics", "rng_states"])
    loaded.rng_states = parts.parts["loops"].parts["rng_states"].loaded
    state, saved = trainer.state, own["train_state"]
    global_batch = state.global_batch_size  # this run's, where the training loader is already set up
    state.start_over()  # the checkpoint's counters, not a used Trainer's (Lightning: the checkpoint wins)
    state.load_state_dict(saved)
    check_epochs_left(trainer, ckpt, saved)
    state.data_seed = saved.get("data_seed", state.data_seed)
    state.global_batch_size = global_batch
    # (a checkpoint of an epoch's end stays at that epoch until the loop starts: start_after_finished_epoch)
    if not state.epoch_finished and saved.get("plateau_step_values") and trainer._fit_state is not None:
        trainer._fit_state.plateau_step_due = True  # taken when the loop goes on
        trainer._fit_state.plateau_values = dict(saved["plateau_step_values"])


def skips_sanity_check(trainer, loaded):
    """Lightning's rule: a fit resumed from a checkpoint is "restarting" (and runs no sanity check) when the
    checkpoint's epoch was not finished (saved inside it, its end-of-epoch validation included, or in its
    on_train_epoch_start, before its first batch) or the run counts in steps (max_steps set); a checkpoint of an
    epoch's end, or of a fit that ended, gets the sanity check."""
    if loaded is None:
        return False
    ckpt = loaded.ckpt
    saved = ckpt_io.own_state(ckpt)["train_state"]
    if saved.get("without_loops"):
        return False  # (Lightning's loops are not restarting: the sanity check runs)
    # (a fit stopped inside an epoch counts it, as Lightning's: its checkpoint's current_epoch is one past the position)
    finished = (saved.get("epoch_finished") or not saved.get("batch_in_epoch")
                or int(ckpt.get("epoch", saved.get("epoch", 0))) > int(saved.get("epoch", 0)))
    started = saved.get("epoch_started") and not saved.get("batch_in_epoch") and not saved.get("epoch_finished")
    return trainer.max_steps != -1 or not finished or bool(started)


def start_after_finished_epoch(trainer):
    """A fit resumed from a checkpoint of epoch E's end goes on at epoch E+1 from here: once the training loader is
    requested. Until then (on_fit_start, the sanity check, train_dataloader) current_epoch is E, the checkpoint's, as
    in Lightning, whose fit loop counts the restored epoch as completed only when it starts; a checkpoint saved
    meanwhile is that same epoch-end state."""
    state = trainer.state
    if state.epoch_finished:
        state.epoch += 1
        state.batch_in_epoch = state.samples_in_epoch = state.data_from_batch = 0
        state.epoch_finished = state.epoch_started = False


def pending_plateau_step(trainer):
    """Saved inside a stepped batch before its step schedulers that watch a metric stepped (a validation's
    on_validation_end, the epoch-end one included): the values they will watch ({monitor: float or None}), so that
    the resumed run takes that step as the uninterrupted one does (Lightning skips it: callback_metrics are not in
    its checkpoints; it then raises for a strict scheduler). None when no such step is due."""
    fit = trainer._fit_state
    if fit is None or not fit.plateau_step_due:
        return None
    metrics = trainer.callback_metrics
    values = {config.monitor: (float(metrics[config.monitor]) if config.monitor in metrics else None)
              for config in trainer.lr_scheduler_configs if config.interval == "step" and config.monitor is not None}
    return values or None


def check_epochs_left(trainer, ckpt, saved):
    """Lightning's refusal of a checkpoint past max_epochs: its current_epoch (as saved: the epoch-end
    checkpoint of epoch E says E, one saved after a fit of N epochs says N) above max_epochs. Equal to it is
    not refused: that fit trains nothing."""
    epoch = int(saved.get("epoch", 0) if saved.get("without_loops") else ckpt.get("epoch", saved.get("epoch", 0)))
    if trainer.max_epochs not in (-1, None) and epoch > trainer.max_epochs:
        raise MisconfigurationException(f"You restored a checkpoint with current_epoch={epoch}, but you have set "
                                        f"Trainer(max_epochs={trainer.max_epochs}).")


def restore_position(trainer, loaded, data):
    """The loop's position inside the epoch from the checkpoint's train state, on this run's number of processes and
    batches and on the training data as it will be trained; returns what restores the RNG, to call once the loop
    is about to continue."""
    state, ckpt = trainer.state, loaded.ckpt
    own = ckpt_io.own_state(ckpt)
    restore_train_state(trainer, loaded.path, own["train_state"], int(own.get("world_size", trainer.world_size)),
                        data)
    if trainer.is_global_zero:
        print(f"[tasktrain] resumed from {loaded.path} at epoch {state.epoch}, global step {state.global_step}, "
              f"batch {state.batch_in_epoch} of the epoch", flush=True)
    return rng_restore_of_this_rank(loaded.rng_states, trainer.strategy, loaded.path, state.data_seed,
                                    state.global_step)


def restore_train_state(trainer, path, saved, saved_world, epochs):
    """The position inside the saved epoch (the counters are restored already: restore_training_state)."""
    state = trainer.state
    global_batch = state.global_batch_size  # this run's
    shard_world = loaders.shards(trainer)[0]  # the global order is sharded over this many (1: use_distributed_sampler=False)
    saved_global_batch = saved.get("global_batch_size") or (
        global_batch // shard_world * saved_world if global_batch else 0)  # written before it was recorded
    # the drawn order of the saved epoch and the user's loader generators (one process: Lightning's RandomSampler)
    per_rank = saved.get("drawn_orders")
    mine = per_rank[trainer.global_rank] if per_rank and len(per_rank) == trainer.world_size else None
    epochs.data.load_drawn_order(mine if mine is not None else saved.get("drawn_order"))
    if saved.get("epoch_finished"):
        return
    accumulate = trainer.accumulate_grad_batches if trainer.module.automatic_optimization else 1
    # use_distributed_sampler=False: each rank read the loader as the user built it, so the position of each rank's
    # loader says nothing about which samples the ranks of another world have left (the errors: epoch.check_resume)
    epochs.resume(saved, saved_world, accumulate, source=path, epoch_name=f"epoch {state.epoch}",
                  world=trainer.world_size, users_split=not trainer.use_distributed_sampler)
    loader_states = saved.get("loader_states")
    if isinstance(epochs.data, (StatefulLoaderData, CombinedTrainData)) and loader_states and \
            len(loader_states) == trainer.world_size:
        epochs.data.load_loader_state(loader_states[trainer.global_rank])  # another world: refused just above
    warn_data_read_again(trainer, state)
    if trainer.is_global_zero:
        check_global_batch(path, saved_global_batch, global_batch, shard_world,
                           global_batch // shard_world // accumulate if global_batch else 0, accumulate,
                           state.samples_in_epoch)


def warn_data_read_again(trainer, state):
    """Lightning's warning where its restart reads the training loader again from its first batch (a checkpoint
    Lightning saved inside an epoch, the loader without a state: from_lightnings_loops), unless the saved step is a
    whole epoch's (its _TrainingEpochLoop.reset)."""
    num_batches = trainer._num_training_batches
    if not state.data_from_batch or state.data_from_batch != state.batch_in_epoch or num_batches is None or \
            num_batches == float("inf"):
        return
    accumulate = trainer.accumulate_grad_batches if trainer.module.automatic_optimization else 1
    if state.global_step % -(-num_batches // accumulate) != 0 and trainer.is_global_zero:
        import warnings

        warnings.warn("You're resuming from a checkpoint that ended before the epoch ended and your dataloader is "
                      "not resumable. This can cause unreliable results if further training is done. Consider using "
                      "an end-of-epoch checkpoint or make your dataloader resumable by implementing the "
                      "`state_dict` / `load_state_dict` interface.", PossibleUserWarning)


def plain(value):
    """Hyper-parameters must load with weights_only=True: keep plain data, turn the rest into strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (int, float, str, bool, type(None), torch.Tensor)):
        return value
    return repr(value)
