"""ThroughputMonitor: batches, samples, items and FLOPs per second, written to the loggers (Lightning's names).

    ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), length_fn=None, window_size=100, separator="/")

For each stage ("train", "validate", "test", "predict") it writes `<stage>/time` (seconds since the stage began,
validation time excluded from training's), `<stage>/batches`, `<stage>/samples` (and `<stage>/lengths` with a
`length_fn`: items such as tokens), all counted on this device; and once `window_size` batches have been seen,
rates over the last `window_size` batches: `<stage>/device/batches_per_sec`, `.../device/samples_per_sec`,
`.../device/items_per_sec`, and `.../device/flops_per_sec` when the module has a `flops_per_batch` attribute.
With several processes the global rates `<stage>/batches_per_sec`, ... (device rate x world size) are added.

Training values are written at the trainer's log steps (every log_every_n_steps-th optimizer step, after the
step, so its time is included); validation, test and predict values once at the end of each run (Lightning
writes them at every evaluation batch). Rank 0 measures and writes. On CUDA each measurement synchronises
the device first, or the clock would not include the queued work.
"""
import time
import warnings
from collections import deque

import torch

from tasktrain.callbacks.base import Callback


class Throughput:
    """Running counts and windowed rates of one stage (what ThroughputMonitor writes)."""

    def __init__(self, world_size=1, window_size=100, separator="/"):
        if window_size < 2:
            raise ValueError(f"window_size={window_size}: a rate needs at least 2 measurements.")
        self.world_size, self.separator = world_size, separator
        self._time, self._batches, self._samples, self._lengths, self._flops = (
            deque(maxlen=window_size) for _ in range(5))

    def reset(self):
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()

    def update(self, *, time, batches, samples, lengths=None, flops=None):
        """time, batches, samples, lengths: totals so far on this device; flops: this batch's, on this device."""
        self._time.append(time)
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            self._lengths.append(lengths)
        if flops is not None:
            self._flops.append(flops * self.world_size)

    def compute(self):
        sep, world = self.separator, self.world_size
        out = {"time": self._time[-1], "batches": self._batches[-1], "samples": self._samples[-1]}
        if self._lengths:
            out["lengths"] = self._lengths[-1]
        full = len(self._time) == self._time.maxlen
        elapsed = self._time[-1] - self._time[0]
        if not full or elapsed <= 0:
            return out
        rates = {"batches_per_sec": (self._batches[-1] - self._batches[0]) / elapsed,
                 "samples_per_sec": (self._samples[-1] - self._samples[0]) / elapsed}
        if len(self._lengths) == self._lengths.maxlen:
            rates["items_per_sec"] = (self._lengths[-1] - self._lengths[0]) / elapsed
        for name, value in rates.items():
            out[f"device{sep}{name}"] = value
            if world > 1:
                out[name] = value * world
        if len(self._flops) == self._flops.maxlen:
            # the first batch's FLOPs happened before the window's first time stamp
            flops_per_sec = (sum(self._flops) - self._flops[0]) / elapsed
            out[f"device{sep}flops_per_sec"] = flops_per_sec / world
            if world > 1:
                out["flops_per_sec"] = flops_per_sec
        return out


class ThroughputMonitor(Callback):
    def __init__(self, batch_size_fn, length_fn=None, window_size=100, separator="/"):
        if not callable(batch_size_fn):
            raise TypeError("ThroughputMonitor(batch_size_fn=...): give a function from a batch to its sample count.")
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.window_size = window_size
        self.separator = separator
        Throughput(window_size=window_size)  # check the arguments here, where they were written
        self._throughputs = {}
        self._t0 = {}
        self._counts = {}  # stage -> [batches, samples, lengths]
        self._has_flops = None
        self._seen_step = 0

    def setup(self, trainer, module, stage):
        self._throughputs = {}
        self._has_flops = None

    # -- measuring -------------------------------------------------------------------------------------------------
    def _start(self, trainer, stage):
        if stage not in self._throughputs:
            self._throughputs[stage] = Throughput(trainer.world_size, self.window_size, self.separator)
        self._throughputs[stage].reset()
        self._counts[stage] = [0, 0, 0]
        self._t0[stage] = time.perf_counter()

    @torch.inference_mode()
    def _update(self, trainer, module, stage, batch):
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        elapsed = time.perf_counter() - self._t0[stage]
        counts = self._counts[stage]
        counts[0] += 1
        counts[1] += int(self.batch_size_fn(batch))
        if self.length_fn is not None:
            counts[2] += int(self.length_fn(batch))
        if self._has_flops is None:
            self._has_flops = hasattr(module, "flops_per_batch")
            if not self._has_flops:
                warnings.warn(f"ThroughputMonitor: {type(module).__name__} has no `flops_per_batch` attribute, so "
                              "FLOPs per second are not measured. Set self.flops_per_batch to count them.")
        self._throughputs[stage].update(time=elapsed, batches=counts[0], samples=counts[1],
                                        lengths=counts[2] if self.length_fn is not None else None,
                                        flops=module.flops_per_batch if self._has_flops else None)

    def _write(self, trainer, stage):
        metrics = self._throughputs[stage].compute()
        trainer.log_to_loggers({f"{stage}{self.separator}{k}": v for k, v in metrics.items()})

    # -- events (rank 0) -------------------------------------------------------------------------------------------
    def on_train_start(self, trainer, module):
        self._seen_step = trainer.global_step
        if trainer.is_global_zero:
            self._start(trainer, "train")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not trainer.is_global_zero:
            return
        self._update(trainer, module, "train", batch)
        step = trainer.global_step
        stepped, self._seen_step = step != self._seen_step, step
        if stepped and step % trainer.log_every_n_steps == 0:  # after a window's step: its time is included
            self._write(trainer, "train")

    def on_validation_start(self, trainer, module):
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, "validate")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._update(trainer, module, "validate", batch)

    def on_validation_end(self, trainer, module):
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        self._write(trainer, "validate")
        if "train" in self._t0:  # the validation's time does not count as training time
            self._t0["train"] += time.perf_counter() - self._t0["validate"]

    def on_test_start(self, trainer, module):
        if trainer.is_global_zero:
            self._start(trainer, "test")

    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.is_global_zero:
            self._update(trainer, module, "test", batch)

    def on_test_end(self, trainer, module):
        if trainer.is_global_zero:
            self._write(trainer, "test")

    def on_predict_start(self, trainer, module):
        if trainer.is_global_zero:
            self._start(trainer, "predict")

    def on_predict_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.is_global_zero:
            self._update(trainer, module, "predict", batch)

    def on_predict_end(self, trainer, module):
        if trainer.is_global_zero:
            self._write(trainer, "predict")
