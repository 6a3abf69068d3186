"""Lightning's loop attributes (`trainer.fit_loop`, `.epoch_loop`, `.epoch_loop.val_loop`, `trainer.validate_loop`,
`trainer.test_loop`, `trainer.predict_loop`), as a read view of the Trainer's state: a callback or script written for
Lightning reads `trainer.fit_loop.epoch_progress.current.processed`, `trainer.fit_loop.epoch_loop.batch_progress`,
`trainer.fit_loop.total_batch_idx`, `trainer.fit_loop.restarting`, ... and sets `trainer.fit_loop.max_epochs = N`.

There is no loop here and no copy of Lightning's progress objects: every value is computed, when read, from
`trainer.state` (TrainState: epoch, global_step, batch_in_epoch, epoch_finished, and the plain counters a checkpoint
keeps as Lightning's keeps its `total`s: batches_taken, batches_cut, zero_grads, scheduler_steps, eval_batches, where
the epoch's own counts began (epoch_*_from), batch_phase), `trainer.current_epoch` and marks the loop keeps on the
FitState of the fit in progress (fit_state.py): `epoch_phase` (where the epoch is: its on_train_epoch_start, its
batches and validations, its end from on_train_epoch_end on), `optimizer_step_from` and `zero_grad_phase` (inside an
optimizer step or a zero_grad), `restarting`, `validates_counted_batch`. The limits Lightning users write
(max_epochs, min_epochs and, on `epoch_loop`, max_steps, min_steps) write the Trainer's own attributes.

Lightning's counters at each point, as this view gives them (e = the epoch being trained):

    epoch_progress.current   ready    started   processed   completed
      on_train_epoch_start    e+1       e          e           e
      batches, validation     e+1      e+1         e           e
      on_train_epoch_end...   e+1      e+1        e+1          e       (until the loop moves to the next epoch)
      restored from an epoch's end, until the loop starts: e+1, e+1, e+1, e (current_epoch is e there)
      elsewhere               trainer.current_epoch for all four
    (`total` is the same)

    epoch_loop.batch_progress   `total` over every epoch, fit and resume; `current` from after an epoch's
                      on_train_epoch_start (until then the epoch before's); a batch is `ready` from its
                      on_train_batch_start, `started` from its training_step, `processed` from its on_train_batch_end,
                      `completed` after it; one whose on_train_batch_start returned -1 is ready and processed only.
                      `is_last_batch` (trainer.is_last_batch) is kept until the next epoch's first batch and saved.
                      A checkpoint saved in on_train_batch_end holds that batch not completed until the resumed loop
                      goes on (Lightning's restart)
    batch_idx, total_batch_idx   batch_progress.current.ready - 1, batch_progress.total.ready - 1
    epoch_loop.scheduler_progress, .automatic_optimization.optim_progress.optimizer.step / .zero_grad,
    .manual_optimization.optim_step_progress   lr scheduler steps, optimizer steps (global_step), zero_grad calls,
                      `current` from after an epoch's on_train_epoch_start (manual steps: never reset, as Lightning's)
    epoch_loop._batches_that_stepped   the loggers' step (TrainState.batches_that_stepped), less the batch a
                      validation follows where tasktrain validates after counting it, or (a fit resumed from a
                      checkpoint saved in on_train_batch_end or in a validation, until its loop goes on) the saved
                      batch if it stepped
    restarting        a fit resumed from a checkpoint saved inside an epoch (or counted in steps: max_steps set), from
                      the restore until its first epoch ends (Lightning's rule, resume.skips_sanity_check)
    val_loop, validate_loop, test_loop   batch_progress.current / .total: evaluation batches (TrainState.eval_batches),
                      ready from on_*_batch_start, started from the step, processed from on_*_batch_end; is_last_batch,
                      max_batches, _max_batches (unclamped; a write sets the counts the next runs use), num_dataloaders,
                      _has_run
    predict_loop      batch_progress, current_batch_indices, predictions, epoch_batch_indices, max_batches,
                      num_dataloaders (PredictionLoop)
    done              max_steps or max_epochs reached (epochs counted as `processed`), no training batches, or a stop
                      asked once min_epochs / min_steps are met (Lightning's fit_loop.done, without its log lines)
"""
from tasktrain.trainer.lightning_connectors import data_source
from tasktrain.trainer.module import TaskModule, is_overridden
from tasktrain.trainer.states import TrainerFn


