"""Precision plugins: how the forward is cast and how gradients are scaled.

A strategy owns its plugin (`strategy.precision`, built by strategy.configure through build_precision) and
calls it; the Trainer and the Accelerator go through the strategy, in this order, every optimizer step:

    with strategy.forward_context(): loss = forward(...)     # precision.autocast(): the one place autocast is entered
    precision.backward(loss)              # scales the loss first under fp16
    precision.unscale(optimizer)          # before anything reads gradients (clipping, norms); idempotent per step
    stepped = precision.optimizer_step(optimizer)   # False when GradScaler skipped an inf/NaN step

Engines with a precision policy of their own (DeepSpeed) get a plugin that maps onto it instead.
"""
import contextlib
import types
import warnings

import torch

from tasktrain.names import normalize_precision  # noqa: F401  (the table's, re-exported for callers)
from tasktrain.tree import apply_to_leaves


class Precision:
    """Full fp32 ("32-true"): no casting, no scaling."""

    name = "32-true"
    autocast_options = {}  # AutocastKwargs (enabled, cache_enabled): used where an autocast runs
    # Whether a closure (the gradients' computation) goes into optimizer.step(closure=...), as Lightning's
    # precision plugins pass it: False where a GradScaler steps (the closure runs first, then the unscale)
    steps_with_closure = True
    last_step_output = None  # what the last optimizer.step(...) returned (LightningOptimizer.step returns it)
    engine = None  # the engine strategy whose own plugin this names ("DeepSpeed", "FSDP"), or None: any strategy
    # where a checkpoint holds this plugin's state (Lightning's: its class's __qualname__, resume.precision_key); an
    # engine's own plugin run with the hooks of a user's subclass sets that subclass's (plugins/precision/__init__.py)
    checkpoint_key = None
    # Lightning's precision plugins (tasktrain/plugins/precision/__init__.py) a subclass of one's own overrides: whether the
    # Trainer's step runs through their step hooks, and whether convert_input runs before the batch transfer hooks
    lightning_steps = False
    converts_before_transfer = False

    @property
    def precision(self) -> str:
        """Lightning's attribute: the precision name ("32-true", "bf16-mixed", ...)."""
        return self.name

    def __init__(self, device_type: str = "cpu"):
        self.device_type = device_type
        self.skipped_steps = 0

    def autocast(self):
        return contextlib.nullcontext()

    def forward_context(self):
        """Lightning's name for autocast() (`with trainer.precision_plugin.forward_context(): ...` in a script)."""
        return self.autocast()

    def step_context(self, step: str):
        """What one of the module's steps runs in ("training_step", "validation_step", "test_step", "predict_step"):
        Lightning's precision plugins have a context per step kind. Default: autocast()."""
        return self.autocast()

    def teardown(self) -> None:
        """The end of a Trainer run (Lightning's precision teardown, where its strategy is torn down:
        tasktrain/trainer/run.py end_stage_plugins). Default: nothing."""

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def tensor_init_context(self):
        """What `trainer.init_module()` builds the module in (Lightning's precision plugins): a "-true" precision's
        dtype as the default dtype (float64, float16, bfloat16), else unchanged."""
        return self._default_dtype()

    def module_init_context(self):
        """What the module's configure_model runs in (after tensor_init_context, as Lightning's Trainer enters them):
        the same default dtype."""
        return self._default_dtype()

    @contextlib.contextmanager
    def _default_dtype(self):
        dtype = {"64-true": torch.float64, "16-true": torch.float16, "bf16-true": torch.bfloat16}.get(self.name)
        previous = torch.get_default_dtype()
        if dtype is not None:
            torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def convert_input(self, data):
        return data

    def backward(self, loss: torch.Tensor, backward_fn=None, **kwargs) -> None:
        """`backward_fn`: the module's own backward (TaskModule.backward overridden), called with the loss."""
        loss.backward(**kwargs) if backward_fn is None else backward_fn(loss, **kwargs)

    def unscale(self, optimizer) -> None:
        pass

    def optimizer_step(self, optimizer, closure=None, **kwargs) -> bool:
        """`kwargs`: the extra arguments of the optimizer's step (LightningOptimizer.step(closure, **kwargs))."""
        self.last_step_output = optimizer.step(**kwargs) if closure is None else optimizer.step(closure=closure,
                                                                                                 **kwargs)
        return True

    # What the strategy calls (Strategy.backward / optimizer_step). Lightning's precision plugins
    # (tasktrain/plugins/precision/__init__.py) have Lightning's own backward(tensor, model, optimizer) and
    # optimizer_step(optimizer, model, closure) under those names, and route these two through them.
    def run_backward(self, loss, *args, **kwargs) -> None:
        self.backward(loss, *args, **kwargs)

    def run_step(self, optimizer, closure=None, **kwargs) -> bool:
        return self.optimizer_step(optimizer, closure, **kwargs)

    def cast_moved_batch(self, batch):
        """The input cast strategy.move_batch applies once the batch is on the device: convert_input."""
        return self.convert_input(batch)

    # Lightning's set-up and checkpoint hooks of a precision plugin (the Trainer calls them where Lightning's does:
    # connect once the strategy set the module and optimizers up, on_save_checkpoint after the plugin's state went into
    # the checkpoint, on_load_checkpoint before it is loaded back). Default: nothing.
    def connect(self, model, optimizers, lr_schedulers):
        return model, optimizers, lr_schedulers

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        pass

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def set_options(self, scaler=None, autocast=None):
        """Accelerate's GradScalerKwargs / AutocastKwargs (their non-default fields). Default: no GradScaler to
        configure (an error), and no autocast runs, so autocast options change nothing."""
        if scaler:
            raise ValueError(f"GradScalerKwargs configure the fp16 GradScaler; precision {self.name!r} has none. Use "
                             "mixed_precision='fp16', or drop the handler.")


