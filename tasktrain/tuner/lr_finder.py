"""The learning-rate finder: a short fit with a growing rate, the smoothed loss at each step, a suggestion.

What it says is Lightning's, on its channels: the sweep's "Finding best initial lr" tqdm bar (stderr, every rank,
also with the Trainer's progress bar off), and on this module's logger ("tasktrain.tuner.lr_finder", under the
"tasktrain" logger as Lightning's is under "lightning.pytorch") "LR finder stopped early after N steps due to
diverging loss." (INFO), "Failed to compute suggestion ..." (ERROR) and "Learning rate set to ..." (INFO)."""
import importlib.util
import logging
import math

import torch

log = logging.getLogger(__name__)

from tasktrain.callbacks.base import Callback
from tasktrain.trainer.state import TrainState


class LRFinder:
    """What lr_find found: `results` {"lr": [...], "loss": [...]} (the smoothed loss after each step's rate),
    `suggestion()` and `plot()` (matplotlib, imported only there)."""

    def __init__(self, mode, lr_min, lr_max, num_training, lrs=(), losses=()):
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results = {"lr": list(lrs), "loss": list(losses)}
        self._optimal_idx = None

    def suggestion(self, skip_begin=10, skip_end=1):
        """Lightning's rule: the rate where d(loss)/d(lr) (torch.gradient with the rates as spacing) is lowest,
        over results[skip_begin:-skip_end] (so skip_end=0 leaves nothing, as Lightning's slice) and finite losses
        only; None when fewer than two points remain."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end])
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error("Failed to compute suggestion for learning rate because there are not enough points. Increase "
                      "the loop iteration limits or the size of your dataset/dataloader.")
            self._optimal_idx = None
            return None
        index = int(torch.argmin(torch.gradient(losses, spacing=[lrs])[0]))
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[index])
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest=False, show=False, ax=None):
        """Lightning's plot: the smoothed loss against the rate (a log x axis in "exponential" mode) on `ax`, else on
        a new figure; suggest=True marks the suggestion with a red dot (as Lightning's, not when it is the first
        point or there is none); show=True calls plt.show(). Returns the figure. matplotlib is an optional
        dependency, imported here only."""
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:  # (Lightning's exception and words)
            from tasktrain.exceptions import MisconfigurationException

            raise MisconfigurationException("To use the `plot` method, you must have Matplotlib installed. Install "
                                            "it by running `pip install -U matplotlib`.")
        import matplotlib.pyplot as plt

        lrs, losses = self.results["lr"], self.results["loss"]
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            self.suggestion()
            if self._optimal_idx:  # (Lightning's test: index 0 draws no marker either)
                ax.plot(lrs[self._optimal_idx], losses[self._optimal_idx], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


_LRFinder = LRFinder  # (Lightning's name for it, at Lightning's module path: scripts and tests that build one)


class _Sweep(Callback):
    """Lightning's sweep, step for step: step k runs at min_lr (k=0) or at the rate (k+1)/num_training of the way
    from min_lr to max_lr (its scheduler's count); a point (rate, smoothed loss) is kept at each batch that closes an
    accumulation window (batch_idx + 1 divisible by accumulate_grad_batches), from that batch's loss alone (already
    divided by the window, as Lightning's), with the bias correction counted from global_step after the step."""

    def __init__(self, min_lr, max_lr, num_training, mode, early_stop_threshold, beta=0.98):
        self.min_lr, self.max_lr, self.num_training, self.mode = min_lr, max_lr, num_training, mode
        self.early_stop_threshold, self.beta = early_stop_threshold, beta
        self.lrs, self.losses = [], []
        self._avg, self._best = 0.0, 0.0
        self.progress_bar = None

    def rate(self, step):
        if step == 0:
            return self.min_lr
        r = (step + 1) / self.num_training
        if self.mode == "exponential":
            return self.min_lr * (self.max_lr / self.min_lr) ** r
        return self.min_lr + r * (self.max_lr - self.min_lr)

    def on_train_start(self, trainer, pl_module):
        # (Lightning's check and words; several optimizers reach here under manual optimisation only: automatic
        # optimisation refuses them at set-up)
        if len(trainer.optimizers) != 1:
            from tasktrain.exceptions import MisconfigurationException

            raise MisconfigurationException(f"`model.configure_optimizers()` returned {len(trainer.optimizers)}, but "
                                            "learning rate finder only works with single optimizer")
        # Lightning's _exchange_scheduler: the optimizer starts at min_lr and the sweep's scheduler, stepped after
        # each optimizer step (through the module's lr_scheduler_step, as any step scheduler), replaces the fit's
        # (the trial's list: the caller's is put back after)
        from tasktrain.trainer.optim import SchedulerConfig

        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.min_lr
        trainer.lr_scheduler_configs[:] = [SchedulerConfig(_SweepLR(optimizer, self), interval="step")]

    def _closes_window(self, trainer, batch_idx):
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._closes_window(trainer, batch_idx):
            if self.progress_bar is None:  # Lightning's bar (its tqdm.auto where ipywidgets is installed)
                self.progress_bar = _tqdm()(desc="Finding best initial lr", total=self.num_training)
            self.lrs.append(self.rate(trainer.global_step))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self._closes_window(trainer, batch_idx):
            return
        if not outputs:  # training_step returned None: a NaN point (left out of the suggestion), as Lightning's
            self.losses.append(float("nan"))
            return
        self.progress_bar.update()
        loss = outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]
        value = float(loss)
        step = trainer.global_step
        self._avg = self.beta * self._avg + (1 - self.beta) * value
        smoothed = self._avg / (1 - self.beta ** (step + 1))
        if self.early_stop_threshold is not None and step > 1 and smoothed > self.early_stop_threshold * self._best:
            trainer.should_stop = True  # diverging: the rest of the sweep would tell nothing
            self.progress_bar.close()
        trainer.should_stop = bool(trainer.strategy.broadcast(trainer.should_stop))
        if smoothed < self._best or step == 1:
            self._best = smoothed
        self.losses.append(smoothed)


