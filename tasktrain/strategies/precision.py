"""Precision plugins: how the forward is cast and how gradients are scaled.

The Trainer and the Accelerator both go through these four calls, in this order, every optimizer step:

    with precision.autocast(): loss = forward(...)
    precision.backward(loss)              # scales the loss first under fp16
    precision.unscale(optimizer)          # before anything reads gradients (clipping, norms); idempotent per step
    stepped = precision.optimizer_step(optimizer)   # False when GradScaler skipped an inf/NaN step
"""
import contextlib
import warnings

import torch

from tasktrain.names import normalize_precision  # noqa: F401  (the table's, re-exported for callers)
from tasktrain.tree import apply_to_leaves

class Precision:
    """Full fp32 ("32-true"): no casting, no scaling."""

    name = "32-true"

    def __init__(self, device_type: str = "cpu"):
        self.device_type = device_type
        self.skipped_steps = 0

    def autocast(self):
        return contextlib.nullcontext()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def convert_input(self, batch):
        return batch

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        loss.backward(**kwargs)

    def unscale(self, optimizer) -> None:
        pass

    def optimizer_step(self, optimizer, closure=None) -> bool:
        optimizer.step() if closure is None else optimizer.step(closure)
        return True

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DoublePrecision(Precision):
    """"64-true": the module and floating point inputs in float64."""

    name = "64-true"

    def convert_module(self, module):
        return module.double()

    def convert_input(self, batch):
        return _apply_to_floats(batch, lambda t: t.double())


class MixedPrecision(Precision):
    """"16-mixed" (autocast float16 + GradScaler) and "bf16-mixed" (autocast bfloat16, no scaler needed)."""

    def __init__(self, name: str, device_type: str = "cpu"):
        super().__init__(device_type)
        self.name = name
        self.dtype = torch.float16 if name == "16-mixed" else torch.bfloat16
        self.scaler = None
        self._unscaled = set()
        if name == "16-mixed":
            # GradScaler() with no device means CUDA and silently disables itself on a CPU machine.
            self.scaler = torch.amp.GradScaler(device_type)
            if device_type == "cpu":
                warnings.warn(
                    "precision='16-mixed' on CPU works but is usually much slower than fp32 (most CPUs have no fast "
                    "float16 matmul); precision='bf16-mixed' is the fast mixed precision on CPU.",
                    stacklevel=3,
                )

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss, **kwargs):
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    def unscale(self, optimizer):
        # GradScaler raises when unscale_ runs twice before update: clipping and norm logging may both ask.
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer, closure=None):
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure)
        if closure is not None:
            raise ValueError("precision='16-mixed' does not support optimizer closures (LBFGS); use '32-true'.")
        self.unscale(optimizer)
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)  # GradScaler itself syncs here to look for inf/NaN: no extra cost below
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        stepped = self.scaler.get_scale() >= before
        if not stepped:
            self.skipped_steps += 1
        return stepped

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state):
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def make_precision(value, device_type: str = "cpu") -> Precision:
    name = normalize_precision(value)
    if name == "32-true":
        return Precision(device_type)
    if name == "64-true":
        return DoublePrecision(device_type)
    return MixedPrecision(name, device_type)


def _apply_to_floats(data, fn):
    return apply_to_leaves(data, lambda t: fn(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
