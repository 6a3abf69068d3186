"""ModelCheckpoint: save at step or epoch intervals, keep the top k by a monitored metric, keep `last.ckpt`.

When it saves (it is the last callback, so every other callback's state is already updated):

- every_n_epochs: at on_train_epoch_end, after the epoch's validation (save_on_train_epoch_end True); or at the end
  of each validation run, inside the epoch (val_check_interval) and at its end (False), as Lightning: the epoch-end
  one saves before the step schedulers that watch a metric step after it, before on_train_epoch_end and the epoch
  schedulers, so a resume from that file runs the epoch's end (not its validation again).
- every_n_train_steps: at on_train_batch_end of every n-th optimizer step; at the last batch of an epoch the save
  waits for the epoch-end validation of the same step (its on_validation_end, or on_train_epoch_end when saves are
  at epoch ends or no validation follows).
- train_time_interval: at on_train_batch_end of the first optimizer step after that much time since the previous
  such save (or the fit's start); on several processes rank 0's clock decides for every rank, broadcast at each
  optimizer step as Lightning does (the one collective per step this schedule costs).
- under manual optimisation both schedules are checked at every batch's end (_manual_batch_end).

save_on_train_epoch_end says which of the epoch schedule's points count: True, the epoch ends; False, the ends of
validation runs (inside the epoch and at its end; an epoch without validation saves nothing); None (default),
Lightning's choice, made from the trainer's state at each point that asks (each epoch's end, each validation's end, a
step save's deferral), as Lightning's _should_save_on_train_epoch_end: False with a time val_check_interval or
check_val_every_n_epoch != 1; True when the fit's validation counts (trainer.num_val_batches) sum to 0 (no
validation, limit_val_batches=0, empty loaders, a write to fit_loop.epoch_loop.val_loop._max_batches); else True
only when val_check_interval == 1.0 (validation at the epoch's end only).

A monitored value is scored once: a save whose monitored value has not been logged again since the previous
save (no validation in between) only refreshes `last.ckpt`. Before the first validation of a fit, a monitored
validation metric does not exist yet and the top-k save is skipped; after it, a missing metric is an error.
"""
import math
import os
import re
import sys
import time
import warnings
from datetime import timedelta
from typing import Literal, Optional, Union

import torch

from tasktrain.callbacks.base import Checkpoint, Logger
from tasktrain.checkpoint_io import atomic_link, link_tree, local_path, record_for_restarts, remove_path
from tasktrain.exceptions import MisconfigurationException

_MANUAL_STEP_SAVE_WARNING = (  # (Lightning's words)
    "Using ModelCheckpoint with manual optimization and every_n_train_steps, but no pre-optimization state was "
    "saved. The checkpoint will contain the model state AFTER optimization. To save the pre-optimization state, save "
    "the model state in training_step before optimizer.step(). Example:\n"
    "def training_step(self, batch, batch_idx):\n"
    "    # ... forward pass, loss calculation, backward pass ...\n"
    "    # Save model state before optimization\n"
    "    if not hasattr(self, 'saved_models'):\n"
    "        self.saved_models = {}\n"
    "    self.saved_models[batch_idx] = {\n"
    "        k: v.detach().clone() for k, v in self.layer.state_dict().items()\n"
    "    }\n"
    "    # Then perform optimization\n"
    "    optimizer.zero_grad()\n"
    "    self.manual_backward(loss)\n"
    "    optimizer.step()")
_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")  # {name} or {name:format}; a name may hold "/", "." or "@"


