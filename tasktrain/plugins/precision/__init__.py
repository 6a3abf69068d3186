"""Lightning's precision plugins under their names and constructors (`from tasktrain.plugins.precision import
MixedPrecision`, the rename rule of docs/lightning.md), for Trainer(plugins=[...]).

Each is tasktrain's plugin of that precision (tasktrain/strategies/precision.py): a plugin object trains exactly as
the same precision name does (MixedPrecision("bf16-mixed", "cpu") is precision="bf16-mixed"). DeepSpeedPrecision and
FSDPPrecision name their engine's precision (the strategy runs its own plugin of that name); the plugins of libraries
tasktrain does not run (bitsandbytes, Transformer Engine, XLA) are refused when built, saying what to write instead.

A subclass of one's own may override Lightning's hooks (_LightningHooks below), each called where Lightning's Trainer
calls it, with Lightning's arguments: the step contexts, convert_module, tensor_init_context, module_init_context,
connect (once the strategy set the module and optimizers up), convert_input (on each batch, before the transfer hooks),
state_dict / load_state_dict, on_save_checkpoint / on_load_checkpoint, teardown, and the step's hooks (STEP_HOOKS:
pre_backward, backward, post_backward, optimizer_step, clip_gradients, clip_grad_by_value, clip_grad_by_norm,
main_params). A subclass overriding one of the step's hooks trains through all of them, in Lightning's order
(loop.py: the closure's pre_backward -> strategy.backward -> backward -> post_backward, optimizer_step running the
closure, on_before_optimizer_step and configure_gradient_clipping -> clip_gradients); their defaults compute what
tasktrain's own step computes (a plugin without such an override takes that step). convert_output and
unscale_gradients are Fabric's: Lightning's Trainer never calls them, nor does tasktrain's (an override is warned
about). An engine strategy's plugin (DeepSpeedPrecision, FSDPPrecision; a Precision, as Lightning's) is Lightning's
plugin object of a run whose engine runs its own plugin of that name: overrides of the same hooks are called where Lightning's DeepSpeed / FSDP
strategies call them, their defaults the engine's (ENGINE_REFUSED_HOOKS are refused, saying why).
"""
import abc
import functools
from typing import TYPE_CHECKING, Literal, Optional, Union

import torch

from tasktrain.exceptions import MisconfigurationException
from tasktrain.strategies import precision as _core
from tasktrain.trainer.states import GradClipAlgorithmType

__all__ = ["Precision", "DoublePrecision", "HalfPrecision", "MixedPrecision", "DeepSpeedPrecision", "FSDPPrecision",
           "BitsandbytesPrecision", "TransformerEnginePrecision", "XLAPrecision"]

# The device is the run's: the strategy sets it when it adopts the plugin (Strategy.adopt_precision).
_LATER = "cpu"

# Lightning's precision hooks of the step: a subclass overriding any of them trains through all of them
STEP_HOOKS = ("pre_backward", "backward", "post_backward", "optimizer_step", "clip_gradients", "clip_grad_by_value",
              "clip_grad_by_norm", "main_params")
# Lightning's precision hooks a subclass may override, called where Lightning calls them
CALLED_HOOKS = ("forward_context", "train_step_context", "val_step_context", "test_step_context",
                "predict_step_context", "convert_module", "tensor_init_context", "module_init_context", "state_dict",
                "load_state_dict", "teardown", "connect", "convert_input", "on_save_checkpoint",
                "on_load_checkpoint") + STEP_HOOKS
# Fabric's, which Lightning's Trainer never calls (nor tasktrain's): an override is accepted with a warning
UNCALLED_HOOKS = ("convert_output", "unscale_gradients")
# An engine's plugin (DeepSpeedPrecision, FSDPPrecision) takes overrides of CALLED_HOOKS too, called where Lightning's
# Trainer and its DeepSpeed / FSDP strategies call them, their defaults the engine's own. These it refuses:
# Lightning's FSDPPrecision.mixed_precision_config builds FSDP1's MixedPrecision for FSDP1's wrapper; tasktrain's FSDP
# is torch's fully_shard (FSDP2), which takes a MixedPrecisionPolicy (FSDP(mixed_precision=...)).
ENGINE_REFUSED_HOOKS = ("mixed_precision_config",)

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


