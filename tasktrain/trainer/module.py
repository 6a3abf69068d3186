"""TaskModule: the user's model plus the hooks the Trainer calls."""
import argparse
import contextlib
import copy
import dataclasses
import functools
import inspect
import numbers
import pickle
import sys
import warnings
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch.optim import Optimizer

from tasktrain.checkpoint_io import open_for_writing
from tasktrain.exceptions import LightningDeprecationWarning, MisconfigurationException
from tasktrain.trainer.metrics import is_metric_object
from tasktrain.tree import apply_to_leaves

if TYPE_CHECKING:
    from tasktrain.callbacks.base import Callback
    from tasktrain.trainer.optim import LightningOptimizer

# what a step returns (Lightning's STEP_OUTPUT, `tasktrain.utilities.types.STEP_OUTPUT`): a loss, a dict with one, None
STEP_OUTPUT = Optional[Union[torch.Tensor, Mapping[str, Any]]]

_NOT_SET = object()
# Lightning's reduce_fx callables, by the name the metric store reduces with
_REDUCE_NAMES = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min", sum: "sum", max: "max",
                 min: "min", "avg": "mean"}


TORCHSCRIPT_DEPRECATION = (
    "`TaskModule.to_torchscript` has been deprecated in v2.7 and will be removed in v2.8 (Lightning's versions: "
    "tasktrain follows `LightningModule.to_torchscript`'s deprecation). TorchScript is deprecated in PyTorch. Use "
    "`torch.export.export()` for model exporting instead. See https://pytorch.org/docs/stable/export.html for more "
    "information.")


@contextlib.contextmanager
def jit_is_scripting():
    """While torch.jit scripts or traces a module, which probes every attribute: `module.trainer` of an unattached
    TaskModule (of any TaskModule inside it too) is None there, not an error (Lightning's _jit_is_scripting)."""
    TaskModule._jit_is_scripting = True
    try:
        yield
    finally:
        TaskModule._jit_is_scripting = False


class AttributeDict(dict):
    """A dict whose keys read as attributes: `self.hparams.lr`."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"No hyper-parameter {key!r}; saved ones: {sorted(self)}") from err

    def __setattr__(self, key, value):
        self[key] = value


# The hyper-parameters a TaskCLI with load_from_checkpoint_support hands to the module or DataModule it is building
# (the config as parsed, with "_class_path" and "_instantiator"): while set, save_hyperparameters() stores these in
# place of what __init__ received (Lightning's _given_hyperparameters), so load_from_checkpoint can rebuild the same
# class through the same parser.
_given_hyperparameters = ContextVar("tasktrain_given_hyperparameters", default=None)


@contextlib.contextmanager
def given_hyperparameters(hparams, instantiator):
    """While open, save_hyperparameters() stores `hparams` plus {"_instantiator": instantiator}: the name, from
    ALLOWED_INSTANTIATORS, of the function load_from_checkpoint rebuilds the object with."""
    token = _given_hyperparameters.set({**hparams, "_instantiator": instantiator})
    try:
        yield
    finally:
        _given_hyperparameters.reset(token)


# The instantiators a checkpoint's "_instantiator" hyper-parameter may name (TaskCLI's, and LightningCLI's, which
# tasktrain's instantiate_module stands in for): a checkpoint naming anything else is refused, never imported.
ALLOWED_INSTANTIATORS = {"tasktrain.cli.instantiate_module", "lightning.pytorch.cli.instantiate_module",
                         "pytorch_lightning.cli.instantiate_module"}


def is_imported_subclass(class_path, cls):
    """Whether `class_path` ("package.module.Class") names a subclass of `cls` in a module already imported: looked up
    in sys.modules only, so checking a checkpoint never imports (runs) code it names."""
    if not isinstance(class_path, str):
        return False
    module_name, _, name = class_path.rpartition(".")
    target = getattr(sys.modules.get(module_name), name, None)
    return isinstance(target, type) and issubclass(target, cls)


def checkpoint_instantiator(cls, hparams):
    """The function that rebuilds `cls` from a checkpoint's hyper-parameters (popped from them: "_instantiator"), or
    None where they name none. Lightning's trust rule: the name must be in ALLOWED_INSTANTIATORS, and a "_class_path"
    must name an already imported subclass of `cls` (the class load_from_checkpoint is called on)."""
    name = hparams.pop("_instantiator", None)
    if name is None:
        return None
    if not isinstance(name, str) or name not in ALLOWED_INSTANTIATORS:
        raise ValueError(f"{cls.__name__}.load_from_checkpoint: the checkpoint names the instantiator {name!r}, which "
                         f"is not one of {sorted(ALLOWED_INSTANTIATORS)}, so it was not imported or called (a "
                         "checkpoint must not choose the code that runs). If you trust the file, remove its "
                         "'_instantiator' hyper-parameter, or add the name to "
                         "tasktrain.trainer.module.ALLOWED_INSTANTIATORS before loading.")
    class_path = hparams.get("_class_path")
    if class_path is not None and not is_imported_subclass(class_path, cls):
        raise ValueError(f"{cls.__name__}.load_from_checkpoint: the checkpoint asks for the class {class_path!r}, "
                         f"which is not a subclass of {cls.__name__} in a module already imported, so nothing was "
                         "imported or built (a checkpoint must not choose the code that runs). If you trust the file, "
                         "import the module that defines the class before loading.")
    from tasktrain.cli.task_cli import instantiate_module

    return instantiate_module


def _not_implemented(hook):
    """Lightning's error for a loader hook the class does not define, called anyway."""
    return MisconfigurationException(f"`{hook}` must be implemented to be used with the Trainer")