class LoopAttribute:
    """`Trainer.fit_loop`: the view, made once per Trainer. Lightning lets a user replace a loop object; tasktrain has
    none, so an assignment is refused rather than ignored."""

    def __init__(self, view, *args):
        self.view, self.args = view, args

    def __set_name__(self, owner, name):
        self.name, self.key = name, f"_{name}_view"

    def __get__(self, trainer, owner=None):
        if trainer is None:
            return self
        view = trainer.__dict__.get(self.key)
        if view is None:
            view = trainer.__dict__[self.key] = self.view(trainer, *self.args)
        return view

    def __set__(self, trainer, value):
        raise AttributeError(
            f"trainer.{self.name} is a read view of the Trainer's state in tasktrain (docs/lightning.md): it has no "
            "loop object to replace. Put custom behaviour in a Callback or the module's hooks.")


class Tracker:
    """Lightning's progress tracker: `ready`, `started`, `processed`, `completed`, read when asked."""

    __slots__ = ("_counts",)

    def __init__(self, counts):
        self._counts = counts  # () -> (ready, started, processed, completed)

    ready = property(lambda self: self._counts()[0])
    started = property(lambda self: self._counts()[1])
    processed = property(lambda self: self._counts()[2])
    completed = property(lambda self: self._counts()[3])

    def __setattr__(self, name, value):
        if name in ("ready", "started", "processed", "completed"):
            # Lightning's tests set `...optimizer.step.total.completed = i` to move global_step: here the counts are
            # computed from the Trainer's state, and a write would be lost
            raise AttributeError(
                f"The loop views' progress counters are read only in tasktrain (`.{name} = ...`): they are computed "
                "from the Trainer's state (docs/lightning.md, Loop attributes). Run the loop to move them, or resume "
                "from a checkpoint (ckpt_path=) to start from saved counts.")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return "Tracker(ready={}, started={}, processed={}, completed={})".format(*self._counts())


class StartedTracker(Tracker):
    """Lightning's _StartedTracker (optimizer zero_grad calls): no `processed`."""

    __slots__ = ()
    processed = property(lambda self: _no_such("processed", "_StartedTracker"))


class ReadyCompletedTracker(StartedTracker):
    """Lightning's _ReadyCompletedTracker (optimizer and scheduler steps): `ready` and `completed` only."""

    __slots__ = ()
    started = property(lambda self: _no_such("started", "_ReadyCompletedTracker"))


def _no_such(name, tracker):
    raise AttributeError(f"Lightning's {tracker} has no `{name}`: it does not count that stage")


def _module_to_set_up(trainer, path):
    """The module whose loaders a view's setup_data() sets up: the Trainer's (a run's, or the one given to
    trainer.strategy.connect(model))."""
    module = trainer.lightning_module
    if module is None:
        raise RuntimeError(f"{path}.setup_data(): no module is attached to the Trainer: call "
                           "trainer.strategy.connect(model) and trainer._data_connector.attach_data(model, ...) first, "
                           "or run an entry point.")
    return module


def _given(source):
    """The loaders a DataLoaderSource holds; None where they come from the module's or the DataModule's hook, which
    the Trainer's set-up calls itself (Trainer._loader_of)."""
    return None if source.is_module() else source.instance


class Progress:
    """Lightning's _Progress: `current` and `total` trackers (one tracker where Lightning's two are equal)."""

    __slots__ = ("current", "total")

    def __init__(self, current, total=None, tracker=Tracker):
        self.current = tracker(current)
        self.total = self.current if total is None else tracker(total)

    def __setattr__(self, name, value):
        try:
            object.__getattribute__(self, name)
        except AttributeError:  # (a slot set the first time: __init__, or unpickling, which uses setattr for slots)
            return object.__setattr__(self, name, value)
        raise AttributeError(f"The loop views' progress `{name}` is read only in tasktrain: it is computed from the "
                             "Trainer's state (docs/lightning.md, Loop attributes).")

    def __repr__(self):
        return f"Progress(current={self.current!r}, total={self.total!r})"