_STEP_CONTEXTS = {"training_step": "train_step_context", "validation_step": "val_step_context",
                  "test_step": "test_step_context", "predict_step": "predict_step_context"}


def _clip_by(plugin, optimizer, clip_val, gradient_clip_algorithm):
    """A plugin's clip_gradients once its own checks passed: by value or by norm through its (overridable)
    clip_grad_by_value / clip_grad_by_norm; nothing where clip_val <= 0 (Lightning's)."""
    if clip_val <= 0:
        return
    if gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
        plugin.clip_grad_by_value(optimizer, clip_val)
    elif gradient_clip_algorithm == GradClipAlgorithmType.NORM:
        plugin.clip_grad_by_norm(optimizer, clip_val)


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

    # -- which step the Trainer takes (decided by the class: what a subclass of one's own overrides) -----------------
    @property
    def lightning_steps(self):
        """Whether the Trainer's step runs through this plugin's step hooks (a subclass overrides one of STEP_HOOKS);
        False: tasktrain's own step, which computes what their defaults compute."""
        return _overrides(type(self), STEP_HOOKS)

    @property
    def converts_before_transfer(self):
        """Whether the Trainer applies convert_input before the batch transfer hooks (Lightning's place) instead of the
        strategy after the move: where a subclass overrides it (the built-in casts give the same values either way)."""
        return _overrides(type(self), ("convert_input",))

    # -- what the strategy calls: routed through Lightning's hooks where the Trainer's step runs them ---------------
    def run_backward(self, loss, *args, backward_fn=None, **kwargs):
        if self.lightning_steps and backward_fn is not None:
            # the Trainer's step: pre_backward scaled the loss already; backward_fn calls this plugin's backward
            backward_fn(loss, *args, **kwargs)
        else:
            super().backward(loss, *args, backward_fn=backward_fn, **kwargs)

    def run_step(self, optimizer, closure=None, model=None, **kwargs):
        if not self.lightning_steps or model is None:
            return super().optimizer_step(optimizer, closure, **kwargs)
        scaler = getattr(self, "scaler", None)
        before = scaler.get_scale() if scaler is not None else None
        self.last_step_output = self.optimizer_step(optimizer, model=model, closure=closure, **kwargs)  # (Lightning's)
        if scaler is None:
            return True
        self._unscaled.discard(id(optimizer))
        stepped = scaler.get_scale() >= before  # (GradScaler lowers its scale where it skipped the step)
        if not stepped:
            self.skipped_steps += 1
        return stepped

    def cast_moved_batch(self, batch):
        # an override of convert_input ran before the transfer hooks already (the Trainer's batch mover)
        return batch if self.converts_before_transfer else super().cast_moved_batch(batch)

    # -- Lightning's step hooks, Lightning's arguments; the defaults compute what tasktrain's own step does ---------
    def pre_backward(self, tensor, module):
        """Before the backward of a training step's loss (or manual_backward's): the loss scaled ("16-mixed"), then
        on_before_backward (the callbacks', the module's) with it, as Lightning's. Returns the tensor to backward."""
        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            tensor = scaler.scale(tensor)
        module.trainer._call("on_before_backward", tensor)
        return tensor

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        """The backward itself: the module's backward(tensor, *args, **kwargs); `optimizer` is None in manual
        optimisation."""
        model.backward(tensor, *args, **kwargs)

    def post_backward(self, tensor, module):
        """After the backward: on_after_backward; returns the loss without its graph."""
        closure_loss = tensor.detach()
        module.trainer._call("on_after_backward")
        return closure_loss

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        """The optimizer step of a window (LightningOptimizer.step): runs `closure` (training_step, zero_grad,
        backward), then on_before_optimizer_step and the clipping (_after_closure), then the step; "16-mixed" runs the
        closure first, unscales, then steps through the GradScaler (which skips a step with inf/NaN gradients).
        Returns what the optimizer's step returned."""
        scaler = getattr(self, "scaler", None)
        if scaler is None:
            super().optimizer_step(optimizer, functools.partial(self._wrap_closure, model, optimizer, closure),
                                   **kwargs)
            return self.last_step_output
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")  # (Lightning's words)
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization  # no backward ran: nothing to unscale or step
        if not skip:
            self.unscale(optimizer)  # before on_before_optimizer_step and the clipping read the gradients
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        output = scaler.step(optimizer, **kwargs)
        scaler.update()
        return output

    def _wrap_closure(self, model, optimizer, closure):
        closure_result = closure()
        self._after_closure(model, optimizer)
        return closure_result

    def _after_closure(self, model, optimizer):
        from tasktrain.trainer.loop import after_closure

        after_closure(model.trainer, optimizer)  # on_before_optimizer_step, then configure_gradient_clipping

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM):
        """What the module's clip_gradients (and so configure_gradient_clipping's default) calls: by value or by
        total norm; nothing where clip_val <= 0."""
        if clip_val > 0 and getattr(self, "scaler", None) is not None and \
                getattr(optimizer, "_step_supports_amp_scaling", False):
            raise RuntimeError(  # (Lightning's words)
                f"The current optimizer, {type(optimizer).__qualname__}, does not allow for gradient clipping because "
                "it performs unscaling of gradients internally. HINT: Are you using a 'fused' optimizer?")
        _clip_by(self, optimizer, clip_val, gradient_clip_algorithm)

    # The gradients as they are, as Lightning's: unscaled already in the Trainer's step (optimizer_step above), still
    # scaled where a manual step's clip_gradients comes before its opt.step()
    def clip_grad_by_value(self, optimizer, clip_val):
        torch.nn.utils.clip_grad_value_(list(self.main_params(optimizer)), clip_value=clip_val)

    def clip_grad_by_norm(self, optimizer, clip_val):
        torch.nn.utils.clip_grad_norm_(list(self.main_params(optimizer)), clip_val)

    def main_params(self, optimizer):
        """The parameters clipped: the optimizer's."""
        for group in optimizer.param_groups:
            yield from group["params"]

    # Fabric's hooks (Lightning's Trainer calls neither): as Lightning's defaults
    def convert_output(self, data):
        return data

    def unscale_gradients(self, optimizer):
        return None


