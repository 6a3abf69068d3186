"""`lightning.pytorch.utilities.compile`: from_compiled / to_uncompiled, Lightning's way of handing the Trainer a
torch.compile'd module. (The Trainer also takes `torch.compile(module)` itself: tasktrain/compiled.py.)

from_compiled(torch.compile(module)) returns the module itself with its forward and its four step methods replaced by
compiled ones (the wrapper's compiler settings), remembering the originals in `module._compiler_ctx`;
to_uncompiled(module or wrapper) puts them back."""
from tasktrain.compiled import unwrap_compiled
from tasktrain.trainer.module import TaskModule

__all__ = ["from_compiled", "to_uncompiled"]

_METHODS = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def from_compiled(model):
    module, wrapper = unwrap_compiled(model)
    if wrapper is None:
        raise ValueError(f"`model` is required to be a `OptimizedModule`. Found a `{type(model).__name__}` instead.")
    if not isinstance(module, TaskModule):
        raise ValueError(f"`model` is expected to be a compiled TaskModule. Found a `{type(module).__name__}` instead")
    compile_fn = wrapper.dynamo_ctx  # torch's own compiler context of that wrapper (backend, mode, options)
    originals = {name: getattr(module, name) for name in _METHODS}
    module._compiler_ctx = {"compiler": "dynamo", "dynamo_ctx": compile_fn,
                            **{f"original_{name}": method for name, method in originals.items()}}
    for name, method in originals.items():
        setattr(module, name, compile_fn(method))
    return module


def to_uncompiled(model):
    module, wrapper = unwrap_compiled(model)
    if wrapper is not None:
        if not isinstance(module, TaskModule):
            raise TypeError(f"Unexpected error, the wrapped model should be a TaskModule, found {type(model).__name__}")
    elif isinstance(module, TaskModule):
        if getattr(module, "_compiler_ctx", None) is None:
            raise ValueError("`model` is required to be a compiled TaskModule. Found a non-compiled TaskModule "
                             "instead.")
    else:
        raise ValueError("`model` must either be an instance of OptimizedModule or TaskModule")
    context = getattr(module, "_compiler_ctx", None)
    if context is not None:
        for name in _METHODS:
            setattr(module, name, context[f"original_{name}"])
        module._compiler_ctx = None
    return module
