"""Lightning's precision plugins under their names and constructors (`from tasktrain.plugins.precision import
MixedPrecision`, the rename rule of docs/lightning.md), for Trainer(plugins=[...]).

Each is tasktrain's plugin of that precision (tasktrain/strategies/precision.py): a plugin object trains exactly as
the same precision name does (MixedPrecision("bf16-mixed", "cpu") is precision="bf16-mixed"). DeepSpeedPrecision and
FSDPPrecision name their engine's precision (the strategy runs its own plugin of that name); the plugins of libraries
tasktrain does not run (bitsandbytes, Transformer Engine, XLA) are refused when built, saying what to write instead.

A subclass of one's own may override Lightning's hooks that tasktrain calls where Lightning calls them (_LightningHooks
below: the step contexts, convert_module, tensor_init_context, module_init_context, state_dict / load_state_dict,
teardown); overriding the others (the backward and optimizer-step hooks, clipping, connect, convert_input,
convert_output, the checkpoint hooks) is refused by the Trainer (tasktrain/trainer/plugin_args.py), because
tasktrain's loop calls its own precision methods there.
"""
from tasktrain.exceptions import MisconfigurationException
from tasktrain.strategies import precision as _core

__all__ = ["Precision", "DoublePrecision", "HalfPrecision", "MixedPrecision", "DeepSpeedPrecision", "FSDPPrecision",
           "BitsandbytesPrecision", "TransformerEnginePrecision", "XLAPrecision"]

# The device is the run's: the strategy sets it when it adopts the plugin (Strategy.adopt_precision).
_LATER = "cpu"

# Lightning's precision hooks a subclass may override (called as Lightning calls them), and those it may not
CALLED_HOOKS = ("forward_context", "train_step_context", "val_step_context", "test_step_context",
                "predict_step_context", "convert_module", "tensor_init_context", "module_init_context", "state_dict",
                "load_state_dict", "teardown")
REFUSED_HOOKS = ("pre_backward", "backward", "post_backward", "optimizer_step", "clip_gradients",
                 "clip_grad_by_value", "clip_grad_by_norm", "main_params", "connect", "convert_output",
                 "convert_input", "on_save_checkpoint", "on_load_checkpoint", "unscale_gradients")


_STEP_CONTEXTS = {"training_step": "train_step_context", "validation_step": "val_step_context",
                  "test_step": "test_step_context", "predict_step": "predict_step_context"}


class _LightningHooks:
    """Lightning's step contexts over tasktrain's precision: each step of the module runs in the context of its kind
    (train_step_context for training_step, val_step_context for validation_step, ...), each of which enters
    forward_context() by default, which is the precision's autocast (strategy.forward_context(step))."""

    def autocast(self):
        return self.forward_context()

    def forward_context(self):
        return super().autocast()  # the precision's own: torch.autocast under the mixed precisions

    def step_context(self, step):
        return getattr(self, _STEP_CONTEXTS.get(step, "forward_context"))()

    # Lightning's defaults: each enters forward_context(), looked up when called (a subclass's override counts)
    def train_step_context(self):
        return self.forward_context()

    def val_step_context(self):
        return self.forward_context()

    def test_step_context(self):
        return self.forward_context()

    def predict_step_context(self):
        return self.forward_context()


class Precision(_LightningHooks, _core.Precision):
    """"32-true" (Lightning's base plugin: no casting, no scaling)."""

    def __init__(self):
        super().__init__(_LATER)


class DoublePrecision(_LightningHooks, _core.DoublePrecision):
    """"64-true": the module and floating point inputs in float64."""

    def __init__(self):
        super().__init__(_LATER)


class HalfPrecision(_LightningHooks, _core.HalfPrecision):
    """"16-true" (default) or "bf16-true": the parameters stored in half, no autocast, no scaling."""

    def __init__(self, precision="16-true"):
        if precision not in ("16-true", "bf16-true"):
            raise ValueError(f"HalfPrecision(precision={precision!r}): use '16-true' or 'bf16-true'.")
        super().__init__(precision, None)  # (the fp16-on-CPU note is the strategy's, once it knows the device)


class MixedPrecision(_LightningHooks, _core.MixedPrecision):
    """"16-mixed" (autocast float16 + GradScaler) or "bf16-mixed" (autocast bfloat16) on `device` ("cpu", "cuda");
    `scaler`: a torch.amp.GradScaler of one's own for "16-mixed"."""

    def __init__(self, precision, device, scaler=None):
        if precision not in ("16-mixed", "bf16-mixed"):  # (Lightning's words)
            raise ValueError(f"`Passed `{type(self).__name__}(precision={precision!r})`. Precision must be '16-mixed' "
                             "or 'bf16-mixed'.")
        if scaler is not None and precision == "bf16-mixed":
            raise MisconfigurationException(f"`precision='bf16-mixed'` does not use a scaler, found {scaler}.")
        super().__init__(precision, device)
        if scaler is not None:
            self.scaler = scaler

    @property
    def device(self):
        """Lightning's attribute: the autocast device."""
        return self.device_type


_ENGINE_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


class _EnginePrecision(_core.Precision):
    """A precision name for an engine strategy, which runs its own plugin of that name (Strategy.adopt_precision)."""

    def __init__(self, precision):
        if precision not in _ENGINE_PRECISIONS:
            raise ValueError(f"{type(self).__name__}(precision={precision!r}): use one of {_ENGINE_PRECISIONS}.")
        super().__init__(_LATER)
        self.name = precision


class DeepSpeedPrecision(_EnginePrecision):
    """Lightning's DeepSpeedPrecision(precision): DeepSpeed's own precision of that name (strategy='deepspeed...')."""

    engine = "DeepSpeed"


class FSDPPrecision(_EnginePrecision):
    """Lightning's FSDPPrecision(precision, scaler=None): FSDP's own precision of that name (strategy='fsdp')."""

    engine = "FSDP"

    def __init__(self, precision, scaler=None):
        if scaler is not None:
            raise ValueError(f"FSDPPrecision({precision!r}, scaler=...): FSDP builds its ShardedGradScaler itself for "
                             "'16-mixed'; leave scaler out.")
        super().__init__(precision)


class _Unavailable:
    what = ""

    def __init__(self, *args, **kwargs):
        raise ValueError(f"{type(self).__name__}: {self.what}")


class BitsandbytesPrecision(_Unavailable):
    what = ("tasktrain does not quantize layers with bitsandbytes. Quantize the model yourself (bitsandbytes' "
            "Linear8bitLt / Linear4bit in configure_model) and train with precision='bf16-mixed' or 'bf16-true'.")


class TransformerEnginePrecision(_Unavailable):
    what = ("tasktrain does not run NVIDIA Transformer Engine's fp8 layers. Use precision='bf16-mixed' (or "
            "'bf16-true').")


class XLAPrecision(_Unavailable):
    what = "tasktrain runs on CPUs and CUDA GPUs, not TPUs (XLA). Use precision='bf16-mixed' / 'bf16-true'."