def _overrides(cls, names):
    """Whether a class of one's own in `cls`'s MRO (outside tasktrain) defines one of `names` (kept per class)."""
    key = (cls, names)
    if key not in _OVERRIDES:
        _OVERRIDES[key] = any(name in vars(c) for c in cls.__mro__ if not c.__module__.startswith("tasktrain.")
                              for name in names)
    return _OVERRIDES[key]


_OVERRIDES = {}


class Precision(_LightningHooks, _core.Precision, metaclass=abc.ABCMeta):
    """"32-true" (Lightning's base plugin: no casting, no scaling)."""

    def __init__(self):
        super().__init__(_LATER)

    @classmethod
    def __subclasshook__(cls, subclass):
        # The plugin a Trainer builds for a precision name is the core's class of that name: it is Lightning's plugin
        # of that name, as Lightning's Trainer(precision="bf16-mixed").precision_plugin is its MixedPrecision
        # (isinstance(trainer.precision_plugin, MixedPrecision)). A subclass of one's own keeps the plain rule.
        core = _STANDS_FOR.get(cls) or _engine_core(cls)
        if core is not None and issubclass(subclass, core):
            return True
        return NotImplemented


class DoublePrecision(Precision, _core.DoublePrecision):
    """"64-true": the module and floating point inputs in float64. (Each plugin derives from Precision, as each of
    Lightning's does, so that isinstance(plugin, Precision) holds for all of them.)"""

    def __init__(self):
        _core.DoublePrecision.__init__(self, _LATER)


