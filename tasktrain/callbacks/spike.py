"""SpikeDetection: stop training with a TrainingSpikeException when the training loss spikes, and write the batches to
skip on a resume to a JSON file, as Lightning's callback does (its arguments, file, exception and state_dict keys).

A spike, checked from batch index `warmup` on: with finite_only=True (the default) a non-finite loss; otherwise a
loss that moved the wrong way from the previous batch's (up for mode="min", down for "max") by at least `atol` and by
at least `rtol` times the running mean of the last `window` finite losses (None: that test passes). Until a loss has
been counted the mean is NaN and nothing but a non-finite loss is a spike. Each rank judges its own loss; if any rank
sees a spike, every rank raises (the decision is reduced over the ranks each batch, after a barrier, as in Lightning).
The current and the previous batch index are added to `bad_batches` (the previous batch may have corrupted the
weights), and global rank 0 writes the whole list to `exclude_batches_path` (default
`<default_root_dir>/skip_batches.json`; a folder gets `skip_batches.json` inside it). With finite_only=False, a
non-finite loss that is not a spike is left out of the mean unless every rank's loss is finite.

The running mean is kept here (a window of sums), not by torchmetrics as in Lightning: Lightning's needs torchmetrics
installed. Lightning saves the window as an empty torchmetrics state and its load_state_dict fails
(`self.running` does not exist); here `state_dict()["running"]` holds the window and a resume continues it.
"""
import json
import math
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Optional, Union

import torch

from tasktrain.callbacks.base import Callback


class TrainingSpikeException(RuntimeError):
    """Exception to be raised with Training Spikes."""

    def __init__(self, batch_idx, *args, **kwargs):
        super().__init__(f"Training spike detected in batch {batch_idx}", *args, **kwargs)


class SpikeDetection(Callback):
    def __init__(
        self,
        mode: Literal["min", "max"] = "min",
        window: int = 10,
        warmup: int = 1,
        atol: Optional[float] = None,
        rtol: Optional[float] = 2.0,
        exclude_batches_path: Optional[Union[str, Path]] = None,
        finite_only: bool = True,
    ):
        self.last_val = 0.0
        self.window = window
        self._sums = deque(maxlen=window)  # per counted loss: (sum of its finite elements, how many)
        self.mode = mode
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.bad_batches = []
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only

    @property
    def running_mean(self):
        """The mean of the last `window` counted losses (NaN before the first)."""
        total, count = sum(s for s, _ in self._sums), sum(c for _, c in self._sums)
        return total / count if count else math.nan

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping):
            loss = outputs["loss"].detach()
        else:
            raise TypeError(f"outputs have to be of type torch.Tensor or Mapping, got {type(outputs).__qualname__}")
        if self.exclude_batches_path is None:
            self.exclude_batches_path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        if not str(self.exclude_batches_path).endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")

        is_spike = bool(batch_idx >= self.warmup and self._is_spike(loss))
        strategy = trainer.strategy
        strategy.barrier()
        # judged per rank, but every rank must stop together: any rank's spike stops all
        if strategy.reduce_boolean_decision(is_spike, all=False):
            self._handle_spike(trainer, batch_idx)
        elif self.finite_only or strategy.reduce_boolean_decision(bool(torch.isfinite(loss).all()), all=True):
            self._update_stats(loss)

    def _is_spike(self, loss):
        running_val = self.running_mean
        if self.finite_only and not bool(torch.isfinite(loss).all()):
            return True
        if self._is_better(loss - self.last_val):
            return False
        return self._check_atol(loss, running_val) and self._check_rtol(loss, running_val)

    def _handle_spike(self, trainer, batch_idx):
        # the current batch may hold bad data; the previous one may have corrupted the weights: both are skipped
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.global_rank == 0:
            os.makedirs(os.path.dirname(os.path.abspath(self.exclude_batches_path)), exist_ok=True)
            with open(self.exclude_batches_path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def _check_atol(self, val_a, val_b):
        return self.atol is None or bool(abs(val_a - val_b) >= abs(self.atol))

    def _check_rtol(self, val_a, val_b):
        return self.rtol is None or bool(abs(val_a - val_b) >= abs(self.rtol * val_b))

    def _is_better(self, diff_val):
        if self.mode == "min":
            return bool((diff_val <= 0.0).all())
        if self.mode == "max":
            return bool((diff_val >= 0).all())
        raise ValueError(f"Invalid mode. Has to be min or max, found {self.mode}")

    def _update_stats(self, val):
        finite = val.detach().float().flatten()
        finite = finite[~torch.isnan(finite)]  # (torchmetrics' MeanMetric, Lightning's, drops NaN elements)
        self._sums.append((float(finite.sum()), finite.numel()))
        self.last_val = val

    def state_dict(self):
        return {
            "last_val": self.last_val.item() if isinstance(self.last_val, torch.Tensor) else self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": list(self.bad_batches),
            "bad_batches_path": None if self.exclude_batches_path is None else str(self.exclude_batches_path),
            "running": {"window": self.window, "sums": [list(s) for s in self._sums]},
            "mean": {},
        }

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.last_val = state_dict.pop("last_val")
        self.mode = state_dict.pop("mode")
        self.warmup = state_dict.pop("warmup")
        self.atol = state_dict.pop("atol")
        self.rtol = state_dict.pop("rtol")
        self.bad_batches = list(state_dict.pop("bad_batches"))
        self.exclude_batches_path = state_dict.pop("bad_batches_path")
        running = state_dict.pop("running", {})
        self._sums = deque((tuple(s) for s in running.get("sums", [])), maxlen=self.window)