class BatchProgress(Progress):
    """Lightning's _BatchProgress: a Progress and `is_last_batch`."""

    __slots__ = ("_is_last",)

    def __init__(self, current, total, is_last):
        super().__init__(current, total)
        self._is_last = is_last

    is_last_batch = property(lambda self: self._is_last())


class _LoopView:
    """What the loop views share: Lightning's loop internals they do not have (`_evaluation_step`, `setup_data`, ...)
    are refused by name, and so is a write to anything but the limits with setters (max_epochs, ...) and the methods
    the Trainer calls through the view (_PATCHABLE): any other patched method or set counter would be ignored by the
    Trainer, which runs no loop object."""

    _PATH = "the loop view"
    _PATCHABLE = ()  # methods the Trainer calls through the view: a patch on the instance is seen, so allowed

    def _seal(self):  # (end of __init__; unpickling fills __dict__ directly, _sealed included)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name, value):
        attr = getattr(type(self), name, None)
        if (not self.__dict__.get("_sealed") or (isinstance(attr, property) and attr.fset is not None)
                or name in self._PATCHABLE):
            return object.__setattr__(self, name, value)
        raise AttributeError(
            f"{self._PATH}.{name} cannot be set in tasktrain: the loop views are read views of the Trainer's state "
            "(docs/lightning.md, Loop attributes), and the Trainer runs no loop object that would see it. Only the "
            "limits are written (fit_loop.max_epochs / min_epochs, fit_loop.epoch_loop.max_steps / min_steps) and "
            "fit_loop.epoch_loop._get_monitor_value patched; put "
            "custom behaviour in a Callback or the module's hooks.")

    def __getattr__(self, name):  # (only reached for names the view does not define)
        if name.startswith("__") or name == "_sealed":
            raise AttributeError(name)
        raise AttributeError(
            f"{self._PATH}.{name}: Lightning's loop internal {name!r} is not part of tasktrain's loop views, which "
            "read the Trainer's state (docs/lightning.md, Loop attributes, lists what they offer); tasktrain runs no "
            "loop object to patch or call. Use the Trainer's public attributes, a Callback or the module's hooks.")