class HalfPrecision(Precision, _core.HalfPrecision):
    """"16-true" (default) or "bf16-true": the parameters stored in half, no autocast, no scaling."""

    def __init__(self, precision: Literal["bf16-true", "16-true"] = "16-true"):
        if precision not in ("16-true", "bf16-true"):
            raise ValueError(f"HalfPrecision(precision={precision!r}): use '16-true' or 'bf16-true'.")
        _core.HalfPrecision.__init__(self, precision, None)  # (the fp16-on-CPU note is the strategy's, once it knows the device)


class MixedPrecision(Precision, _core.MixedPrecision):
    """"16-mixed" (autocast float16 + GradScaler) or "bf16-mixed" (autocast bfloat16) on `device` ("cpu", "cuda");
    `scaler`: a torch.amp.GradScaler of one's own for "16-mixed"."""

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed"],
        device: str,
        scaler: Optional["torch.amp.GradScaler"] = None,
    ):
        if precision not in ("16-mixed", "bf16-mixed"):  # (Lightning's words)
            raise ValueError(f"`Passed `{type(self).__name__}(precision={precision!r})`. Precision must be '16-mixed' "
                             "or 'bf16-mixed'.")
        if scaler is not None and precision == "bf16-mixed":
            raise MisconfigurationException(f"`precision='bf16-mixed'` does not use a scaler, found {scaler}.")
        _core.MixedPrecision.__init__(self, precision, device)
        if scaler is not None:
            self.scaler = scaler

    def autocast_context_manager(self):
        """Lightning's: the torch.autocast that forward_context (and so each step's context) enters; a subclass
        overrides it to autocast otherwise."""
        return _core.MixedPrecision.autocast(self)

    def forward_context(self):
        return self.autocast_context_manager()


_STANDS_FOR = {Precision: _core.Precision, DoublePrecision: _core.DoublePrecision, HalfPrecision: _core.HalfPrecision,
               MixedPrecision: _core.MixedPrecision}

_ENGINE_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


_STANDALONE = ("autocast", "tensor_init_context", "module_init_context", "convert_module", "convert_input")


def _standalone_plugin(name):
    """The plain plugin of a precision name, for an engine's plugin used on its own (no engine to ask)."""
    if name in ("16-true", "bf16-true"):
        return _core.HalfPrecision(name, "cuda")  # (the device only decides a warning about fp16 on CPU)
    if name in ("16-mixed", "bf16-mixed"):
        return _core.MixedPrecision(name, "cuda" if torch.cuda.is_available() else "cpu")
    return _core.Precision()


def _engine_core(cls):
    """The plugin an engine strategy builds for a precision name (strategy="deepspeed", "fsdp"), for Lightning's
    DeepSpeedPrecision and FSDPPrecision: Lightning's Trainer(precision=..., strategy="deepspeed").precision_plugin
    is its DeepSpeedPrecision. Imported when first asked (the strategies' modules are heavier than this one)."""
    if cls is DeepSpeedPrecision:
        from tasktrain.strategies.deepspeed.strategy import DeepSpeedPrecision as core
    elif cls is FSDPPrecision:
        from tasktrain.strategies.fsdp.strategy import FSDPPrecision as core
    else:
        return None
    return core