class TaskModule(torch.nn.Module):
    automatic_optimization = True
    # where a checkpoint keeps save_hyperparameters()'s values, and the __init__ argument they came from (Lightning's
    # keys; load_from_checkpoint reads them under the class's names)
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    prepare_data_per_node = True  # prepare_data on each machine's local rank 0 (False: local rank 0 of node 0 only)
    # Properties torch.jit.script must not compile (they read the trainer or iterate parameters).
    __jit_unused_properties__ = ["trainer", "hparams", "hparams_initial", "device", "dtype", "logger", "loggers",
                                 "global_step", "current_epoch", "global_rank", "local_rank", "device_mesh",
                                 "on_gpu", "fabric", "strict_loading", "_current_fx_name"]
    # True while torch.jit scripts or traces a module (jit_is_scripting()): on the class, as Lightning's, so that
    # every TaskModule inside the one exported reads it; `trainer` is then None on an unattached module, not an error
    _jit_is_scripting = False

    def __init__(self):
        super().__init__()
        # Plain attributes, not submodules: the trainer must never become part of the state dict.
        object.__setattr__(self, "_trainer", None)
        object.__setattr__(self, "_hparams", AttributeDict())
        object.__setattr__(self, "_strict_loading", None)  # None: not set (strict_loading reads True)
        # each parameter's requires_grad from before toggle_optimizer, until untoggle_optimizer (Lightning's name:
        # empty when no optimizer is toggled)
        object.__setattr__(self, "_param_requires_grad_state", {})
        # Lightning's DataHooks.__init__ sets it on the instance: set it after super().__init__() to change it (a
        # class attribute of a subclass is shadowed, as under Lightning)
        self.prepare_data_per_node = True
        # Lightning's too: a loader of zero length on this rank while other ranks have batches is refused unless
        # this is True (then a warning: guards.check_zero_length_ranks)
        self.allow_zero_length_dataloader_with_multiple_devices = False

    # -- what the user writes ----------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define `def training_step(self, batch, batch_idx)` "
            "returning the loss tensor (or a dict with a 'loss' key)."
        )

    # validation_step and test_step are optional: the Trainer runs a loop only where a subclass overrides them
    # (Lightning's base defines both, doing nothing, so that a subclass may call super() and hooks see them)
    def validation_step(self, *args, **kwargs):
        """One validation batch: log what it measures (self.log); what it returns goes to on_validation_batch_end."""

    def test_step(self, *args, **kwargs):
        """One test batch: log what it measures (self.log); what it returns goes to on_test_batch_end."""


    def predict_step(self, *args, **kwargs):
        """One predict batch: Lightning's default, self(batch) with the whole batch (a loader of (x, y) pairs gives
        forward the pair: define predict_step to pick x). The batch is the first positional argument, or batch=."""
        if "batch" in kwargs:
            return self(kwargs["batch"])
        if not args:
            raise TypeError(
                f"{type(self).__name__}.predict_step() got no batch: pass it first, predict_step(batch, batch_idx), "
                "or as batch=."
            )
        return self(args[0])

    def configure_optimizers(self):
        raise NotImplementedError(
            f"{type(self).__name__} has no configure_optimizers. Define it to return an optimizer, e.g. "
            "`return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
        )

    # The loader hooks a subclass defines; the base's raise Lightning's error, so that calling one the class does not
    # define says so (the Trainer never calls them: it asks is_overridden first and takes "no loader" instead).
    def train_dataloader(self) -> Any:
        raise _not_implemented("train_dataloader")

    def val_dataloader(self) -> Any:
        raise _not_implemented("val_dataloader")

    def test_dataloader(self) -> Any:
        raise _not_implemented("test_dataloader")

    def predict_dataloader(self) -> Any:
        raise _not_implemented("predict_dataloader")

    # -- hooks (no-ops; the Trainer calls only the ones a subclass overrides) -------------------------------------
    # (Lightning's annotations)
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]: ...
    def on_train_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Optional[Any], batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...

    # Called only where a subclass overrides them (Lightning's points: see docs/lightning.md).
    def prepare_data(self) -> None: ...  # once per machine (local rank 0; node 0's with prepare_data_per_node=False)
    def configure_model(self) -> None: ...  # after setup(stage), before configure_optimizers, at every entry point

    def configure_callbacks(self) -> Union[Sequence["Callback"], "Callback"]:
        """Callbacks of this module; each replaces the trainer's callbacks of the same type."""
        return []

    # The evaluation loops put the module in eval mode through these (the default is Lightning's).
    # Lightning's defaults switch trainer.model (the DDP / DeepSpeed wrapper the forward goes through, or the module);
    # the loop then gives each of the module's submodules its mode back, the wrapper stays as the hook left it
    def on_validation_model_eval(self) -> None:
        self._run_model().eval()

    def on_validation_model_train(self) -> None:
        self._run_model().train()

    def on_validation_model_zero_grad(self) -> None:
        self.zero_grad()  # (set_to_none=True, torch's default)

    def on_test_model_eval(self) -> None:
        self._run_model().eval()

    def on_test_model_train(self) -> None:
        self._run_model().train()

    def on_predict_model_eval(self) -> None:
        self._run_model().eval()

    def _run_model(self):
        return self._trainer.model if self._trainer is not None else self

    # The batch on its way to the device: on_before_batch_transfer -> transfer_batch_to_device ->
    # on_after_batch_transfer. Without an override the strategy moves it (and applies the precision's input cast).
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        from tasktrain.strategies.base import move_to_device

        return move_to_device(batch, device)

    def _on_before_batch_transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """Lightning's: on_before_batch_transfer, the attached trainer's DataModule's where it overrides it."""
        return self._call_batch_hook("on_before_batch_transfer", batch, dataloader_idx)

    def _apply_batch_transfer_handler(self, batch: Any, device: Optional[torch.device] = None,
                                      dataloader_idx: int = 0) -> Any:
        """Lightning's: transfer_batch_to_device to `device` (default the module's), then on_after_batch_transfer;
        strategy.batch_to_device runs it. In a Trainer's run, as that run moves its batches (trainer._batch_transfer:
        the DataModule's hooks where it overrides them, the strategy's move for a transfer hook not overridden)."""
        run_transfer = getattr(self._trainer, "_batch_transfer", None)
        if run_transfer is not None:
            return run_transfer(batch, device, dataloader_idx)
        batch = self._call_batch_hook("transfer_batch_to_device", batch, device or self.device, dataloader_idx)
        return self._call_batch_hook("on_after_batch_transfer", batch, dataloader_idx)

    def _call_batch_hook(self, name: str, *args: Any) -> Any:
        """Lightning's: the attached trainer's DataModule's batch hook where it overrides it, else the module's."""
        datamodule = getattr(self._trainer, "datamodule", None)
        if datamodule is not None:
            from tasktrain.trainer.datamodule import DataModule

            if is_overridden(name, datamodule, DataModule):
                return getattr(datamodule, name)(*args)
        return getattr(self, name)(*args)

    def lr_scheduler_step(self, scheduler: Union[torch.optim.lr_scheduler.LRScheduler,
                                                 torch.optim.lr_scheduler.ReduceLROnPlateau],
                          metric: Optional[Any]) -> None:
        """Step one scheduler (Lightning's hook: override it for a scheduler with another step signature)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def __getstate__(self):
        # A copy or a pickle of the module (AveragedModel's deepcopy, a spawned worker) never takes the trainer along.
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state

    # -- what the trainer gives the module ---------------------------------------------------------------------
    @property
    def trainer(self):
        if self._trainer is None and self._jit_is_scripting:
            return None  # torch.jit.script probes every attribute: not an error while it does
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`. "
                               "(Call trainer.fit(module) first.)")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer):
        # an inner TaskModule (an ensemble's members) gets the same trainer, so its self.log / self.trainer work
        # inside the outer one's run (Lightning's setter)
        for child in self.children():
            if isinstance(child, TaskModule):
                child.trainer = trainer
        object.__setattr__(self, "_trainer", trainer)

    @property
    def _current_fx_name(self):
        """Lightning's: the name of the hook (the module's or a callback's) the Trainer is running, None outside
        one: the hook self.log checks against (the run's metric store names it: metrics.in_hook / hook_scope)."""
        if self._trainer is None:
            return None
        metrics = self._trainer._metrics
        return metrics.fx if metrics is not None else self._trainer._fx_outside_run

    @_current_fx_name.setter
    def _current_fx_name(self, name):
        # (Lightning's tests set it to call self.log as if from that hook: the run's store is where it lives)
        metrics = self._trainer._metrics if self._trainer is not None else None
        if metrics is None:
            raise AttributeError(f"{type(self).__name__}._current_fx_name can only be set during a Trainer run (it "
                                 "names the hook the run is in, for self.log).")
        metrics.fx = name

    @property
    def device_mesh(self):
        """The DeviceMesh to parallelize on in configure_model (ModelParallelStrategy), or None."""
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    @property
    def strict_loading(self) -> bool:
        """Lightning's: whether a checkpoint's weights must match the module's keys exactly, at a fit's resume
        (ckpt_path=) and in load_from_checkpoint. False: missing and unexpected keys are allowed (and said)."""
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict_loading):
        object.__setattr__(self, "_strict_loading", strict_loading)

    @property
    def fabric(self):
        """Lightning's module under Lightning Fabric; tasktrain's modules never are: None."""
        return None

    @fabric.setter
    def fabric(self, fabric):
        if fabric is not None:
            raise TypeError(f"{type(self).__name__}.fabric = {type(fabric).__name__}: a tasktrain module does not run "
                            "under Lightning Fabric; train it with tasktrain.Trainer (or tasktrain.Accelerator).")

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def remove_ignored_hparams(self, ignore_list):
        """Drop hyper-parameters an earlier save_hyperparameters (a base class's) stored (Lightning's)."""
        for key in ignore_list:
            self._hparams.pop(key, None)

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the first floating-point parameter (float32 for a module without one)."""
        for p in self.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    @property
    def logger(self):
        """The trainer's first logger, or None (no trainer, or logger=False)."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self):
        return self._trainer.loggers if self._trainer is not None else []

    # -- export ----------------------------------------------------------------------------------------------
    example_input_array = None  # what to_torchscript(method="trace") and to_onnx use when given no input

    def to_torchscript(self, file_path=None, method="script", example_inputs=None, **kwargs):
        """A TorchScript copy of the module in eval mode (torch.jit.script, or torch.jit.trace with
        example_inputs / self.example_input_array), saved to file_path when given (a local path or an fsspec URL),
        as Lightning's method. Deprecated, as Lightning 2.6 deprecates it (torch deprecates TorchScript): use
        torch.export.export(). A traced input (and trace's check_inputs) goes through the batch hooks
        (on_before_batch_transfer, transfer_batch_to_device to the module's device, on_after_batch_transfer)."""
        warnings.warn(TORCHSCRIPT_DEPRECATION, LightningDeprecationWarning, stacklevel=2)
        mode = self.training
        if method == "script":
            with jit_is_scripting():
                scripted = torch.jit.script(self.eval(), **kwargs)
        elif method == "trace":
            if example_inputs is None:
                if self.example_input_array is None:
                    raise ValueError("Choosing method=`trace` requires either `example_inputs` or "
                                     "`model.example_input_array` to be defined.")
                example_inputs = self.example_input_array
            if kwargs.get("check_inputs") is not None:
                kwargs["check_inputs"] = self._example_to_device(kwargs["check_inputs"])
            example_inputs = self._example_to_device(example_inputs)
            with jit_is_scripting():
                scripted = torch.jit.trace(func=self.eval(), example_inputs=example_inputs, **kwargs)
        else:
            raise ValueError(f"The 'method' parameter only supports 'script' or 'trace', but value given was: {method}")
        self.train(mode)
        if file_path is not None:
            with open_for_writing(file_path) as f:
                torch.jit.save(scripted, f)
        return scripted

    def _example_to_device(self, inputs):
        """An example input as a batch reaches the step (Lightning's): the batch hooks (the attached trainer's
        DataModule's where it overrides one), to the module's device, dataloader_idx 0."""
        inputs = self._call_batch_hook("on_before_batch_transfer", inputs, 0)
        inputs = self._call_batch_hook("transfer_batch_to_device", inputs, self.device, 0)
        return self._call_batch_hook("on_after_batch_transfer", inputs, 0)

    def to_onnx(self, file_path=None, input_sample=None, **kwargs):
        """Export to ONNX with torch.onnx.export (Lightning's method; file_path None, Lightning's default: no file
        written, torch's ONNXProgram returned under dynamo=True). torch's exporter needs the onnx and onnxscript
        packages: `pip install tasktrain[onnx]`."""
        import importlib.util

        missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            raise ModuleNotFoundError(f"to_onnx needs the {' and '.join(missing)} package(s), which torch's ONNX "
                                      "exporter imports: pip install 'tasktrain[onnx]'.")
        inputs = input_sample if input_sample is not None else self.example_input_array
        if inputs is None:
            raise ValueError("to_onnx needs input_sample=, or set self.example_input_array in __init__.")
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        mode = self.training
        self.eval()
        try:
            return torch.onnx.export(self, inputs, file_path, **kwargs)
        finally:
            self.train(mode)

    def to_tensorrt(self, *args, **kwargs):
        raise NotImplementedError(
            "to_tensorrt: tasktrain does not ship a TensorRT export (it needs torch_tensorrt and a CUDA GPU). Export "
            "with to_onnx(...) and build the engine with TensorRT's tools, or call torch_tensorrt.compile yourself.")

    def freeze(self):
        """No parameter gets gradients, and eval mode (Lightning's freeze)."""
        for p in self.parameters():
            p.requires_grad = False
        return self.eval()  # (the module, as Lightning's: model.freeze().to(device) chains)

    def unfreeze(self):
        for p in self.parameters():
            p.requires_grad = True
        return self.train()

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    def print(self, *args, **kwargs):
        """print on rank 0; through the enabled progress bar when there is one (above its bar, as Lightning does)."""
        if self.global_rank == 0:
            bar = getattr(self._trainer, "progress_bar_callback", None)
            if bar is not None and getattr(bar, "is_enabled", True):
                bar.print(*args, **kwargs)
            else:
                print(*args, **kwargs)

    # -- logging -----------------------------------------------------------------------------------------------
    def log(self, name, value, prog_bar=False, logger=None, on_step=None, on_epoch=None, reduce_fx="mean",
            enable_graph=False, sync_dist=False, sync_dist_group=None, add_dataloader_idx=True, batch_size=None,
            metric_attribute=None, rank_zero_only=False, reduce=None):
        """Record a metric. Values stay tensors until a logger or the progress bar needs them.

        Lightning's options: reduce_fx is "mean"/"sum"/"max"/"min" or torch.mean/sum/max/min (or the builtins);
        with several evaluation loaders the name gets "/dataloader_idx_N" (add_dataloader_idx=False: one name, one
        value over them all); enable_graph=True keeps the value's graph; rank_zero_only=True: a value only rank 0
        logs (the call does nothing elsewhere, so it cannot be sync_dist, and callbacks on other ranks cannot
        monitor it)."""
        trainer = self._trainer
        if trainer is None:  # Lightning's: a *_step tried without a Trainer logs nothing, and says so
            warnings.warn("You are trying to `self.log()` but the `self.trainer` reference is not registered on the "
                          "model yet. This is most likely because the model hasn't been passed to the `Trainer`")
            return
        if trainer.barebones:  # (Lightning's: a warning, and nothing logged)
            warnings.warn("You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can "
                          "impact raw speed so it is disabled under this setting.")
            return
        metrics = trainer._metrics
        if metrics is None or trainer.state.fn == "predict":  # (Lightning's words; and tasktrain's outside a run)
            where = ("This is most likely because you are trying to log in a `predict` hook, but it doesn't "
                     "support logging" if metrics is not None else
                     f"self.log({name!r}, ...) was called outside a Trainer run: call it from a hook the Trainer runs")
            raise MisconfigurationException("You are trying to `self.log()` but the loop's result collection is not "
                                            f"registered yet. {where}")
        if sync_dist_group is not None:
            raise ValueError(f"self.log({name!r}, sync_dist_group=...): tasktrain reduces over all ranks only; use "
                             "sync_dist=True, or self.all_gather and reduce the part you need yourself.")
        if metric_attribute is not None and getattr(self, metric_attribute, None) is not value:
            # Lightning names the attribute that holds a logged Metric with it: it must be that attribute
            raise ValueError(f"self.log({name!r}, metric_attribute={metric_attribute!r}): the value logged is not "
                             f"self.{metric_attribute}. Pass the Metric that attribute holds, or drop metric_attribute.")
        if rank_zero_only:
            if sync_dist:
                raise ValueError(f"self.log({name!r}, rank_zero_only=True, sync_dist=True): a value logged on rank "
                                 "0 alone cannot be synchronised (the other ranks would never join). Drop one.")
            if trainer.global_rank != 0:
                return
        reduce_fx = reduce or reduce_fx
        if isinstance(reduce_fx, str):
            reduce_fx = reduce_fx.lower()  # (Lightning's: "SUM", "Max", "avg" too)
        reduce_fx = _REDUCE_NAMES.get(reduce_fx, reduce_fx)
        if add_dataloader_idx and "/dataloader_idx_" in name:  # the loop adds it: Lightning's refusal
            raise MisconfigurationException(f"You called `self.log` with the key `{name}` but it should not contain "
                                            "information about `dataloader_idx` when `add_dataloader_idx=True`")
        if metric_attribute is None and is_metric_object(value):
            # Lightning's: a logged Metric is one of the module's attributes (its state is the module's, saved with
            # it); the attributes are looked up once per run
            attributes = metrics.metric_attributes
            if attributes is None:
                attributes = metrics.metric_attributes = {
                    id(module): attr for attr, module in self.named_modules() if is_metric_object(module)}
            if id(value) not in attributes:
                fix = (f"calling `self.log({name}, ..., metric_attribute=name)` where `name` is one of "
                       f"{list(attributes.values())}" if attributes else
                       "setting an attribute for the metric in your `TaskModule`.")
                raise MisconfigurationException("Could not find the `TaskModule` attribute for the "
                                                f"`torchmetrics.Metric` logged. You can fix this by {fix}")
        if logger and not trainer.loggers:  # (asked for explicitly; the default, None, logs where there is one)
            warnings.warn(f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. You can "
                          "enable one by doing `Trainer(logger=ALogger(...))`")
        logger = True if logger is None else logger
        if add_dataloader_idx:
            name = name + metrics.dataloader_suffix
        elif metrics.dataloader_suffix:  # one of several loaders logs it unsuffixed: in that loader's results
            # Lightning keeps one value per (hook, name) and its loader: another loader logging the name so is refused
            loader = metrics.unsuffixed_loader.setdefault((metrics.fx, name), metrics.dataloader_suffix)
            if loader != metrics.dataloader_suffix:
                raise MisconfigurationException(f"You called `self.log({name}, ...)` twice in `{metrics.fx}` with "
                                                "different arguments. This is not allowed")
            metrics.loader_of_name.setdefault(name, set()).add(metrics.dataloader_suffix)
        metrics.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size, enable_graph)

    def log_dict(self, dictionary: dict, **kwargs):
        """self.log of each item; a torchmetrics MetricCollection logs its metrics (shared compute-group states are
        read, not copied, as Lightning reads them)."""
        if is_metric_object(dictionary, "MetricCollection"):
            items = dictionary.items(keep_base=False, copy_state=not getattr(dictionary, "_enable_compute_groups", False))
        else:
            items = dictionary.items()
        for name, value in items:
            self.log(name, value, **kwargs)

    def all_gather(self, data, group=None, sync_grads=False):
        """Gather a tensor (or a dict/list of tensors) from every rank: a new leading dimension of world size (one
        process, SingleDeviceStrategy: the tensors as they are, as Lightning's). sync_grads=True: the gather is
        differentiable (the strategy's all_gather, as Lightning's)."""
        from tasktrain.strategies.base import every_rank

        if not every_rank(group):  # (None or torch.distributed.group.WORLD: every rank)
            raise ValueError("all_gather(group=...): tasktrain gathers from all ranks only; gather from all and "
                             "keep the rows of the ranks you need.")
        strategy = self.trainer.strategy

        def gather(leaf):
            if not isinstance(leaf, torch.Tensor):
                leaf = torch.tensor(leaf, device=strategy.root_device)
            return strategy.all_gather(leaf, sync_grads=sync_grads)

        return apply_to_leaves(data, gather)

    # -- hyper-parameters ----------------------------------------------------------------------------------------
    def save_hyperparameters(self, *names, ignore=None, frame=None, logger=True):
        """Store the calling __init__'s arguments in self.hparams (and in checkpoints); logger=True (Lightning's
        default): the loggers get them at the start of each run. `frame` (Lightning's): the __init__ frame to read
        them from, when the call is made from a helper rather than from __init__ itself. A dataclass module's are its
        fields that __init__ takes (call it from __post_init__). A name in `ignore` is also dropped from what an
        earlier call (a base class's __init__) stored, as Lightning's. In a module TaskCLI builds (its
        load_from_checkpoint_support, the default) the values are the CLI's parsed config instead, with the class path
        under "_class_path" and "_instantiator", so load_from_checkpoint rebuilds the same class (Lightning's)."""
        self._log_hyperparams = bool(logger)
        ignore = () if ignore is None else ignore  # (Lightning's default is None)
        frame = frame or inspect.currentframe().f_back
        init_args = {}
        given = _given_hyperparameters.get()
        if given is not None:  # built by TaskCLI(load_from_checkpoint_support=True): the parsed config, not __init__'s
            init_args = dict(given)
            frame = None
        elif dataclasses.is_dataclass(self):  # (Lightning's: a dataclass module's fields that __init__ takes)
            init_args = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
            frame = None
        # Walk up through the __init__ chain of subclasses so the outermost __init__'s arguments win.
        while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
            info = inspect.getargvalues(frame)
            local = info.locals
            args = {k: local[k] for k in info.args[1:] if k in local}
            if info.varargs and local.get(info.varargs):
                args[info.varargs] = list(local[info.varargs])
            if info.keywords:
                args.update(local.get(info.keywords, {}))
            init_args = {**args, **init_args}
            frame = frame.f_back
        # Lightning's hparams_name (saved beside them): "kwargs", or the __init__ argument a dict/Namespace came from
        self._hparams_name = "kwargs" if names or init_args else None
        if names and len(names) == 1 and isinstance(names[0], (dict, argparse.Namespace)):
            self._hparams_name = next((k for k, v in init_args.items()
                                       if v is names[0] or (type(v) is type(names[0]) and v == names[0])), None)
        if names and len(names) == 1 and isinstance(names[0], argparse.Namespace):
            init_args = dict(vars(names[0]))  # an argparse Namespace, as Lightning takes it
        elif names and len(names) == 1 and isinstance(names[0], dict):
            init_args = dict(names[0])
        elif names:
            missing = [n for n in names if n not in init_args]
            if missing:
                raise ValueError(f"save_hyperparameters: {missing} are not arguments of __init__ ({sorted(init_args)}).")
            init_args = {n: init_args[n] for n in names}
        ignore = [ignore] if isinstance(ignore, str) else [name for name in ignore if isinstance(name, str)]
        for name in ignore:
            init_args.pop(name, None)
        if names and len(names) == 1 and isinstance(names[0], (dict, argparse.Namespace)):
            self._hparams.clear()  # a dict or Namespace given is the hparams, replacing earlier calls' (Lightning)
        for key, value in init_args.items():
            if isinstance(value, torch.nn.Module):
                continue  # modules are weights, not hyper-parameters
            self._hparams[key] = copy.deepcopy(value) if _is_plain(value) else value
        self.remove_ignored_hparams(ignore)  # a subclass's ignore= drops what a base class's call saved (Lightning)
        # what the loggers get (Lightning's hparams_initial): the values as saved, not later changes to self.hparams
        self._hparams_initial = AttributeDict(
            {k: copy.deepcopy(v) if _is_plain(v) else v for k, v in self._hparams.items()})

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyper-parameters as save_hyperparameters() stored them (a copy), Lightning's attribute."""
        saved = self.__dict__.get("_hparams_initial")
        if saved is None:
            return AttributeDict()
        return AttributeDict({k: copy.deepcopy(v) if _is_plain(v) else v for k, v in saved.items()})

    # -- manual optimisation ---------------------------------------------------------------------------------------
    def optimizers(self, use_pl_optimizer=True):
        """The optimizers as LightningOptimizers (tasktrain.core.optimizer), the same objects at every call: step()
        goes through the Trainer's step (hooks, precision, strategy) and counts global_step (use_pl_optimizer=False:
        the torch optimizers themselves)."""
        from tasktrain.trainer.optim import lightning_optimizers

        opts = lightning_optimizers(self.trainer) if use_pl_optimizer else list(self.trainer.optimizers)
        return opts[0] if len(opts) == 1 else opts

    def toggle_optimizer(self, optimizer):
        """Only `optimizer`'s parameters require gradients until untoggle_optimizer (Lightning's, for GANs):
        the parameters of the other optimizers are switched off, and their previous state is kept."""
        optimizer = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer wraps it
        state = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        object.__setattr__(self, "_param_requires_grad_state", state)

    def untoggle_optimizer(self, optimizer):
        optimizer = getattr(optimizer, "optimizer", optimizer)
        state = self._param_requires_grad_state
        for opt in self.trainer.optimizers:
            if opt is optimizer:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in state:
                        param.requires_grad = state[param]
        object.__setattr__(self, "_param_requires_grad_state", {})

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer):
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """Clip `optimizer`'s gradients now, as they are, through the strategy: by total norm ("norm") or by value
        ("value"); the trainer's gradient_clip_val/_algorithm where not given. As Lightning's, nothing is unscaled
        here: the Trainer's step unscales "16-mixed" gradients before on_before_optimizer_step and
        configure_gradient_clipping, but in manual optimisation a call before opt.step() clips the scaled gradients
        (Lightning's MixedPrecision.clip_gradients; opt.step() unscales after). To clip the true ones there, clip in
        on_before_optimizer_step, which opt.step() calls after the unscale."""
        trainer = self.trainer
        # a value given both to the Trainer and here is ambiguous (which one clips?): Lightning's error, its words
        if (gradient_clip_val is not None and trainer.gradient_clip_val is not None
                and trainer.gradient_clip_val != gradient_clip_val):
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_val={trainer.gradient_clip_val!r})` and have passed "
                f"`clip_gradients(gradient_clip_val={gradient_clip_val!r})`. Please use only one of them.")
        trainer_algorithm = getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm)
        if gradient_clip_algorithm is not None:
            gradient_clip_algorithm = getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm).lower()
            if trainer_algorithm is not None and trainer_algorithm.lower() != gradient_clip_algorithm:
                raise MisconfigurationException(
                    f"You have set `Trainer(gradient_clip_algorithm={trainer_algorithm.lower()!r})` and have passed "
                    f"`clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) Please use only one of them.")
        value = gradient_clip_val if gradient_clip_val is not None else (trainer.gradient_clip_val or 0.0)
        algorithm = (gradient_clip_algorithm or trainer_algorithm or "norm").lower()
        # Lightning's checks (its words), before a value of 0 makes the call a no-op
        if not isinstance(value, (int, float)):
            raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {value}.")
        if algorithm not in ("norm", "value"):
            raise MisconfigurationException(f"`gradient_clip_algorithm` {algorithm} is invalid. Allowed algorithms: "
                                            "['value', 'norm'].")
        optimizer = getattr(optimizer, "optimizer", optimizer)
        precision = trainer.strategy.precision_plugin
        if precision.lightning_steps:  # the precision plugin's own clipping (Lightning's: also for a value of 0)
            from tasktrain.trainer.states import GradClipAlgorithmType

            precision.clip_gradients(optimizer, value, GradClipAlgorithmType(algorithm))
            return None
        if not value:
            return None
        if algorithm == "norm":
            return trainer.strategy.clip_gradients(optimizer, max_norm=float(value), unscale=False)
        return trainer.strategy.clip_gradients(optimizer, max_value=float(value), unscale=False)

    def lr_schedulers(self):
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss, *args, **kwargs):
        trainer = self.trainer
        if self.automatic_optimization:  # the loop runs the backward of what training_step returns (Lightning's error)
            raise MisconfigurationException(
                "to use manual_backward, please disable automatic optimization: set model property "
                "`automatic_optimization` as False (set `self.automatic_optimization = False` in __init__ and step "
                "the optimizers in training_step, or return the loss and let the Trainer run its backward)")
        from tasktrain.trainer.strategy_hooks import backward_hooks

        precision, hooks = trainer.strategy.precision_plugin, backward_hooks(trainer.strategy)
        if hooks is not None:  # the strategy's pre_backward / post_backward (a subclass's: Lightning's place)
            hooks[0](loss)
        if precision.lightning_steps:  # the precision plugin's step hooks (Lightning's strategy.backward(loss, None))
            def plugin_backward(tensor, *a, **k):
                precision.backward(tensor, self, None, *a, **k)

            scaled = precision.pre_backward(loss, self)  # (on_before_backward there)
            trainer.strategy.backward(scaled, None, *args, backward_fn=plugin_backward, **kwargs)
            backed = precision.post_backward(scaled, self)  # (on_after_backward there)
        else:
            trainer._call("on_before_backward", loss)
            if hook_is_called("backward", self, TaskModule):  # Lightning's: through the module's backward
                trainer.strategy.backward(loss, None, *args, backward_fn=self.backward, **kwargs)
            else:
                trainer.strategy.backward(loss, None, *args, **kwargs)
            trainer._call("on_after_backward")
            backed = loss
        if hooks is not None:
            hooks[1](backed)

    # -- optimisation hooks (automatic optimisation: tasktrain/trainer/loop.py calls them, as Lightning does) -------
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Run backward on `loss` (already scaled by the precision under fp16). Override it to run it your way, e.g.
        under tensor parallel's `loss_parallel()`. Engines that run the backward themselves (DeepSpeed) refuse an
        override before training."""
        loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Union[Optimizer, "LightningOptimizer"],
                       optimizer_closure: Optional[Callable[[], Any]] = None) -> None:
        """Step `optimizer` at the end of an accumulation window. `optimizer.step(closure=optimizer_closure)` runs the
        closure (training_step, zero_grad, backward), then on_before_optimizer_step, the clipping and the strategy's
        step (the engine's under DeepSpeed / FSDP; GradScaler may skip it). Override it for, e.g., learning-rate
        warm-up: change the learning rate, then call optimizer.step(closure=optimizer_closure)."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Clear the gradients, at each accumulation window's first micro-batch (before its backward)."""
        optimizer.zero_grad()

    def configure_gradient_clipping(self, optimizer: Optimizer, gradient_clip_val: Optional[Union[int, float]] = None,
                                    gradient_clip_algorithm: Optional[str] = None) -> None:
        """Clip at each optimizer step, after on_before_optimizer_step; receives the Trainer's gradient_clip_val and
        gradient_clip_algorithm. Default: self.clip_gradients with them."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    # -- loading -----------------------------------------------------------------------------------------------
    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                             weights_only=None, **overrides):
        """Rebuild the module from a checkpoint's saved hyper-parameters (overridden by **overrides). strict None:
        the module's strict_loading (Lightning's rule; a strict= that contradicts one the module set is refused).
        Lightning's parameters: map_location None reads the tensors onto the CPU; hparams_file (.yaml / .yml / .csv,
        as the loggers write) replaces the saved hyper-parameters; weights_only False reads any pickled object (a
        file you trust), None or True tensors and plain data only. A checkpoint of a module TaskCLI built (its
        load_from_checkpoint_support) is rebuilt through the CLI's parser from the config it recorded: called on
        TaskModule (or on a base class whose __init__ takes **kwargs), the very subclass the command line named; the
        class must be an already imported subclass of this one, and nothing the checkpoint names is imported."""
        from tasktrain.checkpoint_io import load_plain_state_dict

        ckpt = read_for_load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, weights_only)
        hparams = dict(ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        params = inspect.signature(cls.__init__).parameters
        name = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
        if name in named_init_arguments(params):  # Lightning's: save_hyperparameters(arg) took them from that argument
            hparams = {name: hparams}
        hparams.update(overrides)
        instantiator = checkpoint_instantiator(cls, hparams)
        kwargs = hparams if takes_any_keyword(cls, params, instantiator) else {
            k: v for k, v in hparams.items() if k in params}
        module = cls(**kwargs) if instantiator is None else instantiator(cls, kwargs)
        if module._strict_loading is not None and strict is not None and strict != module.strict_loading:
            raise ValueError(f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with "
                             f"`{cls.__name__}.strict_loading={module.strict_loading!r}. Please set the same value for "
                             "both of them.")  # (Lightning's words)
        strict = module.strict_loading if strict is None else strict
        if is_overridden("configure_model", module, TaskModule):  # the layers it makes are in the state dict
            module.configure_model()
        # Lightning's on_load_checkpoint sees checkpoint["hyper_parameters"] always (empty where none were saved),
        # holding the arguments given here over the saved ones: the values the module was just built with
        ckpt.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
        if overrides and isinstance(ckpt[cls.CHECKPOINT_HYPER_PARAMS_KEY], dict):
            ckpt[cls.CHECKPOINT_HYPER_PARAMS_KEY].update(overrides)
        module.on_load_checkpoint(ckpt)
        keys = load_plain_state_dict(module, ckpt["state_dict"], strict=strict)
        if not strict:
            warn_loose_keys(keys)
        if not ckpt["state_dict"]:  # (strict=False: Lightning says so after the missing keys, in its words)
            warnings.warn(f"The state dict in {checkpoint_path!r} contains no parameters.", stacklevel=2)
        return module


def warn_loose_keys(keys):
    """What a load with strict=False left out, said (Lightning's words)."""
    if keys.missing_keys:
        warnings.warn(f"Found keys that are in the model state dict but not in the checkpoint: {keys.missing_keys}",
                      stacklevel=3)
    if keys.unexpected_keys:
        warnings.warn(f"Found keys that are not in the model state dict but in the checkpoint: "
                      f"{keys.unexpected_keys}", stacklevel=3)


def _is_plain(value):
    return isinstance(value, (numbers.Number, str, bool, type(None), list, tuple, dict))


def is_picklable(obj):
    """Whether pickle.dumps(obj) works (the errors pickling raises for a lambda, a lock, a local class: False)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


def drop_unpicklable_hparams(module, warn):
    """Lightning's clean_namespace, at the start of every run: a hyper-parameter that cannot be pickled (a lambda)
    leaves module.hparams, with a warning (warn=True: rank 0), so no checkpoint keeps a stand-in for it that
    load_from_checkpoint would hand to __init__."""
    hparams = module.hparams
    for key in [key for key, value in hparams.items() if not is_picklable(value)]:
        if warn:
            warnings.warn(f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress "
                          f"this warning by setting `self.save_hyperparameters(ignore=['{key}'])`.", stacklevel=3)
        del hparams[key]


def instance_flag(owner, name):
    """A flag Lightning's DataHooks.__init__ sets on the instance (prepare_data_per_node,
    allow_zero_length_dataloader_with_multiple_devices): a subclass's class attribute is shadowed by it, as under
    Lightning. Where the two differ the instance's value holds, with a warning instead of silence."""
    value = getattr(owner, name)
    # the class that declares it, if a subclass of one's own does (TaskModule's and DataModule's own are defaults)
    declaring = next((cls for cls in type(owner).__mro__ if name in vars(cls)), None)
    declared = getattr(type(owner), name, value)
    if declaring is not None and declaring.__module__ not in (__name__, "tasktrain.trainer.datamodule") \
            and declared != value:
        warnings.warn(f"{type(owner).__name__}.{name} = {declared!r} is a class attribute, which the base class's "
                      f"__init__ shadows with {value!r} on the instance (Lightning's rule), so {value!r} is used: set "
                      f"`self.{name} = {declared!r}` in __init__, after super().__init__().", UserWarning)
    return value