class EvaluationLoop(_LoopView):
    """`trainer.validate_loop`, `trainer.test_loop` and `trainer.fit_loop.epoch_loop.val_loop`: the evaluation batches
    (`batch_progress.current` in the run, `.total` over the Trainer's validate / test runs (a run given a ckpt_path:
    from the count of that file, as Lightning's restores it: evaluation.restore_eval_total), or over the training
    epoch's validations for fit's, from each epoch's start and after the sanity check, which counts its own), as
    Lightning's: `ready` from the batch's on_*_batch_start, `started` from its step, `processed` from its
    on_*_batch_end, `completed` after it (TrainState.eval_batches: a checkpoint keeps them, as Lightning's);
    `batch_progress.is_last_batch` (the last loader's last batch taken, kept after the run), `max_batches` (the
    batch count of each loader: the sanity check's in it), `num_dataloaders`, `_has_run` (a batch completed in the
    run, the sanity check's not counted: ModelCheckpoint reads it)."""

    _COUNTS = {"val": "fit", "validate": "validate", "test": "test"}  # (the Trainer's num_*_batches of the loop)

    @property
    def _PATH(self):
        names = {"val": "fit_loop.epoch_loop.val_loop", "validate": "validate_loop", "test": "test_loop"}
        return "trainer." + names.get(self.__dict__.get("_key"), "validate_loop")

    def __init__(self, trainer, key):
        self._trainer, self._key = trainer, key
        # (bound methods, not lambdas: a Trainer holding its views pickles, e.g. to ddp_spawn's processes)
        self.batch_progress = BatchProgress(self._current, self._total, self._is_last_batch)
        self._seal()

    def _is_last_batch(self):
        return self._trainer.state.eval_is_last_batch[self._key]

    @property
    def _data_source(self):
        """Where the last run takes this loop's loaders from (lightning_connectors.DataLoaderSource)."""
        return data_source(self._trainer, "val" if self._key in ("val", "validate") else self._key)

    @property
    def max_batches(self):
        trainer = self._trainer
        counts = [float("inf") if count is None else count for count in trainer._counts[self._COUNTS[self._key]]]
        if trainer.sanity_checking:  # (Lightning's property clamps every evaluation loop's during the sanity check)
            steps = trainer.num_sanity_val_steps
            counts = [min(float("inf") if steps == -1 else steps, count) for count in counts]
        return counts

    @property
    def _max_batches(self):
        """Lightning's counts before the sanity check's clamp (max_batches is them clamped): the batches each loader
        runs, the Trainer's num_val_batches / num_test_batches. A write replaces them, as Lightning's attribute
        (which its loop reads at each run) until the loaders are counted again (set up for a run, or reloaded by
        reload_dataloaders_every_n_epochs): each validation then runs that many batches of each loader (none at
        all, no hook, where they sum to 0), and ModelCheckpoint's choice of save points reads them."""
        return [float("inf") if count is None else count for count in self._trainer._counts[self._COUNTS[self._key]]]

    @_max_batches.setter
    def _max_batches(self, counts):
        counts = list(counts)
        for count in counts:
            if isinstance(count, bool) or not isinstance(count, (int, float)) or count < 0 or \
                    (isinstance(count, float) and count != float("inf") and count % 1):
                raise ValueError(f"{self._PATH}._max_batches = {counts!r}: each loader's count must be a whole "
                                 "number of batches >= 0 or float('inf') (all of its batches).")
        self._trainer._counts[self._COUNTS[self._key]] = [None if count == float("inf") else int(count)
                                                           for count in counts]

    @property
    def num_dataloaders(self):
        return len(self.max_batches)

    @property
    def _has_run(self):
        return self._trainer._eval_has_run[self._key]

    def setup_data(self):
        """Lightning's: set up this loop's loaders now, from `_data_source`, by the set-up the Trainer's own run of
        the stage does: fit's validation loaders (loaders.val_data_now: the overfit_batches rule, the counts of
        num_val_batches and num_sanity_val_batches; nothing where they are set up already and no reload is due), a
        validate or test run's (evaluation.eval_loaders: num_val_batches / num_test_batches and
        trainer.val_dataloaders / test_dataloaders). Nothing with limit_*_batches=0 or without the step of the stage
        the Trainer is in, whichever loop is asked (Lightning's rule): limit_test_batches and test_step while
        trainer.testing, else limit_val_batches and validation_step (outside a run too: test_loop.setup_data() then
        needs a validation_step). The loaders set up and counted are this loop's own."""
        from tasktrain.trainer import evaluation, loaders

        trainer, key = self._trainer, self._key
        testing = trainer.testing
        if key == "val" and trainer._val_loader is not None and trainer.state.fn != TrainerFn.VALIDATING and \
                not loaders.val_reload_due(trainer):  # (set up for fit; after a validate run they are validate's)
            return
        module = _module_to_set_up(trainer, self._PATH)
        limit = trainer.limit_test_batches if testing else trainer.limit_val_batches
        if limit == 0 or not is_overridden("test_step" if testing else "validation_step", module, TaskModule):
            return
        if key == "val":
            trainer._pending_val = (module, _given(self._data_source))
            loaders.val_data_now(trainer)
        else:
            evaluation.eval_loaders(trainer, "test" if key == "test" else "validate", module,
                                    _given(self._data_source))

    def _current(self):
        return self._counts(1)

    def _total(self):
        return self._counts(0)

    def state_dict(self):
        """Lightning's state dict of this loop (its progress, as a Lightning checkpoint keeps it under
        ckpt["loops"]["validate_loop"] / ["test_loop"])."""
        return {"state_dict": {}, "batch_progress": _batch_progress_dict(self.batch_progress)}

    def _counts(self, which):
        trainer = self._trainer
        completed, phase = trainer.state.eval_batches[self._key][which], trainer._eval_phase[self._key]
        return (completed + (phase is not None), completed + (phase in ("started", "processed")),
                completed + (phase == "processed"), completed)