class _EnginePrecision(Precision):
    """A precision name for an engine strategy, which runs its own plugin of that name (Strategy.adopt_precision):
    the strategy keeps calling its own plugin (`strategy.precision`), while this object is Lightning's plugin
    (`trainer.precision_plugin`, `strategy.precision_plugin`). A subclass's overrides of Lightning's hooks
    (CALLED_HOOKS) are called where Lightning's Trainer and its DeepSpeed / FSDP strategies call them (attach_hooks);
    each default is what the engine's own plugin does, so a subclass calling super() trains as no subclass does.
    ENGINE_REFUSED_HOOKS are refused (tasktrain/trainer/plugin_args.py says why).

    A Precision (this module's), as Lightning's DeepSpeedPrecision and FSDPPrecision are Lightning's Precision:
    isinstance(plugin, Precision) holds, and Lightning's hooks this class does not define are Precision's
    (convert_output, unscale_gradients: Fabric's, never called by either Trainer). What the strategy calls on a
    plugin it runs (step_context, run_backward, run_step, cast_moved_batch, converts_before_transfer) stays the core
    plugin's: the engine's own plugin runs the steps, not this object."""

    _runs = None  # the engine's own plugin this one was attached to
    _standalone = None  # before that, the plain plugin of its name that its contexts use (_own)
    _strategy = None  # the strategy that runs it
    step_context = _core.Precision.step_context
    converts_before_transfer = _core.Precision.converts_before_transfer
    run_backward = _core.Precision.run_backward
    run_step = _core.Precision.run_step
    cast_moved_batch = _core.Precision.cast_moved_batch

    def __init__(self, precision: Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]):
        if precision not in _ENGINE_PRECISIONS:
            raise ValueError(f"{type(self).__name__}(precision={precision!r}): use one of {_ENGINE_PRECISIONS}.")
        _core.Precision.__init__(self, _LATER)
        self.name = precision

    def attach_hooks(self, own, strategy):
        """The engine strategy's own plugin `own`, which `strategy` runs, with this subclass's overrides of Lightning's
        hooks in its place (each override's super() reaches `own`'s method), and the checkpoint's state under this
        class's __qualname__, as Lightning keys it. Returns `own`."""
        self._runs, self._strategy = own, strategy
        cls = type(self)
        if not _overrides(cls, CALLED_HOOKS):
            return own
        own.step_context = functools.partial(_attached_step_context, self, own)
        own.autocast = self.forward_context  # (strategy.forward_context() outside the module's steps)
        for name in ("convert_module", "tensor_init_context", "module_init_context", "connect", "state_dict",
                     "load_state_dict", "on_save_checkpoint", "on_load_checkpoint", "teardown"):
            if _overrides(cls, (name,)):
                setattr(own, name, getattr(self, name))
        if _overrides(cls, ("convert_input",)):
            # Lightning's place: on the batch as the loader gave it, before the transfer hooks (tasktrain/trainer/run.py)
            own.convert_input, own.converts_before_transfer = self.convert_input, True
            own.cast_moved_batch = _as_it_is
        if self.lightning_steps:
            # the Trainer's step runs through this object's step hooks (strategy.precision_plugin); the strategy's
            # backward and step reach them through its own plugin's run_backward / run_step
            own.lightning_steps = True
            own.run_backward = functools.partial(_attached_run_backward, own)
            own.run_step = functools.partial(_attached_run_step, self, own)
        own.checkpoint_key = cls.__qualname__  # (resume.precision_key)
        return own

    def _own(self, name):
        """`self._runs`'s own method `name` (its class's: an attached override is an attribute of the instance). Not
        attached yet, the contexts and casts of its precision name work on their own, as Lightning's plugin's do
        (`with DeepSpeedPrecision("16-true").module_init_context():` builds in float16); the rest needs its engine."""
        if self._runs is None and name in _STANDALONE:
            if self._standalone is None:
                self._standalone = _standalone_plugin(self.name)
            return getattr(type(self._standalone), name).__get__(self._standalone)
        if self._runs is None:
            raise RuntimeError(f"{type(self).__name__}.{name}: the plugin is not attached to a strategy yet (pass it "
                               "in Trainer(plugins=[...]) with its engine's strategy).")
        return getattr(type(self._runs), name).__get__(self._runs)

    @property
    def lightning_steps(self):
        """Whether the Trainer's step runs through this plugin's step hooks (a subclass overrides one of STEP_HOOKS);
        False: tasktrain's own engine step, which computes what their defaults compute."""
        return _overrides(type(self), STEP_HOOKS)

    @property
    def skipped_steps(self):
        """The steps the engine skipped (fp16 overflow): its own plugin's count."""
        return self._runs.skipped_steps if self._runs is not None else 0

    @skipped_steps.setter
    def skipped_steps(self, value):
        if self._runs is not None:
            self._runs.skipped_steps = value

    # -- Lightning's defaults: the engine's own plugin's ----------------------------------------------------------
    def autocast(self):
        return self.forward_context()

    def forward_context(self):
        """The context of every step (each step context enters it, as Lightning's): the engine's own plugin's autocast
        (FSDP's mixed precisions: torch.autocast; DeepSpeed: none, the engine casts; "-true": the default dtype)."""
        return self._own("autocast")()

    # (train/val/test/predict_step_context: _LightningHooks' defaults, each entering forward_context() above)
    def convert_module(self, module):
        return self._own("convert_module")(module)

    def tensor_init_context(self):
        return self._own("tensor_init_context")()

    def module_init_context(self):
        return self._own("module_init_context")()

    def convert_input(self, data):
        return self._own("convert_input")(data)

    def convert_output(self, data):  # (Fabric's: Lightning's Trainer never calls it)
        return data

    def connect(self, model, optimizers, lr_schedulers):
        return self._own("connect")(model, optimizers, lr_schedulers)

    def state_dict(self):
        return self._own("state_dict")()

    def load_state_dict(self, state_dict):
        return self._own("load_state_dict")(state_dict)

    def on_save_checkpoint(self, checkpoint):
        return self._own("on_save_checkpoint")(checkpoint)

    def on_load_checkpoint(self, checkpoint):
        return self._own("on_load_checkpoint")(checkpoint)

    def teardown(self):
        return self._own("teardown")()

    # -- the step's hooks, Lightning's arguments (Strategy.backward / optimizer_step of lightning/pytorch/strategies/
    # strategy.py); the defaults do what tasktrain's engine step does ---------------------------------------------
    def pre_backward(self, tensor, module):
        """Before the backward: the loss scaled where the engine's own plugin holds a GradScaler (FSDP's "16-mixed":
        its ShardedGradScaler; DeepSpeed scales inside its engine), then on_before_backward with it (Lightning's).
        Returns the tensor to backward."""
        scaler = getattr(self._runs, "scaler", None)
        if scaler is not None:
            tensor = scaler.scale(tensor)
        module.trainer._call("on_before_backward", tensor)
        return tensor

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        """The backward itself (`optimizer`: None in manual optimisation): the engine's (engine_backward)."""
        self._engine_backward(tensor, model, *args, **kwargs)

    def post_backward(self, tensor, module):
        """After the backward: on_after_backward; returns the loss without its graph."""
        closure_loss = tensor.detach()
        module.trainer._call("on_after_backward")
        return closure_loss

    def _after_closure(self, model, optimizer):
        from tasktrain.trainer.loop import after_closure

        after_closure(model.trainer, optimizer)  # on_before_optimizer_step, then configure_gradient_clipping

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM):
        """What the module's clip_gradients (and so configure_gradient_clipping's default) calls: by value or by
        total norm, through the strategy's clipping (FSDP: the norm over all shards; DeepSpeed: its engine clips by
        norm inside its step, and a value the engine was not given is an error); nothing where clip_val <= 0."""
        _clip_by(self, optimizer, clip_val, gradient_clip_algorithm)

    def clip_grad_by_value(self, optimizer, clip_val):
        self._strategy.clip_gradients(optimizer, max_value=float(clip_val), unscale=False)

    def clip_grad_by_norm(self, optimizer, clip_val):
        self._strategy.clip_gradients(optimizer, max_norm=float(clip_val), unscale=False)

    def main_params(self, optimizer):
        """The parameters of the optimizer (Lightning's)."""
        for group in optimizer.param_groups:
            yield from group["params"]