class _SweepLR(torch.optim.lr_scheduler.LRScheduler):
    """The sweep's rates as a scheduler (Lightning's _ExponentialLR / _LinearLR): after k steps, sweep.rate(k)."""

    def __init__(self, optimizer, sweep):
        self.sweep = sweep
        super().__init__(optimizer)

    def get_lr(self):
        return [self.sweep.rate(self.last_epoch) for _ in self.optimizer.param_groups]


def _tqdm():
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    return tqdm


def lr_attr_name(model, attr_name=""):
    """The attribute lr_find sets: attr_name if given, else "lr" or "learning_rate", on the module or in hparams."""
    names = [attr_name] if attr_name else ["lr", "learning_rate"]
    for name in names:
        if hasattr(model, name) or name in getattr(model, "hparams", {}):
            return name
    if attr_name:  # (Lightning's words)
        raise AttributeError(f"The attribute name for the learning rate was set to {attr_name}, but could not find "
                             "this as a field in `model` or `model.hparams`.")
    raise AttributeError("When using the learning rate finder, either `model` or `model.hparams` should have one of "
                         "these fields: ('lr', 'learning_rate'). If your model has a different name for the learning "
                         "rate, set it with `.lr_find(attr_name=...)`. (tasktrain: it has neither `lr` nor "
                         "`learning_rate`; add one and use it in configure_optimizers, or pass update_attr=False.)")


def set_attr(model, name, value):
    """Set `name` where the module keeps it: the attribute, the hyper-parameter, or both."""
    if name in getattr(model, "hparams", {}):
        model.hparams[name] = value
    if hasattr(model, name) or name not in getattr(model, "hparams", {}):
        setattr(model, name, value)


def start_counters_over(trainer):
    """A trial fit starts at step 0 of epoch 0: a fit of a used Trainer would go on from its counters (put back
    when tuning ends)."""
    trainer.state = TrainState()
    trainer._epoch_cut_short = False


def lr_find(trainer, model, loaders, min_lr, max_lr, num_training, mode, early_stop_threshold):
    """The sweep itself: a short fit of `model` on `trainer` (callbacks, limits and counters replaced; the caller,
    tuning.find_lr, puts them back and sets the suggestion where the module keeps its rate)."""
    if mode not in ("exponential", "linear"):
        raise ValueError("`mode` should be either of ('linear', 'exponential')")
    # (Lightning sweeps from min_lr to max_lr whichever is larger: min_lr > max_lr sweeps downwards, as there)
    if mode == "exponential" and not (min_lr > 0 and max_lr > 0):
        raise ValueError(f"lr_find(min_lr={min_lr}, max_lr={max_lr}): the exponential sweep needs rates above 0 "
                         "(or use mode='linear').")
    if not (min_lr >= 0 and max_lr >= 0):
        raise ValueError(f"lr_find(min_lr={min_lr}, max_lr={max_lr}): learning rates cannot be negative.")
    if not isinstance(num_training, int) or num_training < 1:
        raise ValueError(f"lr_find(num_training={num_training!r}): use at least 1 step.")
    sweep = _Sweep(min_lr, max_lr, num_training, mode, early_stop_threshold)
    trainer.callbacks = [sweep] + trainer.callbacks  # (what tuning._tuning kept: the Trainer's gradient clipping)
    trainer.max_steps = num_training  # (max_epochs stays the Trainer's: Lightning's; a short loader ends it)
    # Lightning's: validation runs during the sweep where the fit's own would (val_check_interval and
    # check_val_every_n_epoch as set), on at most num_training batches; no sanity check (tuning._tuning)
    trainer.limit_val_batches = num_training
    # a sweep is meant to reach the rates where the loss blows up: a non-finite loss is a point (left out of the
    # suggestion), as in Lightning, not the fit's FloatingPointError (tuning._tuning puts _trial_skips back)
    trainer._trial_skips = tuple(trainer._trial_skips) + ("check_finite_loss",)
    start_counters_over(trainer)
    try:
        trainer.fit(model, **loaders)
        if trainer.global_step != num_training:  # (Lightning's condition and words: also where the data ran out)
            log.info(f"LR finder stopped early after {trainer.global_step} steps due to diverging loss.")
    finally:
        if sweep.progress_bar is not None:  # (Lightning's stays open until collected: the same last line)
            sweep.progress_bar.close()
    finder = LRFinder(mode, min_lr, max_lr, num_training, sweep.lrs, sweep.losses)
    finder._total_batch_idx = trainer.fit_loop.total_batch_idx  # (Lightning's, "for debug purpose")
    # several processes: every rank takes rank 0's points (each rank's loss is its own shard's), so that the
    # suggestion, and the rate set, are the same everywhere (Lightning's broadcast)
    finder.results = trainer.strategy.broadcast(finder.results)
    return finder