class PredictionLoop(_LoopView):
    """`trainer.predict_loop.epoch_batch_indices`: during a predict run, per loader, the dataset indices of each batch
    started so far (from its on_predict_batch_start on) where a BasePredictionWriter writes at the epoch's end, else
    an empty list per loader; [] outside a run (Lightning's, which empties it after on_predict_end).
    `batch_progress` (current: the run's, total: the Trainer's runs'; ready from on_predict_batch_start, started from
    predict_step, processed from on_predict_batch_end, completed after it; is_last_batch), `current_batch_indices` (a
    batch writer's indices of the batch), `predictions` (the run's, kept until the next: the one loader's list or one
    per loader; empty unless returned or written at the epoch's end), `max_batches`, `num_dataloaders`."""

    _PATH = "trainer.predict_loop"

    def __init__(self, trainer):
        self._trainer = trainer
        self.batch_progress = BatchProgress(self._current, self._total, self._is_last_batch)
        self._seal()

    @property
    def _data_source(self):
        return data_source(self._trainer, "predict")

    def setup_data(self):
        """Lightning's: set up the predict loaders now, from `_data_source`, by the set-up of the Trainer's predict
        run (evaluation.eval_loaders: num_predict_batches, trainer.predict_dataloaders); nothing with
        limit_predict_batches=0."""
        from tasktrain.trainer import evaluation

        trainer = self._trainer
        module = _module_to_set_up(trainer, self._PATH)
        if trainer.limit_predict_batches == 0:
            return
        evaluation.eval_loaders(trainer, "predict", module, _given(self._data_source))

    def _current(self):
        return self._counts(1)

    def _total(self):
        return self._counts(0)

    def state_dict(self):
        """Lightning's state dict of the predict loop (ckpt["loops"]["predict_loop"]: a progress without
        is_last_batch)."""
        return {"state_dict": {}, "batch_progress": _progress_dict(self.batch_progress)}

    def _counts(self, which):
        completed, phase = self._trainer._predict_counts[which], self._trainer._predict_phase
        return (completed + (phase is not None), completed + (phase in ("started", "processed")),
                completed + (phase == "processed"), completed)

    def _is_last_batch(self):
        return self._trainer._predict_is_last

    @property
    def current_batch_indices(self):
        return self._trainer._predict_current_indices

    @property
    def predictions(self):
        kept = self._trainer._predict_kept
        if not kept:
            return []
        return kept[0] if len(kept) == 1 else kept

    @property
    def max_batches(self):
        return [float("inf") if count is None else count for count in self._trainer._counts["predict"]]

    @property
    def num_dataloaders(self):
        return len(self.max_batches)

    @property
    def epoch_batch_indices(self):
        from tasktrain.callbacks.prediction_writer import BasePredictionWriter

        trainer, started = self._trainer, self._trainer._predict_started
        if started is None:
            return []
        if not any(isinstance(cb, BasePredictionWriter) and cb.writes_on_epoch for cb in trainer.callbacks):
            return [[] for _ in started]
        return [list(indices[:count]) for indices, count in zip(trainer.predict_batch_indices, started)]


class Holder(_LoopView):
    """A plain object holding Lightning's nested names (optim_progress.optimizer.step, ...)."""

    _PATH = "trainer.fit_loop.epoch_loop's optimization view"

    def __init__(self, **parts):
        self.__dict__.update(parts)
        self._seal()


class OptimizationProgress(Holder):
    """Lightning's _OptimizationProgress: `optimizer.step`, `optimizer.zero_grad`, `optimizer_steps`."""

    @property
    def optimizer_steps(self):
        return self.optimizer.step.total.completed


