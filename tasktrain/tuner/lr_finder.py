"""The learning-rate finder: a short fit with a growing rate, the smoothed loss at each step, a suggestion."""
import math

import torch

from tasktrain.callbacks.base import Callback
from tasktrain.trainer.state import TrainState


class LRFinder:
    """What lr_find found: `results` {"lr": [...], "loss": [...]} (the smoothed loss after each step's rate) and
    `suggestion()`. There is no plot(): draw results["lr"] against results["loss"] (log x) with any library."""

    def __init__(self, mode, lr_min, lr_max, num_training, lrs, losses):
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
            print("[tasktrain] Failed to compute suggestion for learning rate because there are not enough points. "
                  "Increase the loop iteration limits or the size of your dataset/dataloader.", flush=True)
            self._optimal_idx = None
            return None
        index = int(torch.argmin(torch.gradient(losses, spacing=[lrs])[0]))
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[index])
        return self.results["lr"][self._optimal_idx]

    def plot(self, *args, **kwargs):
        raise NotImplementedError("LRFinder has no plot(): plot results['lr'] (log scale) against results['loss'] "
                                  "with the plotting library of your choice.")


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

    def rate(self, step):
        if step == 0:
            return self.min_lr
        r = (step + 1) / self.num_training
        if self.mode == "exponential":
            return self.min_lr * (self.max_lr / self.min_lr) ** r
        return self.min_lr + r * (self.max_lr - self.min_lr)

    def _closes_window(self, trainer, batch_idx):
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_before_optimizer_step(self, trainer, module, optimizer):
        lr = self.rate(trainer.global_step)
        for group in optimizer.param_groups:
            group["lr"] = lr

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self._closes_window(trainer, batch_idx):
            self.lrs.append(self.rate(trainer.global_step))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not self._closes_window(trainer, batch_idx):
            return
        if not outputs:  # training_step returned None: a NaN point (left out of the suggestion), as Lightning's
            self.losses.append(float("nan"))
            return
        loss = outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]
        value = float(loss)
        step = trainer.global_step
        self._avg = self.beta * self._avg + (1 - self.beta) * value
        smoothed = self._avg / (1 - self.beta ** (step + 1))
        if self.early_stop_threshold is not None and step > 1 and smoothed > self.early_stop_threshold * self._best:
            trainer.should_stop = True  # diverging: the rest of the sweep would tell nothing
        trainer.should_stop = bool(trainer.strategy.broadcast(trainer.should_stop))
        if smoothed < self._best or step == 1:
            self._best = smoothed
        self.losses.append(smoothed)


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
    if not 0 < min_lr < max_lr:
        raise ValueError(f"lr_find(min_lr={min_lr}, max_lr={max_lr}): use 0 < min_lr < max_lr.")
    if not isinstance(num_training, int) or num_training < 2:
        raise ValueError(f"lr_find(num_training={num_training!r}): use at least 2 steps.")
    sweep = _Sweep(min_lr, max_lr, num_training, mode, early_stop_threshold)
    trainer.callbacks = [sweep]
    trainer.max_steps = num_training  # (max_epochs stays the Trainer's: Lightning's; a short loader ends it)
    trainer.limit_val_batches = 0  # the sweep reads the training loss only
    start_counters_over(trainer)
    trainer.fit(model, **loaders)
    return LRFinder(mode, min_lr, max_lr, num_training, sweep.lrs, sweep.losses)