def is_overridden(method_name, instance=None, parent=None) -> bool:
    """Whether `instance` replaces `parent`'s `method_name` (Lightning's parameter names), Lightning's answer
    (lightning_utilities' is_overridden): an attribute that is None is not an override (`model.validation_step = None`
    switches validation off); ONE wrapper is looked through, `__wrapped__` first (functools.wraps / update_wrapper,
    contextmanager), then a Mock's `wraps` or a partial's function, and what is left is compared with the parent's
    code. So a recording wrapper around the parent's own hook (update_wrapper(partial(record, ...), hook)) is no
    override, and a wrapper of a wrapper is one. Where Lightning's fails (what is left has no code: a callable object,
    a Mock wrapping a partial or a Mock: its AttributeError, docs/lightning.md), the wrappers are followed to what
    they wrap. A name the parent does not define is Lightning's ValueError. Whether the loop *calls* a hook is
    hook_is_called: Lightning calls every hook."""
    if instance is None:
        return False
    if parent is None:  # Lightning's signature: the parent class is the one of TaskModule / DataModule / Callback
        from tasktrain.callbacks.base import Callback
        from tasktrain.trainer.datamodule import DataModule

        parent = next((b for b in (TaskModule, DataModule, Callback) if isinstance(instance, b)), None)
        if parent is None:
            raise ValueError(f"is_overridden({method_name!r}, {type(instance).__name__}): pass the base class "
                             "(parent=) as the third argument (it is not a TaskModule, DataModule or Callback).")
    impl = getattr(instance, method_name, None)
    if impl is None:
        return False
    impl = _looked_through(impl)
    if impl is None:
        return False
    base_impl = getattr(parent, method_name, None)
    if base_impl is None:
        raise ValueError(f"The parent should define the method (is_overridden({method_name!r}): {parent.__name__} "
                         f"has no {method_name}).")
    base_impl = getattr(base_impl, "__wrapped__", base_impl)
    code = getattr(impl, "__code__", None)
    if code is None:  # (Lightning's AttributeError)
        impl = _unwrapped(impl)
        if impl is None:
            return False
        code = getattr(impl, "__code__", None)
        if code is None:
            return True  # a callable object set in the hook's place
    return code != getattr(base_impl, "__code__", None)