class EpochLoop(_LoopView):
    """`trainer.fit_loop.epoch_loop`: Lightning's training epoch loop's step limits and counters."""

    _PATH = "trainer.fit_loop.epoch_loop"
    _PATCHABLE = ("_get_monitor_value",)

    def __init__(self, trainer):
        self._trainer = trainer
        self.val_loop = EvaluationLoop(trainer, "val")
        self.batch_progress = BatchProgress(self._current_batches, self._total_batches, self._is_last_batch)
        self.scheduler_progress = Progress(self._current_scheduler_steps, self._total_scheduler_steps,
                                           ReadyCompletedTracker)
        steps = Progress(self._current_steps, self._total_steps, ReadyCompletedTracker)
        zero_grads = Progress(self._current_zero_grads, self._total_zero_grads, StartedTracker)
        self.automatic_optimization = Holder(optim_progress=OptimizationProgress(
            optimizer=Holder(step=steps, zero_grad=zero_grads)))
        # (manual optimisation's steps: never reset by an epoch in Lightning, so current is total)
        self.manual_optimization = Holder(optim_step_progress=Progress(
            self._manual_steps, tracker=ReadyCompletedTracker))
        self._seal()

    # (bound methods, not lambdas: a Trainer holding its views pickles)
    def _current_batches(self):
        return _batch_counts(self._trainer, total=False)

    def _total_batches(self):
        return _batch_counts(self._trainer, total=True)

    def _is_last_batch(self):
        return self._trainer.state.is_last_batch

    def _current_scheduler_steps(self):
        state = self._trainer.state
        return _ready_completed(state.scheduler_steps - state.epoch_scheduler_steps_from)

    def _total_scheduler_steps(self):
        return _ready_completed(self._trainer.state.scheduler_steps)

    def _current_steps(self):
        return _step_counts(self._trainer, self._trainer.state.epoch_steps_from, automatic=True)

    def _total_steps(self):
        return _step_counts(self._trainer, 0, automatic=True)

    def _manual_steps(self):
        return _step_counts(self._trainer, 0, automatic=False)

    def _current_zero_grads(self):
        return _zero_grad_counts(self._trainer, self._trainer.state.epoch_zero_grads_from)

    def _total_zero_grads(self):
        return _zero_grad_counts(self._trainer, 0)

    def _get_monitor_value(self, key):
        """The value a scheduler that watches `key` (ReduceLROnPlateau) steps with: the Trainer's scheduler stepping
        reads it through this method, as Lightning's does, so a patch on this view (Lightning's tests wrap it to
        record the values) is seen."""
        return self._trainer.callback_metrics.get(key)

    @property
    def max_steps(self):
        return self._trainer.max_steps

    @max_steps.setter
    def max_steps(self, value):
        self._trainer.max_steps = value

    @property
    def min_steps(self):
        return self._trainer.min_steps

    @min_steps.setter
    def min_steps(self, value):
        self._trainer.min_steps = value

    @property
    def global_step(self):
        return self._trainer.global_step

    @property
    def _batches_that_stepped(self):
        """The loggers' step (trainer.state.batches_that_stepped, docs/logging.md), as Lightning's reads at each
        point: a validation tasktrain runs after the batch it follows is counted (the epoch's end, a stop) sees the
        count without it."""
        trainer = self._trainer
        fit, state = trainer._fit_state, trainer.state
        if state.saved_in_stepping_batch:  # resumed from a checkpoint saved in the on_train_batch_end or the
            # validation of a batch that stepped: Lightning counts that batch once its restarted loop goes on,
            # tasktrain's checkpoint when it was saved (the loop clears the mark as it goes on)
            return state.batches_that_stepped - 1
        return state.batches_that_stepped - int(fit is not None and fit.validates_counted_batch)

    @property
    def batch_idx(self):
        return self.batch_progress.current.ready - 1

    @property
    def total_batch_idx(self):
        return self.batch_progress.total.ready - 1

    def _should_accumulate(self):
        """Lightning's: the batch being trained does not end an accumulation window (nor the epoch), so no optimizer
        step follows it (ThroughputMonitor reads it in on_train_batch_end). (tasktrain's loop steps at the epoch's
        last batch under every strategy, DeepSpeed's included.)"""
        trainer, progress = self._trainer, self.batch_progress
        ready = progress.current.ready
        window_done = ready % trainer.accumulate_grad_batches == 0
        final = ready == trainer.num_training_batches or progress.is_last_batch
        return not window_done and not final

    def _should_check_val_epoch(self):
        """Lightning's: this epoch validates (check_val_every_n_epoch; its progress bar reads it)."""
        trainer, every = self._trainer, self._trainer.check_val_every_n_epoch
        return bool(trainer.enable_validation) and (every is None or (trainer.current_epoch + 1) % every == 0)