class DoublePrecision(Precision):
    """"64-true": the module and floating point inputs in float64."""

    name = "64-true"

    def autocast(self):
        # Not an autocast: tensors a step creates (torch.zeros, torch.randn) default to float64, as under Lightning's
        # DoublePrecision.forward_context, so that they mix with the float64 activations as they are
        return self._default_dtype()

    def convert_module(self, module):
        return module.double()

    def convert_input(self, data):
        return _apply_to_floats(data, lambda t: t.double())


class HalfPrecision(Precision):
    """"bf16-true" / "16-true": the parameters are stored in bfloat16 / float16 (the module is cast before training),
    floating point inputs are cast to it, and tensors a forward creates default to it. No fp32 master copy, no
    autocast, no loss scaling: the gradients and the optimizer state are in half too (half the memory of the
    mixed modes' weights, but updates smaller than half's resolution are lost)."""

    def __init__(self, name: str, device_type: str = "cpu"):
        super().__init__(device_type)
        self.name = name
        self.dtype = torch.float16 if name == "16-true" else torch.bfloat16
        self._checked = set()  # ids of the optimizers whose eps was looked at
        if name == "16-true":
            warn_fp16_on_cpu(device_type, name)

    @contextlib.contextmanager
    def autocast(self):
        # Not an autocast: tensors the forward creates (torch.zeros, torch.randn) default to the half dtype, so
        # they mix with the half activations without promoting them back to fp32 (as Lightning's HalfPrecision).
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def convert_module(self, module):
        return module.to(self.dtype)

    def convert_input(self, data):
        return _apply_to_floats(data, lambda t: t.to(self.dtype))

    def optimizer_step(self, optimizer, closure=None, **kwargs):
        if id(optimizer) not in self._checked:
            self._checked.add(id(optimizer))
            warn_eps_in_half(optimizer, self.dtype, self.name)
        return super().optimizer_step(optimizer, closure, **kwargs)


def warn_eps_in_half(optimizer, dtype, name):
    """Adam-style optimizers add eps to the root of their second moment, held in the parameters' dtype. float16 rounds
    eps=1e-8 to 0, and the second moment of a small gradient underflows to 0 too: 0/0 makes the weights NaN at the
    first step (measured on torch 2.13). bfloat16 has fp32's exponent range and keeps 1e-8."""
    tiny = torch.finfo(dtype).tiny  # the smallest normal number: below it, eps is rounded or lost
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if isinstance(eps, float) and 0 < eps < tiny and any(p.dtype == dtype for p in group["params"]):
            warnings.warn(f"precision={name!r}: {type(optimizer).__name__}(eps={eps:g}) is below {dtype}'s smallest "
                          f"normal number ({tiny:.1e}), so its denominators can round to 0 and the weights become "
                          f"NaN. Use eps=1e-4 (or larger) with precision={name!r}, or precision='bf16-true'.",
                          stacklevel=3)
            return


