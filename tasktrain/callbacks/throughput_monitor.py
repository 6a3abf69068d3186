"""ThroughputMonitor: batches, samples, items and FLOPs per second, MFU, and where a step's time goes.

    ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), length_fn=None, window_size=100, separator="/",
                      peak_flops=None, measure_flops=False, step_split=False)

For each stage ("train", "validate", "test", "predict") it writes `<stage>/time` (seconds since the stage began,
validation time excluded from training's), `<stage>/batches`, `<stage>/samples` (and `<stage>/lengths` with a
`length_fn`: items such as tokens), all counted on this device; and once `window_size` batches have been seen,
rates over the last `window_size` batches: `<stage>/device/batches_per_sec`, `.../device/samples_per_sec`,
`.../device/items_per_sec`, `.../device/flops_per_sec` and `.../device/mfu` (model FLOPs utilisation: the FLOPs
per second over the device's dense peak for the run's precision). With several processes the global rates
`<stage>/batches_per_sec`, ... (device rate x world size) are added.

By default it writes what Lightning's writes, under the same keys. FLOPs per batch: the module's `flops_per_batch`
attribute when it has one (Lightning's way; without one and without `measure_flops=True`, Lightning's warning that
the FLOPs need it, and no FLOPs keys); with `measure_flops=True` they are counted once, on the stage's first batch,
by torch.utils.flop_counter.FlopCounterMode around that batch's forward and backward (training) or its forward
(evaluation): what the model really ran, not a formula. The peak: the `peak_flops` argument (FLOP/s), else the table
PEAK_TFLOPS for the GPU's name and the precision; on a CPU, or a GPU not in the table, MFU is not written unless
`peak_flops` is given.

The step split (training, `step_split=True`; its keys are tasktrain's own): each rank times its batches' phases and
the loggers get, at each log step, the mean seconds per batch since the last one, per rank:
`train/split/rank<R>/data_wait` (from the end of a batch to the start of the next: the loader and the copy to the
device), `forward` (training_step), `backward`, `optimizer` (clipping and the step), `checkpoint` (checkpoint saves
between batches) and `other` (the rest: zero_grad, schedulers, logging, callbacks; validation excluded). In manual
optimisation the loop fires no backward or optimizer events: the whole step is in `other`. On CUDA the device phases
(forward, backward, optimizer) are CUDA events read at the log step, so the split adds no synchronisation per step.

Training values are written at the trainer's log steps (every log_every_n_steps-th optimizer step, after the
step, so its time is included); validation, test and predict values, as Lightning's, after each batch whose number
in that run (from 1, all loaders together) is a multiple of log_every_n_steps, with that number as the step (no
"epoch" key). Rank 0 measures the rates and writes;
the split is gathered from every rank at the log steps. On CUDA each rate measurement synchronises the device first,
or the clock would not include the queued work.
"""
import time
import warnings
from collections import deque
from typing import Any, Callable, Optional

import torch

from tasktrain.callbacks.base import Callback

# Dense (no sparsity) peak tensor throughput in TFLOP/s, from the vendors' data sheets, by the precision of the
# matrix products: "bf16", "fp16" (with fp32 accumulation), "tf32" (fp32 matmuls on tensor cores, as
# torch.set_float32_matmul_precision("high") allows) and "fp32" (plain fp32).
PEAK_TFLOPS = {
    "h200 nvl": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "h200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "h100 nvl": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "h100 pcie": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "h100 sxm": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "a10g": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.5},
    "a10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "l40s": {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    "l4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "v100": {"fp16": 125.0, "fp32": 15.7},  # SXM2; no bf16, no tf32
    "t4": {"fp16": 65.0, "fp32": 8.1},
    "rtx 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "rtx 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
}


def _table_key(device_name):
    """PEAK_TFLOPS's key for a torch.cuda.get_device_name() such as "NVIDIA H100 80GB HBM3", or None."""
    words = device_name.lower().replace("-", " ").split()
    if "h100" in words and "pcie" not in words and "nvl" not in words:
        return "h100 sxm"  # the SXM cards report "H100 80GB HBM3" (or "H100 SXM5 ...")
    for key in PEAK_TFLOPS:  # the more specific first ("h200 nvl" before "h200")
        if all(word in words for word in key.split()):
            return key
    return None