def _as_it_is(batch):
    return batch


def _attached_step_context(plugin, own, step):
    """An attached engine plugin's step context: the subclass's hook of that step kind (Lightning's), else own's."""
    if step in _STEP_CONTEXTS:
        return getattr(plugin, _STEP_CONTEXTS[step])()
    return plugin.forward_context()


def _attached_run_backward(own, loss, *args, backward_fn=None, **kwargs):
    """The strategy's backward where the Trainer's step runs the plugin's hooks: `backward_fn` calls the plugin's
    backward (pre_backward scaled the loss already); elsewhere (a script's own backward) own's."""
    if backward_fn is not None:
        backward_fn(loss, *args, **kwargs)
    else:
        type(own).run_backward(own, loss, *args, **kwargs)


def _attached_run_step(plugin, own, optimizer, closure=None, model=None, **kwargs):
    """The strategy's step where the Trainer's step runs the plugin's hooks: the plugin's optimizer_step (which runs
    the closure and the engine's step); returns whether the engine stepped (its own plugin counts the skipped)."""
    if model is None:
        return type(own).run_step(own, optimizer, closure, **kwargs)
    skipped = own.skipped_steps
    own.last_step_output = plugin.optimizer_step(optimizer, model=model, closure=closure, **kwargs)
    return own.skipped_steps == skipped