class MixedPrecision(Precision):
    """"16-mixed" (autocast float16 + GradScaler) and "bf16-mixed" (autocast bfloat16, no scaler needed)."""

    def __init__(self, name: str, device_type: str = "cpu"):
        super().__init__(device_type)
        self.name = name
        self.dtype = torch.float16 if name == "16-mixed" else torch.bfloat16
        self.scaler = None
        self._unscaled = set()
        if name == "16-mixed":
            self.scaler = self.make_scaler()
            warn_fp16_on_cpu(device_type)

    @property
    def device(self):
        """Lightning's attribute: the autocast device ("cpu", "cuda")."""
        return self.device_type

    def make_scaler(self, **options):
        """The fp16 loss scaler, with GradScalerKwargs' `options`. GradScaler() with no device means CUDA and
        silently disables itself on a CPU machine: the device is always given."""
        return torch.amp.GradScaler(self.device_type, **options)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, **self.autocast_options)

    def set_options(self, scaler=None, autocast=None):
        if scaler:
            if self.scaler is None:
                super().set_options(scaler=scaler)
            self.scaler = self.make_scaler(**scaler)
        if autocast:
            self.autocast_options = dict(autocast)

    def backward(self, loss, backward_fn=None, **kwargs):
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs) if backward_fn is None else backward_fn(loss, **kwargs)

    def unscale(self, optimizer):
        # GradScaler raises when unscale_ runs twice before update: clipping and norm logging may both ask. An
        # optimizer without gradients (every training_step of the window returned None) is not unscaled: it does not
        # step, and an unscale_ without its step would leave the scaler's state for the next window's gradients
        # (Lightning's AMP plugin skips it too).
        if self.scaler is not None and id(optimizer) not in self._unscaled and any(
                p.grad is not None for group in optimizer.param_groups for p in group["params"]):
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    @property
    def steps_with_closure(self):
        return self.scaler is None

    def optimizer_step(self, optimizer, closure=None, **kwargs):
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure, **kwargs)
        if closure is not None:
            raise ValueError("precision='16-mixed' does not support optimizer closures (LBFGS); use '32-true'.")
        self.unscale(optimizer)
        before = self.scaler.get_scale()
        # GradScaler itself syncs here to look for inf/NaN: no extra cost below
        self.last_step_output = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        stepped = self.scaler.get_scale() >= before
        if not stepped:
            self.skipped_steps += 1
        return stepped

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state_dict):
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])


def make_precision(value, device_type: str = "cpu") -> Precision:
    name = normalize_precision(value)
    if name == "32-true":
        return Precision(device_type)
    if name == "64-true":
        return DoublePrecision(device_type)
    if name in ("bf16-true", "16-true"):
        return HalfPrecision(name, device_type)
    return MixedPrecision(name, device_type)


def _apply_to_floats(data, fn):
    return apply_to_leaves(data, lambda t: fn(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)


def warn_fp16_on_cpu(device_type, name="16-mixed"):
    if device_type == "cpu":
        fast = name.replace("16", "bf16", 1)  # 16-mixed -> bf16-mixed, 16-true -> bf16-true
        warnings.warn(
            f"precision={name!r} on CPU works but is usually much slower than fp32 (most CPUs have no fast float16 "
            f"matmul); precision={fast!r} is the fast half precision on CPU.",
            stacklevel=4,
        )


# -- a model's own forward under the precision (the Accelerator's prepared models) -----------------------------------
def patch_forward(model, forward_context, convert_input=None):
    """Run the model's own forward inside `forward_context()` (the strategy's autocast), outputs back in float32
    (as Accelerate does). `convert_input`: applied to the forward's arguments first (the true half modes cast
    floating point inputs to the module's dtype)."""
    if "_tasktrain_forward" in model.__dict__:
        return
    model.__dict__["_tasktrain_forward"] = model.forward
    model.__dict__["_tasktrain_autocast"] = forward_context
    model.__dict__["_tasktrain_convert"] = convert_input
    # A method bound to the model (not a closure), so that copy.deepcopy(model) calls the copy's own forward.
    model.forward = types.MethodType(_forward_in_precision, model)


def _forward_in_precision(self, *args, **kwargs):
    if self._tasktrain_convert is not None:
        args, kwargs = self._tasktrain_convert((args, kwargs))
    with self._tasktrain_autocast():
        outputs = self._tasktrain_forward(*args, **kwargs)
    return apply_to_leaves(outputs, _to_float32)


def _to_float32(leaf):
    return leaf.float() if isinstance(leaf, torch.Tensor) and leaf.dtype in (torch.float16, torch.bfloat16) else leaf


def unpatch_forward(model):
    """Undo patch_forward: the model's forward as it was."""
    if "_tasktrain_forward" in model.__dict__:
        original = model.__dict__.pop("_tasktrain_forward")
        model.__dict__.pop("_tasktrain_autocast", None)
        model.__dict__.pop("_tasktrain_convert", None)
        del model.__dict__["forward"]
        if getattr(original, "__func__", None) is not getattr(type(model), "forward", None):
            model.forward = original  # the model had its own instance-level forward: put it back