class FitLoop(_LoopView):
    """`trainer.fit_loop`: Lightning's fit loop's limits and counters (see the module's docstring)."""

    _PATH = "trainer.fit_loop"

    def __init__(self, trainer):
        self._trainer = trainer
        self.epoch_loop = EpochLoop(trainer)
        self.epoch_progress = Progress(self._epoch_counts)
        self._seal()

    def _epoch_counts(self):
        return _epoch_counts(self._trainer)

    @property
    def _data_source(self):
        """Where the last fit takes its training loaders from (lightning_connectors.DataLoaderSource): a
        configure_optimizers that sizes its schedule reads `len(trainer.fit_loop._data_source.dataloader())`."""
        return data_source(self._trainer, "train")

    def setup_data(self):
        """Lightning's: set up the fit's training loaders now, from `_data_source`, by the Trainer's own set-up of a
        fit's training data (loaders.train_data_now: sharded, limited, counted: trainer.train_dataloader,
        num_training_batches, val_check_batch). Nothing where they are set up already and no reload is due
        (reload_dataloaders_every_n_epochs: in a fit in progress, reloaded as its loop reloads them), with
        limit_train_batches=0, or without a training_step."""
        from tasktrain.trainer import loaders

        trainer = self._trainer
        if getattr(trainer, "_train_data", None) is not None and not loaders.train_reload_due(trainer):
            return
        module = _module_to_set_up(trainer, self._PATH)
        if trainer.limit_train_batches == 0 or not is_overridden("training_step", module, TaskModule):
            return
        fit = trainer._fit_state
        if fit is not None and fit.epochs is not None:  # (the fit in progress trains on them)
            loaders.reload(trainer, fit)
            trainer._train_data = fit.epochs
            return
        trainer._pending_train, trainer._train_data = (module, _given(self._data_source)), None
        loaders.train_data_now(trainer)

    @property
    def max_epochs(self):
        return self._trainer.max_epochs

    @max_epochs.setter
    def max_epochs(self, value):
        self._trainer.max_epochs = value

    @property
    def min_epochs(self):
        return self._trainer.min_epochs

    @min_epochs.setter
    def min_epochs(self, value):
        self._trainer.min_epochs = value

    @property
    def max_steps(self):  # (read-only, as Lightning's: epoch_loop.max_steps is the one to set)
        return self._trainer.max_steps

    @property
    def min_steps(self):
        return self._trainer.min_steps

    @property
    def batch_idx(self):
        return self.epoch_loop.batch_idx

    @property
    def total_batch_idx(self):
        return self.epoch_loop.total_batch_idx

    def _should_accumulate(self):
        return self.epoch_loop._should_accumulate()

    @property
    def max_batches(self):
        """The training epoch's batch count (trainer.num_training_batches; inf without a length)."""
        return self._trainer.num_training_batches

    @max_batches.setter
    def max_batches(self, value):
        raise AttributeError(
            "trainer.fit_loop.max_batches is read-only in tasktrain: the epoch's length comes from the loader and "
            "limit_train_batches (Lightning's StochasticWeightAveraging writes it: use tasktrain's "
            "StochasticWeightAveraging callback).")

    @property
    def _skip_backward(self):
        """Lightning's flag for the training steps that skip the backward: only its StochasticWeightAveraging sets
        it, for the extra epoch it runs to recompute BatchNorm statistics. tasktrain's SWA recomputes them in one
        pass after the fit and every training step runs its backward, so it is False (a write is refused)."""
        return False

    @property
    def restarting(self):
        fit = self._trainer._fit_state
        return fit is not None and fit.restarting

    def state_dict(self):
        """Lightning's state dict of its fit loop, read from the views: the progress a Lightning checkpoint keeps
        under ckpt["loops"]["fit_loop"] (tasktrain's checkpoints keep it too, so that Lightning's Trainer resumes
        them; resume.run_state). (No "combined_loader": a StatefulDataLoader's state is in tasktrain's train
        state.)"""
        loop = self.epoch_loop
        optimizer = loop.automatic_optimization.optim_progress.optimizer
        return {
            "state_dict": {},
            "epoch_loop.state_dict": {"_batches_that_stepped": int(loop._batches_that_stepped)},
            "epoch_loop.batch_progress": _batch_progress_dict(loop.batch_progress),
            "epoch_loop.scheduler_progress": _progress_dict(loop.scheduler_progress, _READY_COMPLETED),
            "epoch_loop.automatic_optimization.state_dict": {},
            "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {
                "step": _progress_dict(optimizer.step, _READY_COMPLETED),
                "zero_grad": _progress_dict(optimizer.zero_grad, _READY_COMPLETED + ("started",))}},
            "epoch_loop.manual_optimization.state_dict": {},
            "epoch_loop.manual_optimization.optim_step_progress": _progress_dict(
                loop.manual_optimization.optim_step_progress, _READY_COMPLETED),
            "epoch_loop.val_loop.state_dict": {},
            "epoch_loop.val_loop.batch_progress": _batch_progress_dict(loop.val_loop.batch_progress),
            "epoch_progress": _progress_dict(self.epoch_progress),
        }

    @property
    def done(self):
        trainer = self._trainer
        if trainer.num_training_batches == 0:
            return True
        if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
            return True
        processed = epochs_processed(trainer)
        if trainer.max_epochs is not None and trainer.max_epochs != -1 and processed >= trainer.max_epochs:
            return True
        can_stop = processed >= (trainer.min_epochs or 0) and trainer.global_step >= (trainer.min_steps or 0)
        return bool(trainer.should_stop) and can_stop