class ModelCheckpoint(Checkpoint):
    # Lightning's class attributes: a subclass (or an instance) may change them, e.g. CHECKPOINT_NAME_LAST =
    # "{epoch}-last" names the last checkpoint with the same fields as filename.
    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"

    STARTING_VERSION = 1  # the first "-v1" of a name that is taken (enable_version_counter)

    # Lightning's positional order; async_save (ours) comes after Lightning's arguments
    def __init__(self, dirpath: Optional[Union[str, os.PathLike]] = None, filename: Optional[str] = None,
                 monitor: Optional[str] = None, verbose: bool = False,
                 save_last: Optional[Union[bool, Literal["link"]]] = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False, mode: str = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: Optional[int] = None,
                 train_time_interval: Optional[timedelta] = None, every_n_epochs: Optional[int] = None,
                 save_on_train_epoch_end: Optional[bool] = None, enable_version_counter: bool = True,
                 async_save: bool = False):
        if save_last not in (None, True, False, "link"):
            raise MisconfigurationException(f"ModelCheckpoint(save_last={save_last!r}): use True (write last.ckpt), "
                                            "'link' (a link to the newest checkpoint), or False/None.")
        # Lightning's messages (users and tests match on them), each followed by what to do
        if mode not in ("min", "max"):
            raise MisconfigurationException(f"`mode` can be min, max but got {mode}")
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise MisconfigurationException(
                f"Invalid value for save_top_k={save_top_k}. Must be >= -1 (-1: all, 0: none, k: the best k).")
        if save_top_k not in (0, 1, -1) and monitor is None:
            raise MisconfigurationException(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. No quantity for "
                "top_k to track. (monitor='step', mode='max' keeps the newest k.)")
        if every_n_epochs is None and every_n_train_steps is None and train_time_interval is None:
            every_n_epochs = 1  # no schedule given: each epoch (Lightning's rule; every_n_epochs=0 means none)
        if train_time_interval is not None:
            if isinstance(train_time_interval, (int, float)):
                train_time_interval = timedelta(seconds=train_time_interval)
            if not isinstance(train_time_interval, timedelta) or train_time_interval.total_seconds() < 0:
                raise MisconfigurationException(
                    f"ModelCheckpoint(train_time_interval={train_time_interval!r}): use a timedelta "
                    "(or seconds), e.g. timedelta(minutes=30).")
        if async_save not in (True, False):
            raise MisconfigurationException(
                f"ModelCheckpoint(async_save={async_save!r}): use True (write in the background) or False.")
        if save_on_train_epoch_end not in (None, True, False):
            raise MisconfigurationException(
                f"ModelCheckpoint(save_on_train_epoch_end={save_on_train_epoch_end!r}): use None, True "
                "or False.")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise MisconfigurationException(
                    f"Invalid value for {name}={value}. Must be >= 0 (a positive integer, or None/0 for never).")
        if sum((bool(every_n_train_steps), bool(every_n_epochs), train_time_interval is not None)) > 1:
            raise MisconfigurationException(
                f"Combination of parameters every_n_train_steps={every_n_train_steps or 0}, "
                f"every_n_epochs={every_n_epochs or 0} and train_time_interval={train_time_interval} should be "
                "mutually exclusive. Use one ModelCheckpoint per schedule.")
        if save_on_exception not in (True, False):
            raise MisconfigurationException(f"ModelCheckpoint(save_on_exception={save_on_exception!r}): use True or "
                                            "False.")
        # every_n_epochs=0 (and no other schedule) is Lightning's "no scheduled saves": only save_on_exception
        # (and a save_checkpoint of the user's) writes then.
        if dirpath and _is_local(dirpath):  # Lightning's: "~" expanded, the real path (a later chdir does not move it)
            # (a file:// URL is its local folder; Lightning 2.6 takes the real path of the URL itself: its files go
            # to a folder named "file:" under the working directory)
            dirpath = os.path.realpath(os.path.expanduser(local_path(dirpath)))
        self.dirpath = dirpath or None
        self._auto_dirpath = None  # the folder setup filled dirpath with (dirpath=None): resolved again each fit
        self.save_on_exception = save_on_exception
        self._restored = None  # the state a resume loaded: checked against this run's folder at fit start
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.verbose = verbose
        self._enable_version_counter = enable_version_counter
        # Lightning's attributes: 0 means "not on this schedule"
        self._every_n_train_steps = every_n_train_steps or 0
        self._every_n_epochs = every_n_epochs or 0
        self.save_weights_only = save_weights_only
        self._train_time_interval = train_time_interval
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.async_save = async_save
        self._pending = None  # async_save: (writer, the bookkeeping that holds once the save in flight is complete)
        self._last_time_checked = None
        self.best_k_models = {}  # path -> score (for no monitor: the step, so "best" is the newest)
        self.best_model_path = ""
        self.best_model_score = None
        self.current_score = None  # the monitored value of the latest top-k candidate (a tensor), as in Lightning
        self.kth_best_model_path = ""  # the worst of the top k, once there are k (the one the next better evicts)
        self.kth_value = self._worst_value()  # Lightning's start: +inf for mode="min", -inf for "max"
        self.last_model_path = ""
        self._last_saved_step = -1
        self._topk_written = False
        self._last_checkpoint_saved = ""  # the newest file this callback wrote (what save_last="link" points at)
        self._seen_step = 0  # global_step at the previous batch end
        self._validations_seen = 0  # validation runs of this fit (not the sanity check)
        self._step_save_deferred = False  # a step save deferred to the next validation's end (Lightning's)
        self._resolved_dir = None

    @property
    def every_n_epochs(self):
        return self._every_n_epochs

    @property
    def every_n_train_steps(self):
        return self._every_n_train_steps

    @property
    def train_time_interval(self):
        return self._train_time_interval

    @property
    def state_key(self):
        # Lightning's key, in its order (not sorted): a checkpoint written by either loads in the other
        settings = {"monitor": self.monitor, "mode": self.mode, "every_n_train_steps": self._every_n_train_steps,
                    "every_n_epochs": self._every_n_epochs, "train_time_interval": self._train_time_interval}
        return f"{type(self).__qualname__}{settings!r}"

    @property
    def _legacy_state_keys(self):
        """The keys tasktrain used before (sorted settings, None for an unused schedule): such a checkpoint still
        loads."""
        extra = {} if self._train_time_interval is None else {"train_time_interval": self._train_time_interval}
        return (self._generate_state_key(monitor=self.monitor, mode=self.mode,
                                         every_n_epochs=self._every_n_epochs or None,
                                         every_n_train_steps=self._every_n_train_steps or None, **extra),)

    def dirpath_resolved(self, trainer):
        if self._resolved_dir is None:
            if self.dirpath is not None and self.dirpath == self._auto_dirpath:
                self.dirpath = None  # filled in by an earlier fit: this fit's logger decides again
            directory = self.dirpath or _default_dirpath(trainer)
            self._resolved_dir = trainer.strategy.broadcast(directory)
            if self.dirpath is None:  # Lightning's attribute shows the folder once fit has set it up
                self.dirpath = self._auto_dirpath = self._resolved_dir
        return self._resolved_dir

    def to_yaml(self, filepath=None):
        """Write best_k_models ({path: score}) as YAML, to `filepath` or <dirpath>/best_k_models.yaml."""
        import yaml  # PyYAML: only when asked

        if filepath is None:
            if not self.dirpath:
                raise MisconfigurationException("ModelCheckpoint.to_yaml(): no dirpath yet (it is set when fit "
                                                "starts); pass filepath=.")
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        with open(filepath, "w") as f:
            yaml.dump({path: float(score) for path, score in self.best_k_models.items()}, f)

    # -- events --------------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        if self.save_last == "link" and self.dirpath and not _is_local(self.dirpath):
            raise ValueError(f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self.dirpath}`. Use save_last=True there.")
        self._resolved_dir = None
        self._restored = None  # (set again by a resume of this fit)
        if stage == "fit":
            directory = self.dirpath_resolved(trainer)
            if trainer.is_global_zero and self.save_top_k != 0 and os.path.isdir(directory) and os.listdir(directory):
                warnings.warn(f"Checkpoint directory {directory} exists and is not empty.", stacklevel=2)
            if self.async_save:
                trainer.strategy.check_async_save(self.save_weights_only)
                overridden = [name for name in ("_save_topk_checkpoint", "_save_monitor_checkpoint",
                                                "_save_none_monitor_checkpoint", "_save_last_checkpoint",
                                                "_save_checkpoint")
                              if getattr(type(self), name, None) is not getattr(ModelCheckpoint, name, None)]
                if overridden:  # the background writer has its own path: the overrides would never run
                    raise ValueError(
                        f"{type(self).__name__} overrides {', '.join(overridden)}, which async_save=True does not call "
                        "(it stages the state and writes it in the background). Use async_save=False with these "
                        "overrides, or override format_checkpoint_name / the callback hooks instead.")
        self._validations_seen = 0
        self._step_save_deferred = False

    def on_train_start(self, trainer, pl_module):
        self._adopt_restored(trainer)  # DeepSpeed/FSDP restore the callbacks after on_fit_start (Lightning's order)
        self._seen_step = trainer.global_step
        self._last_time_checked = time.monotonic()

    def _should_save_on_train_epoch_end(self, trainer):
        """Lightning's choice of the epoch schedule's save points (a subclass may override it), asked from the
        trainer's state wherever it matters, as Lightning asks it (each epoch's end, each validation's end, a step
        save's deferral), so a change of the validation counts during the fit moves the save points as in Lightning:
        save_on_train_epoch_end when given; False (validation ends) with a time val_check_interval or when not every
        epoch validates; True (epoch ends) when the fit's validation counts sum to 0 (nothing to validate: none
        requested yet, limit_val_batches=0, empty loaders, val_loop._max_batches written to 0); else True only when
        validation runs at the epoch's end alone (val_check_interval == 1.0)."""
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        # A time val_check_interval ('DD:HH:MM:SS', timedelta, dict) is kept as seconds in _val_check_time_interval,
        # as Lightning keeps it: a later write of trainer.val_check_interval leaves the time schedule (and this rule).
        if getattr(trainer, "_val_check_time_interval", None) is not None:
            return False
        if trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval == 1.0

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "fit" and trainer.state.stage in ("train", "validate"):  # (not the sanity check)
            self._validations_seen += 1
            # Lightning's order: a validation runs after the batch's on_train_batch_end; with saves at validation ends
            # (save_on_train_epoch_end False) the epoch schedule saves here at every validation's end, and a step save
            # its batch deferred (a monitor not logged yet, or fresh validation metrics due) is made here. The
            # epoch-end one too: before the step schedulers that watch a metric step after it, before
            # on_train_epoch_end and the epoch schedulers (the file is "inside the epoch": a resume from it runs the
            # epoch's end).
            if self._last_saved_step == trainer.global_step or self._should_save_on_train_epoch_end(trainer):
                return
            if self._step_save_deferred:
                self._step_save_deferred = False
                self._save(trainer, by_step=True)
            elif self._epoch_due(trainer):
                self._save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        # Only batches that completed an optimizer step count (not the other micro-batches of a window).
        stepped, self._seen_step = step != self._seen_step, step
        if not pl_module.automatic_optimization:
            self._manual_batch_end(trainer, pl_module, step)
            return
        due = bool(stepped and self.every_n_train_steps and step % self.every_n_train_steps == 0)
        if stepped and self.train_time_interval is not None and self._time_is_up(trainer):
            due = True
        if not due or self._last_saved_step == step:
            return
        # Lightning's deferrals to the next validation's end (made there only with saves at validation ends): the
        # monitored value is not logged yet, or this is the epoch's last batch and its validation will run
        if self.monitor is not None:
            if self.monitor not in self._monitor_candidates(trainer):
                self._step_save_deferred = True
                return
            total = trainer.num_training_batches
            if total is not None and trainer.state.batch_in_epoch >= total and \
                    not self._should_save_on_train_epoch_end(trainer) and self._validates_this_epoch(trainer):
                self._step_save_deferred = True
                return
        self._save(trainer, by_step=True)

    def _manual_batch_end(self, trainer, pl_module, step):
        """The step schedule under manual optimisation, Lightning 2.6's: training_step steps when it likes, so every
        batch's end is checked, a batch that did not step included: a save is due where global_step is a multiple of
        every_n_train_steps and was not saved yet (none at step 0), so one deferred at its step (the monitored value
        not logged yet) is made at the next batch once that value exists, or at the next validation's end with saves
        there. No deferral for a value the epoch-end validation will refresh. train_time_interval is checked at every
        batch's end too: Lightning 2.6 ignores it under manual optimisation (a bug, its fix is Lightning's PR #21699:
        docs/lightning.md), which would leave a run with only a time schedule without any checkpoint."""
        due = bool(self.every_n_train_steps) and step % self.every_n_train_steps == 0
        if self.train_time_interval is not None and self._time_is_up(trainer):
            due = True
        if not due or step == 0 or self._last_saved_step == step:
            return
        if self.monitor is not None and self.monitor not in self._monitor_candidates(trainer):
            self._step_save_deferred = True
            return
        self._save_pre_step_weights(trainer, pl_module)

    def _save_pre_step_weights(self, trainer, pl_module):
        """A step save of manual optimisation, as Lightning 2.6 documents it: training_step stepped the optimizer
        before this save, so the module's weights are already the next step's. Lightning's documented remedy: the
        module keeps `self.saved_models[batch_idx]`, its `self.layer`'s state before optimizer.step(); the save then
        holds the latest one (the live weights are put back after). Without it, Lightning's warning."""
        saved, layer = getattr(pl_module, "saved_models", None), getattr(pl_module, "layer", None)
        if not (isinstance(saved, dict) and saved and isinstance(layer, torch.nn.Module)):
            if trainer.is_global_zero and self.every_n_train_steps:  # (the warning names that schedule)
                warnings.warn(_MANUAL_STEP_SAVE_WARNING, UserWarning, stacklevel=2)
            self._save(trainer, by_step=True)
            return
        state = saved[max(saved)]
        if not isinstance(state, dict):
            raise TypeError("Saved model state must be a dictionary")  # (Lightning's words)
        with torch.no_grad():
            live = {k: v.detach().clone() for k, v in layer.state_dict().items()}
            try:
                layer.load_state_dict(state)
                self._save(trainer, by_step=True)
            finally:
                layer.load_state_dict(live)

    def on_train_epoch_end(self, trainer, pl_module):
        # with saves at validation ends (save_on_train_epoch_end False) the epoch's schedule saved at its validation's
        # end; Lightning's rule: nothing more where this step was saved already
        if self._last_saved_step != trainer.global_step and self._should_save_on_train_epoch_end(trainer) and \
                self._epoch_due(trainer):
            self._save(trainer)

    def _validates_this_epoch(self, trainer):
        """Lightning's test before deferring a step save to the epoch-end validation: validation enabled, the fit's
        validation counts (inf for a loader without a length) sum above 0 (not when the loaders were not requested
        yet, as in Lightning), and this epoch validates."""
        n = trainer.check_val_every_n_epoch
        return bool(trainer.enable_validation) and sum(trainer.num_val_batches) > 0 and \
            (n is None or (trainer.current_epoch + 1) % n == 0)

    def _epoch_due(self, trainer):
        n = self.every_n_epochs
        return bool(n) and (trainer.current_epoch + 1) % n == 0

    def _time_is_up(self, trainer):
        """Rank 0's clock, the same answer on every rank."""
        now = time.monotonic()
        up = now - self._last_time_checked >= self.train_time_interval.total_seconds()
        if trainer.world_size > 1:
            up = bool(trainer.strategy.broadcast(up))
        if up:
            self._last_time_checked = now
        return up

    def on_train_end(self, trainer, pl_module):
        """save_last when nothing was saved during fit (save_top_k=0, or no scheduled save came): `last` is
        written once, at the end (Lightning's rule)."""
        if self.save_last and not self._last_checkpoint_saved and not trainer.fast_dev_run:
            if trainer.may_save_checkpoint(self.dirpath_resolved(trainer)):
                self._save_last(trainer)

    # -- saving --------------------------------------------------------------------------------------------------
    def on_exception(self, trainer, pl_module, exception):
        """save_on_exception=True: an exception that ends fit saves a checkpoint under the filename's name (not a
        top-k entry) and last (when save_last), as Lightning; not during the sanity check, nor when this step is
        saved already. On several processes every rank must reach this (an error raised on all of them). Then, as a
        run that raised gets no teardown hooks (Lightning's rule), the write in flight is waited for here (the run's
        error is the one raised)."""
        if self.save_on_exception and not trainer.sanity_checking and self._last_saved_step != trainer.global_step:
            self._save(trainer, exception=exception)
        if self._pending is not None:
            try:
                self._finish_pending(trainer)
            except Exception as err:
                print(f"[tasktrain] ModelCheckpoint: {err}", file=sys.stderr, flush=True)

    def _save(self, trainer, exception=None, by_step=False):
        """Save a top-k candidate (when it is one) and `last` (when asked). Called on every rank. With `exception`
        (save_on_exception), the checkpoint is written whatever its score and is not a top-k entry.

        Writes, as in Lightning: the top-k file, then `last` (save_last=True: a second full write; "link": a
        symbolic link to the newest file written). At an epoch's end `last` is written only when a top-k file was
        (or with "link"); a save of the step schedule (every_n_train_steps, train_time_interval) always writes it."""
        if trainer.fast_dev_run:  # a debugging run writes no checkpoints (Lightning's rule)
            return
        # issue 38, first of all: a non-finite state is never written (no file, no top-k, best or last change,
        # nothing evicted; inside fit the trainer raises instead, except while an exception is being handled)
        if not trainer.may_save_checkpoint(self.dirpath_resolved(trainer)):
            return
        if exception is not None:
            return self._save_on_exception(trainer, exception)
        if self.async_save:
            return self._save_async(trainer)
        self._last_saved_step = trainer.global_step
        monitor_candidates = self._monitor_candidates(trainer)
        self._topk_written = False  # set by _save_topk_checkpoint when it writes
        self._save_topk_checkpoint(trainer, monitor_candidates)
        saved_path = self._last_checkpoint_saved if self._topk_written else None
        if saved_path is not None or by_step or (self.save_last == "link" and self._last_checkpoint_saved):
            self._save_last_checkpoint(trainer, monitor_candidates)

    def _save_topk_checkpoint(self, trainer, monitor_candidates):
        """Lightning's override point: save a top-k candidate when it is one (every rank calls it), through
        Lightning's two narrower override points, one for a monitored metric and one without a monitor."""
        if self.save_top_k == 0:
            return
        if self.monitor is not None:
            self._save_monitor_checkpoint(trainer, monitor_candidates)
        else:
            self._save_none_monitor_checkpoint(trainer, monitor_candidates)

    def _save_monitor_checkpoint(self, trainer, monitor_candidates):
        """Lightning's override point: the top-k save of a monitored metric, scored and named from
        `monitor_candidates`."""
        self._save_scored(trainer, monitor_candidates)

    def _save_none_monitor_checkpoint(self, trainer, monitor_candidates):
        """Lightning's override point: the save without a monitor (the newest file is the best), named from
        `monitor_candidates`."""
        self._save_scored(trainer, monitor_candidates)

    def _save_scored(self, trainer, monitor_candidates):
        candidate = self._candidate(trainer, monitor_candidates)
        if candidate is None:
            return
        strategy = trainer.strategy
        # Rank 0's score and name for every rank: the keep/delete decision must be the same everywhere.
        score, path = _broadcast_candidate(strategy, candidate)
        if self._is_top_k(trainer, score):
            k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
            # Book-keep first so the file holds its own entry; delete the evicted files only once it is on disk.
            evicted = self._insert(path, score, trainer.global_step)
            if self.verbose and score is not None and trainer.is_global_zero:
                print(f"Epoch {trainer.current_epoch:d}, global step {trainer.global_step:d}: {self.monitor!r} "
                      f"reached {score:0.5f} (best {float(self.best_model_score):0.5f}), saving model to "
                      f"{path!r} as top {k}", flush=True)
            self._save_checkpoint(trainer, path)
            self._topk_written = True
            for old in evicted:
                if self._should_remove_checkpoint(trainer, old, path):
                    strategy.remove_checkpoint(old)
        elif self.verbose and trainer.is_global_zero:
            print(f"Epoch {trainer.current_epoch:d}, global step {trainer.global_step:d}: {self.monitor!r} was "
                  f"not in top {self.save_top_k}", flush=True)

    def _save_last_checkpoint(self, trainer, monitor_candidates):
        """Lightning's override point: write (or link) `last` when save_last is set, a CHECKPOINT_NAME_LAST with
        fields ("{epoch}-last") filled from `monitor_candidates` (a subclass may pass its own)."""
        if self.save_last:
            self._save_last(trainer, metrics=monitor_candidates)

    @property
    def _last_global_step_saved(self):
        """Lightning's attribute: the global step of the latest save (0 before any)."""
        return max(self._last_saved_step, 0)

    def _save_last(self, trainer, saved_path=None, metrics=None):
        """`last`: a full write (save_last=True), or a link to the newest file written (save_last="link", once this
        callback has written one and save_top_k != 0)."""
        strategy = trainer.strategy
        last = self._last_path(trainer, metrics)
        self._drop_previous_last(trainer, last, saved_path)
        self.last_model_path = last  # before the write: the file holds it (Lightning's rule)
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, last)
        else:
            self._save_checkpoint(trainer, last)

    def _save_checkpoint(self, trainer, filepath):
        """Lightning's override point: every file this callback writes (top-k, last, on exception) goes through
        here; every rank calls it."""
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:  # after each file written, as Lightning (a link is no write)
            for logger in trainer.loggers:  # W&B and MLflow upload checkpoints from here (log_model)
                logger.after_save_checkpoint(self)

    @staticmethod
    def _link_checkpoint(trainer, filepath, linkpath):
        """save_last="link": rank 0 makes `linkpath` a relative symbolic link to `filepath` (a copy where the file
        system has no links); every rank waits for it."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            _symlink(filepath, linkpath)
        trainer.strategy.barrier("link_checkpoint")

    def _save_on_exception(self, trainer, exception):
        if self._pending is not None:
            self._finish_pending(trainer)  # one write at a time
        self._last_saved_step = trainer.global_step
        metrics = self._monitor_candidates(trainer)
        self.dirpath_resolved(trainer)  # (sets dirpath when it was None)
        path = trainer.strategy.broadcast(self.format_checkpoint_name(metrics))
        self._save_checkpoint(trainer, path)
        if self.save_last:
            self._save_last(trainer, path)
        if trainer.is_global_zero:
            # Lightning's text to the character: its source continues the line with a backslash inside the string,
            # so the message holds that line's indentation (12 spaces) after "message: "
            print(f"An {type(exception).__name__} was raised with message: {' ' * 12}{exception}, saved checkpoint to "
                  f"{path}", flush=True)

    # -- async_save ----------------------------------------------------------------------------------------------
    # The rules (docs/checkpointing.md): the step waits only while the state is staged into CPU memory; a save that
    # finds the previous one still in flight waits for it first (one write at a time, one staged copy per rank);
    # a checkpoint counts (top-k, best_model_path, last_model_path, the "last" pointer, last.ckpt) only once every
    # rank's files of it are complete and flushed, and the files it evicts from the top k are deleted only then.
    def _save_async(self, trainer):
        strategy = trainer.strategy
        self._finish_pending(trainer)
        self._last_saved_step = step = trainer.global_step
        epoch = trainer.current_epoch
        candidate = self._candidate(trainer)
        directory = self.dirpath_resolved(trainer)
        committed = self._bookkeeping()
        target, evicted = None, []
        if candidate is not None and self.save_top_k != 0:
            score, path = _broadcast_candidate(strategy, candidate)
            if self._is_top_k(trainer, score):
                evicted = [old for old in self._insert(path, score, step)
                           if self._should_remove_checkpoint(trainer, old, path)]
                target = path
        last = self._last_path(trainer) if self.save_last else None
        if target is None and last is None:
            return
        if last is not None:
            self.last_model_path = last
        # save_last="link": `last` is a symbolic link to the newest file written, as without async_save; with no new
        # file this time it points at the previous one, which is complete (the save in flight was waited for above)
        link = self.save_last == "link" and self.save_top_k != 0
        if link and target is None and self._last_checkpoint_saved:
            return self._link_checkpoint(trainer, self._last_checkpoint_saved, last)
        root, resumable = trainer.default_root_dir, not self.save_weights_only
        with trainer.long_event("save_checkpoint"):  # staging may take long: not a stall (issue 19)
            # the checkpoint holds this callback's state with itself counted: it is complete when anyone loads it
            checkpoint = trainer.dump_checkpoint(self.save_weights_only)
            done = self._bookkeeping()
            self._set_bookkeeping(committed)

            def on_complete():  # rank 0, the writer's thread, once every rank's files are in place
                written = target or last
                if resumable:  # the restart record first, to the file of its own name (a swap of last.ckpt is
                    record_for_restarts(root, written, step, epoch)  # two renames)
                if target is not None and last is not None and link:
                    _symlink(target, last)
                elif target is not None and last is not None:
                    link_tree(target, last) if os.path.isdir(target) else atomic_link(target, last)
                for old in evicted:
                    remove_path(old)

            writer = strategy.save_checkpoint_async(checkpoint, target or last, on_complete=on_complete)
        self._pending = (writer, done)
        self._last_checkpoint_saved = target or last

    def _finish_pending(self, trainer):
        """Wait for the save in flight (if any); once it is complete, its bookkeeping counts."""
        if self._pending is None:
            return
        writer, done = self._pending
        self._pending = None
        writer.wait()
        self._set_bookkeeping(done)
        if trainer.is_global_zero:
            for logger in trainer.loggers:  # W&B and MLflow upload checkpoints from here (log_model)
                logger.after_save_checkpoint(self)

    def _bookkeeping(self):
        return (dict(self.best_k_models), self.best_model_path, self.best_model_score, self.last_model_path,
                self.current_score, self.kth_best_model_path, self.kth_value)

    def _set_bookkeeping(self, values):
        (best_k, self.best_model_path, self.best_model_score, self.last_model_path, self.current_score,
         self.kth_best_model_path, self.kth_value) = values
        self.best_k_models = dict(best_k)

    def teardown(self, trainer, pl_module, stage):
        """The end of fit, or the requeue signal's save-and-stop: the write in flight is waited for (the process ends
        after it)."""
        if self._pending is not None:
            self._finish_pending(trainer)

    def _candidate(self, trainer, metrics=None):
        """(score, path) of a top-k candidate, or None when there is nothing new to score."""
        metrics = self._monitor_candidates(trainer) if metrics is None else metrics
        score = None
        if self.monitor is not None:
            value = metrics.get(self.monitor)
            if value is None:
                if trainer.enable_validation and not self._validations_seen:
                    return None  # a validation metric, and this fit has not validated yet
                raise KeyError(
                    f"ModelCheckpoint(monitor={self.monitor!r}): no such metric was logged. Logged metrics: "
                    f"{sorted(trainer.callback_metrics) or 'none'}. Log it with self.log({self.monitor!r}, ...) or "
                    "change monitor."
                )
            # the logged tensor itself (on the CPU), as Lightning keeps it in best_k_models and best_model_score
            score = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.tensor(value)
            if torch.isnan(score):
                score = torch.tensor(math.inf if self.mode == "min" else -math.inf)  # NaN is never the best
        # the name may be taken over only from the file this save replaces (Lightning's del_filepath): the previous
        # newest without a monitor, the worst of a full top k with one; any other file's name gets "-vN" (a fixed
        # filename with save_top_k=-1 keeps every file)
        full = self.best_k_models and self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k
        own = (self.best_model_path,) if self.monitor is None else (self._worst(),) if full else ()
        return score, self._free_path(trainer, metrics, None, own)

    def _last_path(self, trainer, metrics=None):
        metrics = self._monitor_candidates(trainer) if metrics is None else metrics
        path = self._free_path(trainer, metrics, self.CHECKPOINT_NAME_LAST, (self.last_model_path,))
        return trainer.strategy.broadcast(path)

    def _free_path(self, trainer, metrics, filename, own):
        """format_checkpoint_name's path; with enable_version_counter, a name another file holds already (not one of
        `own`, this callback's) gets Lightning's "-v1", "-v2", ... (rank 0's file system decides: the caller
        broadcasts)."""
        self.dirpath_resolved(trainer)  # (sets dirpath when it was None)
        path = self.format_checkpoint_name(metrics, filename)
        version = self.STARTING_VERSION
        while self._enable_version_counter and self.file_exists(path, trainer) and path not in own:
            path = self.format_checkpoint_name(metrics, filename, ver=version)
            version += 1
        return path

    def _drop_previous_last(self, trainer, last, saved_path):
        """A CHECKPOINT_NAME_LAST with fields ("{epoch}-last") names each last checkpoint anew: the previous one
        goes, unless it is also a top-k file (Lightning's rule)."""
        previous = self.last_model_path
        if previous and previous != last and previous not in (saved_path, self.best_model_path) \
                and previous not in self.best_k_models \
                and os.path.dirname(previous) == os.path.dirname(last):
            if self._should_remove_checkpoint(trainer, previous, last):
                trainer.strategy.remove_checkpoint(previous)

    def _should_remove_checkpoint(self, trainer, previous, current):
        """Lightning's rule: a file that falls out of the top k (or an old `last`) is deleted unless it is the new
        file itself, the checkpoint this fit resumed from, or outside this callback's folder."""
        if previous == current:
            return False
        if trainer.ckpt_path is not None and os.path.abspath(previous) == os.path.abspath(trainer.ckpt_path):
            return False
        directory = os.path.abspath(self.dirpath_resolved(trainer))
        return os.path.abspath(previous).startswith(directory + os.sep)

    def _monitor_candidates(self, trainer):
        """The logged metrics, with "epoch" and "step" always there (monitorable and usable in file names), as in
        Lightning: a logged "epoch"/"step" is kept (as an int), otherwise the trainer's counters."""
        metrics = dict(trainer.callback_metrics)
        for name, counter in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
            value = metrics.get(name)
            metrics[name] = value.int() if isinstance(value, torch.Tensor) else torch.tensor(counter)
        return metrics

    def _worst_value(self):
        return torch.tensor(math.inf if self.mode == "min" else -math.inf)

    def _is_top_k(self, trainer, score):
        # without a monitor every save is kept (the newest is the best); with one, check_monitor_top_k decides
        return score is None or bool(self.check_monitor_top_k(trainer, score))

    def check_monitor_top_k(self, trainer, current=None):
        """Lightning's: whether a checkpoint scoring `current` (the monitored value) enters the top k: never for None,
        always with save_top_k=-1 or fewer than k kept, else when it beats the k-th best (mode's direction), decided
        by every rank together (strategy.reduce_boolean_decision). Every rank calls it; a subclass may override it
        (the save of a monitored metric asks it)."""
        if current is None:
            return False
        if self.save_top_k == -1:
            return True
        if len(self.best_k_models) < self.save_top_k:
            return True
        monitor_op = {"min": torch.lt, "max": torch.gt}[self.mode]
        kth = self.kth_best_model_path if self.kth_best_model_path in self.best_k_models else self._worst()
        better = monitor_op(current, self.best_k_models[kth])
        return trainer.strategy.reduce_boolean_decision(bool(better))

    def file_exists(self, filepath, trainer):
        """Lightning's: whether `filepath` exists on rank 0's file system, the same answer on every rank (every rank
        calls it). A checkpoint name taken by another file gets "-v1", "-v2", ... while this says it exists."""
        exists = os.path.lexists(filepath) if trainer.is_global_zero else False  # (a dangling `last` link counts)
        return trainer.strategy.reduce_boolean_decision(exists, all=False)

    def _worst(self):
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.get)

    def _insert(self, path, score, step):
        """Add `path` to the top k; returns the paths that fell out of it."""
        evicted = []
        if score is None and self.save_top_k in (1, -1):
            # No monitor (Lightning): best_model_path is the newest file; save_top_k=1 deletes the one before, and
            # best_k_models stays empty.
            previous, self.best_model_path = self.best_model_path, path
            if self.save_top_k == 1 and previous and previous != path:
                evicted.append(previous)
            return evicted
        if score is None:
            # No monitor (save_top_k=-1; k > 1 is refused at construction, as Lightning's): every file is kept.
            self.best_k_models.pop(path, None)
            self.best_k_models[path] = float(step)  # dicts keep insertion order: the first key is the oldest
            while self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
                oldest = next(iter(self.best_k_models))
                del self.best_k_models[oldest]
                evicted.append(oldest)
            self.best_model_path = path
            return evicted
        self.best_k_models[path] = score
        self.current_score = score
        while self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
            worst = self._worst()
            del self.best_k_models[worst]
            evicted.append(worst)
        if self.save_top_k == -1 or len(self.best_k_models) == self.save_top_k:
            self.kth_best_model_path = self._worst()
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=self.best_k_models.get)
        self.best_model_score = self.best_k_models[self.best_model_path]
        return evicted

    def _format_checkpoint_name(self, filename, metrics, prefix=None, auto_insert_metric_name=True):
        """Lightning's: the name (no folder, no extension) from a template, e.g. "{epoch}-{val_loss:.3f}" ->
        "epoch=2-val_loss=0.123". A field that is not in `metrics` is written as 0 (with a warning)."""
        template = filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"

        def fill(match):
            name, spec = match.group(1), (match.group(2) or ":")[1:]
            if name not in metrics:
                warnings.warn(f"ModelCheckpoint: the file name {template!r} uses {{{name}}}, which was not logged: it "
                              f"is written as 0. Log it with self.log({name!r}, ...) before this save, or change "
                              "filename.", stacklevel=3)
                metrics[name] = torch.tensor(0)
            text = format(metrics[name], spec)
            return name + self.CHECKPOINT_EQUALS_CHAR + text if auto_insert_metric_name else text

        name = _FIELD.sub(fill, template)
        return name if prefix is None else self.CHECKPOINT_JOIN_CHAR.join([prefix, name])

    def format_checkpoint_name(self, metrics, filename=None, ver=None, prefix=None):
        """Lightning's: the checkpoint's path, <dirpath>/<name>[-v<ver>]<FILE_EXTENSION> (no folder while dirpath is
        unset), the name from `filename` (default: this callback's) filled from `metrics`."""
        name = self._format_checkpoint_name(filename or self.filename, metrics, prefix=prefix,
                                            auto_insert_metric_name=self.auto_insert_metric_name)
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _find_last_checkpoints(self, trainer):
        """The `last` files (CHECKPOINT_NAME_LAST, optionally "-<n>", with FILE_EXTENSION) in the checkpoint folder."""
        directory = self.dirpath or _default_dirpath(trainer)
        pattern = re.compile(rf"^{self.CHECKPOINT_NAME_LAST}(-(\d+))?")
        if not os.path.isdir(directory):
            return set()
        return {os.path.normpath(os.path.join(directory, f)) for f in os.listdir(directory)
                if os.path.splitext(f)[1] == self.FILE_EXTENSION and pattern.match(os.path.splitext(f)[0])}

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self):
        # Lightning's keys, in its order, the scores as (float32) tensors as Lightning stores them: a checkpoint
        # moves between the two
        def number(value):
            return None if value is None else torch.tensor(float(value))

        return {
            "monitor": self.monitor,
            "best_model_score": number(self.best_model_score),
            "best_model_path": self.best_model_path,
            "current_score": number(self.current_score),
            "dirpath": self._resolved_dir or self.dirpath,
            "best_k_models": {path: number(score) for path, score in self.best_k_models.items()},
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": number(self.kth_value),
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state_dict):
        # a score is a tensor (Lightning, tasktrain now) or a float (tasktrain before): tensors inside, as Lightning's
        self.best_k_models = {path: score if isinstance(score, torch.Tensor) else torch.tensor(float(score))
                              for path, score in state_dict.get("best_k_models", {}).items()}
        self.best_model_path = state_dict.get("best_model_path", "")
        score = state_dict.get("best_model_score")
        self.best_model_score = None if score is None else torch.tensor(float(score))
        self.last_model_path = state_dict.get("last_model_path", "")
        self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
        value = state_dict.get("current_score")
        self.current_score = None if value is None else torch.tensor(float(value))
        value = state_dict.get("kth_value")
        self.kth_value = self._worst_value() if value is None else torch.tensor(float(value))
        self._restored = state_dict
        directory = self._resolved_dir or self.dirpath  # (fit's setup has resolved it by now)
        if directory:
            self._restored = None
            self._forget_other_folder(state_dict.get("dirpath"), directory)

    def on_fit_start(self, trainer, pl_module):
        self._adopt_restored(trainer)

    def _adopt_restored(self, trainer):
        """After a resume, the restored top-k and last are this run's only if this run saves to the folder they are
        in (as in Lightning): resuming another run's checkpoint, or with another dirpath, default_root_dir or logger
        version, starts a top-k of its own in this run's folder, and the other folder's files are never deleted.
        best_model_path is kept (Lightning's rule) until this run saves a better one."""
        state, self._restored = self._restored, None
        if state:
            self._forget_other_folder(state.get("dirpath"), self.dirpath_resolved(trainer))

    def _forget_other_folder(self, saved_dir, directory):
        """A restored state from another folder: only best_model_path is kept, with Lightning's warning."""
        if not saved_dir or os.path.abspath(saved_dir) == os.path.abspath(directory):
            return
        self.best_k_models, self.best_model_score, self.last_model_path = {}, None, ""
        self.current_score, self.kth_best_model_path, self.kth_value = None, "", self._worst_value()
        self._last_saved_step = -1
        warnings.warn(f"The dirpath has changed from {saved_dir!r} to {directory!r}, therefore `best_model_score`, "
                      "`kth_best_model_path`, `kth_value`, `last_model_path` and `best_k_models` won't be reloaded. "
                      f"Only `best_model_path` will be reloaded (this run starts its own top-k in {directory}; the "
                      f"files in {saved_dir} are left as they are).", stacklevel=3)


def _broadcast_candidate(strategy, candidate):
    """Rank 0's (score, path) on every rank, the score sent as plain numbers and made a tensor again here: a tensor
    sent in the broadcast's pickle goes through torch.save on rank 0 (and torch.load on the others) at every save,
    which Lightning's ModelCheckpoint, broadcasting only names, does not do (Lightning's
    test_model_checkpoint_no_extraneous_invocations counts rank 0's torch.save calls: one per checkpoint)."""
    score, path = candidate
    sent, path = strategy.broadcast((None if score is None else (score.tolist(), score.dtype), path))
    return (None if sent is None else torch.tensor(sent[0], dtype=sent[1])), path


def _is_local(path):
    path = os.fspath(path)
    return "://" not in path or path.startswith("file://")


def _default_dirpath(trainer):
    """Where checkpoints go without a dirpath: the first logger's log_dir/checkpoints; for a logger without a
    log_dir (W&B, MLflow), save_dir/name/version/checkpoints (a run's folder of its own, as in Lightning); with no
    logger, default_root_dir/checkpoints."""
    logger = trainer.logger
    if logger is None:
        return os.path.join(trainer.default_root_dir, "checkpoints")
    if not isinstance(logger, Logger):  # another logger object (a class of the user's): Lightning's rule exactly
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        return os.path.join(save_dir, str(logger.name), version, "checkpoints")
    if logger.log_dir:
        return os.path.join(logger.log_dir, "checkpoints")
    name, version = logger.name, logger.version
    if name is None and version is None:
        return os.path.join(trainer.default_root_dir, "checkpoints")
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(name), version, "checkpoints")


def _symlink(target, link):
    """`link` a relative symbolic link to `target` (a copy where the file system has no links), replacing it."""
    if os.path.islink(link) or os.path.isfile(link):
        os.remove(link)
    elif os.path.isdir(link):
        remove_path(link)
    try:
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)
    except OSError:
        link_tree(target, link) if os.path.isdir(target) else atomic_link(target, link)