def matmul_precision(precision):
    """The precision of a run's matrix products (PEAK_TFLOPS's keys) for a precision name such as "bf16-mixed"."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("32"):
        # torch.backends.cuda.matmul.allow_tf32 = True shows here as "high" too
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return None  # 64-true: no tensor-core peak


def device_peak_flops(device, precision):
    """The dense peak FLOP/s of `device` (a torch.device or "cuda:0") for `precision` ("bf16-mixed", ...), or None
    when unknown (a CPU, a GPU not in PEAK_TFLOPS, a precision it has no peak for)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    key = _table_key(torch.cuda.get_device_name(device))
    kind = matmul_precision(precision)
    if key is None or kind not in PEAK_TFLOPS[key]:
        return None
    return PEAK_TFLOPS[key][kind] * 1e12


def get_available_flops(device, dtype):
    """Lightning's name: the dense peak FLOP/s of `device` for a compute `dtype` (torch.bfloat16, torch.float16,
    torch.float32, ...) or a precision name ("bf16-mixed"), or None when unknown. ThroughputMonitor looks it up here
    (a test patches it, as Lightning's tests do)."""
    if isinstance(dtype, torch.dtype):
        dtype = {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed", torch.float32: "32-true"}.get(dtype, "64-true")
    return device_peak_flops(device, dtype)


def measure_flops(fn, *args, **kwargs):
    """(FLOPs counted by torch.utils.flop_counter.FlopCounterMode while fn(*args, **kwargs) ran, its result).
    Call it with the forward and the backward inside fn for a training step's FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        result = fn(*args, **kwargs)
    return counter.get_total_flops(), result


class Throughput:
    """Running counts and windowed rates of one stage (what ThroughputMonitor writes). `peak_flops`: the device's
    peak FLOP/s, for MFU (None: no MFU)."""

    def __init__(self, world_size=1, window_size=100, separator="/", peak_flops=None):
        if window_size < 2:
            raise ValueError(f"window_size={window_size}: a rate needs at least 2 measurements.")
        self.world_size, self.separator, self.peak_flops = world_size, separator, peak_flops
        self._time, self._batches, self._samples, self._lengths, self._flops = (
            deque(maxlen=window_size) for _ in range(5))

    def reset(self):
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()

    def update(self, *, time, batches, samples, lengths=None, flops=None):
        """time, batches, samples, lengths: totals so far on this device; flops: this batch's, on this device."""
        # Lightning's checks: batch_size_fn counts samples (at least one a batch), length_fn items (one a sample)
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches}): "
                             "batch_size_fn should return the samples in a batch.")
        if lengths is not None and lengths < samples:
            raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples}): "
                             "length_fn should return the items (e.g. tokens) in a batch, summed over its samples.")
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
            if self.peak_flops:
                out[f"device{sep}mfu"] = flops_per_sec / world / self.peak_flops
        return out


SPLIT_PHASES = ("data_wait", "forward", "backward", "optimizer", "checkpoint", "other")