class DeepSpeedPrecision(_EnginePrecision):
    """Lightning's DeepSpeedPrecision(precision): DeepSpeed's own precision of that name (strategy='deepspeed...')."""

    engine = "DeepSpeed"

    def _engine_backward(self, tensor, model, *args, **kwargs):
        # Lightning's: deepspeed_engine.backward(tensor, *args, **kwargs) (the module's own backward is refused
        # before training, where Lightning warns and ignores it)
        self._strategy.engine_backward(tensor, *args, **kwargs)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        """Lightning's: the closure (training_step, backward), on_before_optimizer_step and the clipping, then the
        engine's step (which clips, steps and zeroes the gradients; it skips a step whose fp16 gradients overflowed).
        Returns what the engine's step returned."""
        closure_result = closure()
        self._after_closure(model, optimizer)
        if closure_result is None and model.automatic_optimization:
            return closure_result  # (no backward ran: the strategy refuses skipping a batch before this)
        return self._strategy.engine_step(optimizer, **kwargs)


class FSDPPrecision(_EnginePrecision):
    """Lightning's FSDPPrecision(precision, scaler=None): FSDP's own precision of that name (strategy='fsdp')."""

    engine = "FSDP"

    def __init__(
        self,
        precision: Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"],
        scaler: Optional["ShardedGradScaler"] = None,
    ):
        if scaler is not None:
            raise ValueError(f"FSDPPrecision({precision!r}, scaler=...): FSDP builds its ShardedGradScaler itself for "
                             "'16-mixed'; leave scaler out.")
        super().__init__(precision)

    @property
    def scaler(self):
        """Lightning's attribute: the ShardedGradScaler of "16-mixed" (the engine's own plugin's), else None."""
        return getattr(self._runs, "scaler", None)

    def _engine_backward(self, tensor, model, *args, **kwargs):
        model.backward(tensor, *args, **kwargs)  # (Lightning's Precision.backward: the module's backward)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        """Lightning's FSDPPrecision.optimizer_step: without a scaler the optimizer steps with the closure (which runs
        training_step, backward, on_before_optimizer_step and the clipping); "16-mixed" runs the closure, unscales,
        then on_before_optimizer_step and the clipping, then steps through the ShardedGradScaler. Returns what the
        optimizer's step returned."""
        own = self._runs
        scaler = getattr(own, "scaler", None)
        if scaler is None:
            type(own).optimizer_step(own, optimizer, functools.partial(self._wrap_closure, model, optimizer, closure),
                                     **kwargs)
            return own.last_step_output
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization  # no backward ran: nothing to unscale or step
        if not skip:
            own.unscale(optimizer)  # before on_before_optimizer_step and the clipping read the gradients
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        before = scaler.get_scale()
        output = scaler.step(optimizer, **kwargs)
        scaler.update()
        own._unscaled.discard(id(optimizer))
        if scaler.get_scale() < before:  # (the scaler lowers its scale where it skipped the step)
            own.skipped_steps += 1
        return output

    def _wrap_closure(self, model, optimizer, closure):
        closure_result = closure()
        self._after_closure(model, optimizer)
        return closure_result


# Lightning's precision plugins in annotations (a strategy's precision_plugin, the Trainer's plugins): its Precision and
# the classes of Lightning's names, so that jsonargparse (TaskCLI) finds them by Lightning's class names; tasktrain's
# core precisions share some of those names.
_PRECISION_PLUGIN = Union[Precision, DoublePrecision, HalfPrecision, MixedPrecision, _EnginePrecision]


class _Unavailable(Precision):  # (a Precision, as Lightning's are; none can be built)
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