def hook_is_called(name, obj, base) -> bool:
    """Whether the loop calls `obj`'s hook `name`. Lightning calls every hook; tasktrain leaves out only the calls
    that could do nothing but what the loop does without them: an attribute that is not callable (None switches a hook
    off, as in Lightning) and the base's own function, not overridden. Anything else is called: an override, and
    whatever is set in the hook's place (a functools.partial, a recording wrapper around the base's hook, a Mock,
    Mock(spec=Callback)'s hooks), also where is_overridden, looking through the wrapper, finds the base's."""
    fn = getattr(obj, name, None)
    if not callable(fn):
        return False
    return getattr(fn, "__func__", None) is not getattr(base, name, None)


def _looked_through(fn):
    """One wrapper looked through, as Lightning's is_overridden does: `__wrapped__` first, then a Mock's `wraps` or a
    partial's function."""
    if hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    mock = sys.modules.get("unittest.mock")  # not imported: no Mock can exist
    if mock is not None and isinstance(fn, mock.Mock):
        return fn._mock_wraps
    if isinstance(fn, functools.partial):
        return fn.func
    return fn


def _unwrapped(fn):
    """Every wrapper looked through (a chain; bounded against a wrapper that wraps itself)."""
    mock = sys.modules.get("unittest.mock")
    for _ in range(100):
        if mock is not None and isinstance(fn, mock.Mock):
            fn = fn._mock_wraps
        elif isinstance(fn, functools.partial) and "__wrapped__" not in getattr(fn, "__dict__", {}):
            fn = fn.func
        elif hasattr(fn, "__wrapped__") and not isinstance(fn, type):
            fn = fn.__wrapped__
        else:
            break
    return fn