_READY_COMPLETED = ("ready", "completed")


def _progress_dict(progress, keys=("ready", "completed", "started", "processed")):
    """A progress view as Lightning's _Progress.state_dict() writes it (its trackers' fields, in its order)."""
    return {which: {key: int(getattr(getattr(progress, which), key)) for key in keys} for which in ("total", "current")}


def _batch_progress_dict(progress):
    return {**_progress_dict(progress), "is_last_batch": bool(progress.is_last_batch)}


def _phase(trainer):
    fit = trainer._fit_state
    return None if fit is None else fit.epoch_phase


def epochs_processed(trainer):
    """Lightning's fit_loop.epoch_progress.current.processed: the epochs whose batches ran to their end (counted
    before on_train_epoch_end; current_epoch counts them after it, and a fit restored from a save in
    on_train_epoch_end counts its epoch only once its loop starts). The epoch an evaluation's samplers get."""
    return _epoch_counts(trainer)[2]


def _epoch_counts(trainer):
    phase, epoch = _phase(trainer), trainer.state.epoch
    if phase is None and trainer.state.epoch_finished:  # restored from an epoch's end, the loop not started yet
        return epoch + 1, epoch + 1, epoch + 1, epoch
    if phase is None:
        done = trainer.current_epoch
        return done, done, done, done
    return epoch + 1, epoch + (phase != "start"), epoch + (phase == "end"), epoch


# the counts the batch being trained has not reached yet, by how far it got (TrainState.batch_phase)
_NOT_YET = {None: (0, 0, 0), "ready": (1, 1, 1), "started": (0, 1, 1), "processed": (0, 0, 1), "restored": (0, 0, 1)}


def _batch_counts(trainer, total):
    """Lightning's training batch_progress (ready, started, processed, completed), from the TrainState's counters:
    `total` over every epoch, fit and resume, `current` since the epoch's counts began (after its
    on_train_epoch_start); a batch whose on_train_batch_start returned -1 is ready and processed, never started nor
    completed (Lightning's)."""
    state = trainer.state
    ready = state.batches_taken - (0 if total else state.epoch_batches_from)
    cut = state.batches_cut if total else int(state.epoch_cut)
    started, processed, completed = _NOT_YET[state.batch_phase]
    return ready, ready - cut - started, ready - processed, ready - cut - completed


def _ready_completed(count, open_=False):
    return count + open_, None, None, count


def _step_counts(trainer, since, automatic):
    """Lightning's optimizer step progress: `ready` from the module's optimizer_step on (manual optimisation: from
    the LightningOptimizer's step), `completed` once it returned; global_step counts it inside (an optimizer_step
    that reads it after optimizer.step() sees the step, as in Lightning), so the one in progress is taken off."""
    module = trainer.module
    if module is not None and bool(module.automatic_optimization) != automatic:  # (the other loop's: not counted)
        return 0, None, None, 0
    fit = trainer._fit_state
    from_ = None if fit is None else fit.optimizer_step_from
    completed = trainer.global_step if from_ is None else from_
    return _ready_completed(completed - since, from_ is not None)


def _zero_grad_counts(trainer, since):
    fit, count = trainer._fit_state, trainer.state.zero_grads - since
    phase = None if fit is None else fit.zero_grad_phase
    return count, count - (phase == "ready"), None, count - (phase is not None)