class ThroughputMonitor(Callback):
    def __init__(self, batch_size_fn: Callable[[Any], int], length_fn: Optional[Callable[[Any], int]] = None,
                 window_size: int = 100, separator: str = "/", peak_flops: Optional[float] = None,
                 measure_flops: bool = False, step_split: bool = False) -> None:
        # (Lightning's signature is (batch_size_fn, length_fn=None, **kwargs), the kwargs going to its Throughput:
        # window_size and separator. measure_flops and step_split add keys Lightning does not write: off unless asked)
        if not callable(batch_size_fn):
            raise TypeError("ThroughputMonitor(batch_size_fn=...): give a function from a batch to its sample count.")
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(f"ThroughputMonitor(peak_flops={peak_flops!r}): give the device's peak FLOP/s (e.g. "
                             "989e12 for an H100 SXM in bf16), or None to take it from PEAK_TFLOPS.")
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.window_size = window_size
        self.separator = separator
        self.kwargs = {"window_size": window_size, "separator": separator}  # what Lightning's **kwargs hold
        self.peak_flops = peak_flops  # the argument; the run's is in self.device_peak_flops
        self.measure_flops = measure_flops
        self.step_split = step_split
        Throughput(window_size=window_size)  # check the arguments here, where they were written
        self._throughputs = {}
        self._t0 = {}
        self._counts = {}  # stage -> [batches, samples, lengths]
        self._run_batches = {}  # stage -> batches in the current run (Lightning's batch_progress.current)
        self._seen_step = 0
        self.flops_per_batch = {}  # stage -> FLOPs of one batch on this device, as counted (not the module's)
        self.device_peak_flops = None
        self._counter = None  # the FlopCounterMode while a stage's first batch runs
        self.split = {}  # this rank's split: phase -> mean seconds per batch, as last written
        self._val_seconds, self._val_started, self._previous_end, self._marks = 0.0, None, None, (0.0, 0.0)
        self._warned = False
        self._split_reset()

    @property
    def available_flops(self):
        """Lightning's name for the device's peak FLOP/s of the run (None: unknown, no MFU)."""
        return self.device_peak_flops

    def setup(self, trainer, pl_module, stage):
        self._throughputs = {}
        self.flops_per_batch = {}
        self.device_peak_flops = self.peak_flops or get_available_flops(trainer.strategy.root_device, trainer.precision)

    # -- FLOPs, counted once per stage --------------------------------------------------------------------------------
    def _flops_of(self, module, stage):
        """This stage's FLOPs per batch: the module's attribute, the count made, or None (not known yet / off)."""
        if hasattr(module, "flops_per_batch"):
            return module.flops_per_batch
        return self.flops_per_batch.get(stage)

    def _count_start(self, trainer, module, stage):
        if (not self.measure_flops or hasattr(module, "flops_per_batch") or stage in self.flops_per_batch
                or not trainer.is_global_zero or self._counter is not None):
            return
        from torch.utils.flop_counter import FlopCounterMode

        # entered here and left at the end of the batch's backward (or batch): the mode stack is thread-local
        # state that autograd carries into its threads, so the backward's products are counted too
        self._counter = (stage, FlopCounterMode(display=False))
        self._counter[1].__enter__()

    def _count_stop(self, stage):
        if self._counter is None or self._counter[0] != stage:
            return
        counter = self._counter[1]
        self._counter = None
        counter.__exit__(None, None, None)
        self.flops_per_batch[stage] = counter.get_total_flops()

    def _count_abandon(self):
        """Leave an open count without keeping it (the batch never reached its end)."""
        if self._counter is not None:
            counter, self._counter = self._counter[1], None
            counter.__exit__(None, None, None)

    def on_exception(self, trainer, pl_module, exception):
        self._count_abandon()

    # -- the step split -------------------------------------------------------------------------------------------------
    def _split_reset(self):
        self._split_sums = dict.fromkeys(SPLIT_PHASES, 0.0)
        self._split_events = []  # (phase, start event, end event) on CUDA, read at the next write
        self._split_batches = 0
        self._stamps = {}

    def _stamp(self, trainer, name):
        """A host time, and on CUDA an event in the stream: the device phases are measured between events."""
        event = None
        if trainer.strategy.root_device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self._stamps[name] = (time.perf_counter(), event)

    def _excluded(self, trainer):
        """(validation seconds, checkpoint-saving seconds) since the last call: not the phases' time."""
        now = (self._val_seconds, trainer.checkpoint_seconds)
        before, self._marks = self._marks, now
        return now[0] - before[0], now[1] - before[1]

    def _split_batch_end(self, trainer):
        """At a batch's end: its phases into the sums (on CUDA the device phases as event pairs, read later)."""
        self._stamp(trainer, "end")
        stamps = self._stamps
        validation, saving = self._excluded(trainer)
        host_phases = 0.0
        # The optimizer phase runs from on_before_optimizer_step to the batch's end (the step, the step's schedulers
        # and logging; the gradients are zeroed at the next window's first backward, Lightning's place), less a
        # validation run inside it.
        for name, start, end in (("forward", "start", "before_backward"),
                                 ("backward", "before_backward", "after_backward"),
                                 ("optimizer", "before_optimizer", "end")):
            if start in stamps and end in stamps:
                (t0, e0), (t1, e1) = stamps[start], stamps[end]
                seconds = t1 - t0 - (validation if name == "optimizer" else 0.0)
                host_phases += seconds
                if e0 is not None:
                    self._split_events.append((name, e0, e1))
                else:
                    self._split_sums[name] += max(0.0, seconds)
        self._split_sums["checkpoint"] += saving
        total = stamps["end"][0] - stamps["start"][0]
        optimizer_ran = "before_optimizer" in stamps  # (its phase already left the validation out)
        self._split_sums["other"] += max(0.0, total - host_phases - (0.0 if optimizer_ran else validation) - saving)
        self._split_batches += 1
        self._previous_end = stamps["end"][0]
        self._stamps = {}

    def _split_metrics(self, trainer):
        """Every rank's mean seconds per batch since the last write, as rank 0's metrics (a gather: every rank
        calls it, at the same log steps)."""
        sums = dict(self._split_sums)
        if self._split_events:
            self._split_events[-1][2].synchronize()
            for name, start, end in self._split_events:
                sums[name] += start.elapsed_time(end) / 1000  # milliseconds
        batches = max(1, self._split_batches)
        self.split = {name: value / batches for name, value in sums.items()}
        self._split_reset()
        gathered = trainer.strategy.all_gather_object(self.split) if trainer.world_size > 1 else [self.split]
        sep = self.separator
        return {f"train{sep}split{sep}rank{rank}{sep}{name}": value
                for rank, split in enumerate(gathered) for name, value in split.items()}

    # -- measuring -------------------------------------------------------------------------------------------------
    def _start(self, trainer, stage):
        if not self.measure_flops and not hasattr(trainer.module, "flops_per_batch") and not self._warned:
            self._warned = True  # Lightning's warning, once per callback
            warnings.warn("When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or "
                          f"property in {type(trainer.module).__name__} to compute the FLOPs (or pass "
                          "ThroughputMonitor(measure_flops=True) to count them).", UserWarning)
        # Lightning's rule: in a fit every stage starts its counts again; a validate/test/predict call goes on
        # from the counts (and the steps) of the last call of the same kind
        if stage not in self._throughputs:
            self._throughputs[stage] = Throughput(trainer.world_size, self.window_size, self.separator,
                                                  self.device_peak_flops)
        if trainer.state.fn == "fit" or stage not in self._counts:
            self._throughputs[stage].reset()
            self._counts[stage] = [0, 0, 0]
        self._run_batches[stage] = 0
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
        self._throughputs[stage].update(time=elapsed, batches=counts[0], samples=counts[1],
                                        lengths=counts[2] if self.length_fn is not None else None,
                                        flops=self._flops_of(module, stage))

    def _evaluation_batch_end(self, trainer, module, stage, batch):
        """Lightning's rule for evaluation writes (its logger connector's should_update_logs in an evaluation loop):
        after a batch whose number in this run (all loaders together, from 1) is a multiple of log_every_n_steps (0:
        never), or once the trainer should stop. The write's step is the loop's total of batches: in a fit, the
        validation batches since the training epoch began; in validate/test/predict calls, all the calls' batches (from
        the count a ckpt_path's file holds: the loop's batch_progress.total.ready, read as Lightning's callback reads
        it)."""
        self._update(trainer, module, stage, batch)
        self._run_batches[stage] += 1
        count = self._run_batches[stage]
        if trainer.log_every_n_steps and (count % trainer.log_every_n_steps == 0 or trainer.should_stop):
            if stage == "predict":
                loop = trainer.predict_loop
            elif stage == "test":
                loop = trainer.test_loop
            else:
                loop = trainer.fit_loop.epoch_loop.val_loop if trainer.state.fn == "fit" else trainer.validate_loop
            self._write(trainer, stage, step=loop.batch_progress.total.ready)

    def _write(self, trainer, stage, extra=None, step=None):
        metrics = self._throughputs[stage].compute()
        values = {f"{stage}{self.separator}{k}": v for k, v in metrics.items()}
        trainer.log_to_loggers({**values, **(extra or {})}, step=step)

    # -- events ----------------------------------------------------------------------------------------------------
    def on_train_start(self, trainer, *args):
        self._seen_step = trainer.global_step
        self._val_seconds, self._previous_end = 0.0, None
        self._marks = (0.0, trainer.checkpoint_seconds)
        self._split_reset()
        if trainer.is_global_zero:
            self._start(trainer, "train")

    def on_train_end(self, trainer, pl_module):
        self._count_abandon()  # the module's on_train_batch_start ended the epoch (-1) before the batch ran

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._count_start(trainer, pl_module, "train")
        if not self.step_split:
            return
        self._stamp(trainer, "start")
        validation, saving = self._excluded(trainer)
        if self._previous_end is not None:  # from the last batch's end to this one's start: the loader's wait
            self._split_sums["checkpoint"] += saving
            gap = self._stamps["start"][0] - self._previous_end
            self._split_sums["data_wait"] += max(0.0, gap - validation - saving)

    def on_before_backward(self, trainer, pl_module, loss):
        if self.step_split:
            self._stamp(trainer, "before_backward")

    def on_after_backward(self, trainer, pl_module):
        self._count_stop("train")
        if self.step_split:
            self._stamp(trainer, "after_backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.step_split:
            self._stamp(trainer, "before_optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, *args):
        self._count_stop("train")  # (manual optimisation: no on_after_backward from the loop)
        if self.step_split:
            self._split_batch_end(trainer)
        step = trainer.global_step
        stepped, self._seen_step = step != self._seen_step, step
        write = stepped and trainer.should_update_logs  # after a window's step: its time is included
        split = self._split_metrics(trainer) if write and self.step_split else {}
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, "train", batch)
        if write:
            self._write(trainer, "train", split)

    def on_validation_start(self, trainer, *args):
        if trainer.sanity_checking:
            return
        if self.step_split:
            self._val_started = time.perf_counter()
        if trainer.is_global_zero:
            self._start(trainer, "validate")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._count_start(trainer, pl_module, "validate")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, *args, **kwargs):
        if trainer.sanity_checking:
            return
        self._count_stop("validate")
        if trainer.is_global_zero:
            self._evaluation_batch_end(trainer, pl_module, "validate", batch)

    def on_validation_end(self, trainer, *args):
        if trainer.sanity_checking:
            return
        if self.step_split:
            self._val_seconds += time.perf_counter() - self._val_started
        if trainer.is_global_zero and trainer.state.fn == "fit" and "train" in self._t0:
            # the validation's time does not count as training time: Lightning's arithmetic, from the times already
            # measured (the gap from the last training measurement to the validation's start, and the validation
            # up to its last batch), no clock read here
            train_times, val_times = self._throughputs["train"]._time, self._throughputs["validate"]._time
            training_finished = self._t0["train"] + (train_times[-1] if train_times else 0.0)
            self._t0["train"] += self._t0["validate"] - training_finished + (val_times[-1] if val_times else 0.0)

    def on_test_start(self, trainer, *args):
        if trainer.is_global_zero:
            self._start(trainer, "test")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._count_start(trainer, pl_module, "test")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, *args, **kwargs):
        self._count_stop("test")
        if trainer.is_global_zero:
            self._evaluation_batch_end(trainer, pl_module, "test", batch)

    def on_predict_start(self, trainer, *args):
        if trainer.is_global_zero:
            self._start(trainer, "predict")

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._count_start(trainer, pl_module, "predict")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, *args, **kwargs):
        self._count_stop("predict")
        if trainer.is_global_zero:
            self._evaluation_batch_end(trainer, pl_module, "predict", batch)