def takes_any_keyword(cls, params, instantiator):
    """Whether load_from_checkpoint hands `cls` every saved hyper-parameter rather than those its __init__ names:
    an __init__ with **kwargs, and, for a TaskCLI checkpoint, TaskModule's and DataModule's own (Lightning's take
    **kwargs, so `LightningModule.load_from_checkpoint` passes the "_class_path" on and rebuilds the subclass)."""
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return True
    from tasktrain.trainer.datamodule import DataModule

    return instantiator is not None and cls.__init__ in (TaskModule.__init__, DataModule.__init__)


def named_init_arguments(params):
    """The __init__ parameters a checkpoint's hparams_name may be (Lightning's rule): not self, *args or **kwargs, so
    the "kwargs" a plain save_hyperparameters() records never wraps the hyper-parameters for an `**kwargs`."""
    return [n for i, (n, p) in enumerate(params.items())
            if i > 0 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def read_for_load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, weights_only):
    """The checkpoint a TaskModule's or DataModule's load_from_checkpoint rebuilds from, read as Lightning's
    (its core/saving.py _load_from_checkpoint): onto the CPU by default, pickles trusted with weights_only=False, the
    hyper-parameters replaced by those of hparams_file where one is given."""
    from tasktrain.checkpoint_io import load_checkpoint_file, trusted_pickles

    if weights_only not in (None, True, False):
        raise ValueError(f"{cls.__name__}.load_from_checkpoint(weights_only={weights_only!r}): use None, True or "
                         "False.")
    with trusted_pickles(weights_only is False):
        ckpt = load_checkpoint_file(checkpoint_path, map_location="cpu" if map_location is None else map_location)
    if hparams_file is not None:
        from tasktrain.trainer.hparams_files import load_hparams_from_tags_csv, load_hparams_from_yaml

        extension = str(hparams_file).rsplit(".", 1)[-1].lower()
        if extension == "csv":
            hparams = load_hparams_from_tags_csv(hparams_file)
        elif extension in ("yml", "yaml"):
            hparams = load_hparams_from_yaml(hparams_file)
        else:  # (Lightning's words)
            raise ValueError(".csv, .yml or .yaml is required for `hparams_file`")
        ckpt[cls.CHECKPOINT_HYPER_PARAMS_KEY] = hparams
    return ckpt
