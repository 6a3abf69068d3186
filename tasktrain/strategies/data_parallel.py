"""DataParallel ("dp"): one process drives several GPUs through torch.nn.DataParallel.

Every step, the batch (on the first GPU) is split along dimension 0, the module is copied to each GPU, the
step runs on every copy in threads, the outputs are gathered back on the first GPU, and the losses of the
copies are averaged; backward sums the gradients onto the original module. It is slower than DDP on the same
GPUs: the weights are copied to every GPU at every step, one Python process (and its GIL) drives all of them,
and the first GPU gathers the outputs and holds the optimizer alone. Prefer strategy="ddp".

With fewer than two GPUs (a CPU machine, or one GPU) it warns and runs as a single device: torch's
DataParallel has nothing to split over there (on CPU it is a pass-through and its scatter fails).
"""
import warnings

import torch

from tasktrain.strategies.base import OneProcess, Strategy, _StepWrapper
from tasktrain.tree import apply_to_leaves


class _StepForward(_StepWrapper):
    """What DataParallel replicates: runs the named step of the module, under the strategy's forward_context
    (autocast), in each GPU's thread."""

    def __init__(self, module, forward_context):
        super().__init__(module)
        self.forward_context = forward_context

    def forward(self, step_name, *args, **kwargs):
        # autocast is thread-local and DataParallel passes only "enabled" (not the dtype) to its threads.
        with self.forward_context(step_name):
            return _unsqueeze_scalars(getattr(self.module, step_name)(*args, **kwargs))


class DataParallel(OneProcess, Strategy):
    """torch.nn.DataParallel over `device_ids` (default: devices=N -> GPUs 0..N-1; devices=1/"auto" -> all visible)."""

    name = "dp"
    supports_custom_loop = False  # it splits the module's steps, not a model's own forward

    def __init__(self, accelerator=None, precision=None, device_ids=None):
        super().__init__(accelerator=accelerator, precision=precision)
        self.device_ids = [int(i) for i in device_ids] if device_ids is not None else None
        self.parallel_ids = []  # the GPUs actually used; empty when running as a single device
        self._warned = False

    def _choose_ids(self):
        if self.accelerator_name == "cpu" or not torch.cuda.is_available():
            return []
        count = torch.cuda.device_count()
        if self.device_ids is not None:
            ids = self.device_ids
        elif self.devices > 1:
            ids = list(range(self.devices))
        else:
            ids = list(range(count))
        bad = [i for i in ids if not 0 <= i < count]
        if bad:
            raise ValueError(f"strategy='dp' was asked for GPU(s) {bad}, but {count} are visible (0..{count - 1}).")
        return ids

    def setup_environment(self):
        ids = self._choose_ids()
        if len(ids) < 2:
            if not self._warned:
                found = "no GPU" if not ids else "one GPU"
                warnings.warn(f"strategy='dp' splits each batch over several GPUs, but there is {found} to use: "
                              "running as a single device (like strategy='single_device').", stacklevel=2)
                self._warned = True
            self.parallel_ids = []
            self._root_device = torch.device("cuda", ids[0]) if ids else torch.device("cpu")
        else:
            self.parallel_ids = ids
            self._root_device = torch.device("cuda", ids[0])
        super().setup_environment()

    @property
    def runs_steps_in_threads(self):
        # Each GPU's copy runs the step in its own thread: self.log takes the values one thread at a time, onto
        # the first GPU. Each copy logs the value of its chunk: step values show the last copy's, epoch means
        # average all copies.
        return bool(self.parallel_ids)

    def setup_module_and_optimizers(self, module, optimizers, plan):
        if not plan.calls_steps:
            raise ValueError("strategy 'dp' wraps modules for the Trainer only (it splits the module's steps, not a "
                             "model's own forward): use 'single_device', 'ddp' or a DeepSpeed strategy with the "
                             "Accelerator.")
        super().setup_module_and_optimizers(module, optimizers, plan)
        if self.parallel_ids:
            self.model = torch.nn.DataParallel(_StepForward(module, self.forward_context), device_ids=self.parallel_ids,
                                               output_device=self.parallel_ids[0])
        return self.model, self.optimizers

    def training_step(self, *args, **kwargs):
        if not self.parallel_ids or self.model is None:  # (one GPU, or after the run: the module's own step)
            return super().training_step(*args, **kwargs)
        return _mean_loss(self.model("training_step", *args, **kwargs))

    def eval_step(self, step_fn, *args, **kwargs):
        if not self.parallel_ids or self.model is None:
            return super().eval_step(step_fn, *args, **kwargs)
        return self.model(step_fn.__name__, *args, **kwargs)

    def describe(self):
        if not self.parallel_ids:
            return f"strategy=dp (as a single device: fewer than 2 GPUs), world_size=1, device={self.root_device}"
        return f"strategy=dp, world_size=1, devices={self.parallel_ids}, device={self.root_device}"


def _unsqueeze_scalars(out):
    # DataParallel's gather stacks 0-dim outputs with a warning every step; shape (1,) concatenates silently.
    return apply_to_leaves(out, lambda t: t.unsqueeze(0) if isinstance(t, torch.Tensor) and t.dim() == 0 else t)


def _mean_loss(out):
    """The copies' losses, one per GPU, averaged: the loss of the whole batch when the chunks are equal."""
    if isinstance(out, torch.Tensor):
        return out.mean()
    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor):
        return {**out, "loss": out["loss"].mean()}
    return out
