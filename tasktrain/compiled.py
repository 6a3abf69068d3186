"""`trainer.fit(torch.compile(module))`: the Trainer trains the module inside, with that module's forward compiled.

torch.compile(module) returns a wrapper (torch's OptimizedModule) whose forward is compiled. It hides the
TaskModule: the Trainer calls training_step, configure_optimizers and the hooks, and self.log needs the module
itself. So the Trainer takes the module out of the wrapper and, for the run, compiles that module's forward in
place with the wrapper's own compiler settings (backend, mode, options), which is what `module.compile(...)`
does. training_step and the loop stay eager, the parameter names stay plain (no "_orig_mod." in checkpoints),
and after the run the module is as it was given.

A leaf module (it imports nothing of tasktrain): the Trainer and the strategies that must hold the module itself
(DeepSpeed's engine, for the Accelerator) both use it.
"""
import sys


def unwrap_compiled(obj):
    """(the module inside a torch.compile wrapper, the wrapper), or (obj, None) for anything else."""
    # No compiled module can exist before torch._dynamo is loaded: do not load it (it is slow to import) to check.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(obj, eval_frame.OptimizedModule):
        return obj._orig_mod, obj
    return obj, None


def compile_forward_as(module, wrapper):
    """Compile `module`'s forward in place with the settings of `wrapper` (a torch.compile result, or None: nothing
    to do). Returns a function that puts the module's previous forward back."""
    if wrapper is None:
        return _nothing
    context = getattr(wrapper, "dynamo_ctx", None)
    if context is None or not hasattr(module, "_compiled_call_impl"):
        raise TypeError(
            f"Got torch.compile({type(module).__name__}), but this torch ({_torch_version()}) does not let the "
            "Trainer reuse that wrapper's compiler settings. Compile the module in place instead and pass the module "
            "itself: `module.compile()` (same arguments as torch.compile), then `trainer.fit(module, ...)`."
        )
    previous = module._compiled_call_impl
    # What module.compile(...) does (torch.compile of the module's call), with the wrapper's backend and options.
    module._compiled_call_impl = context(module._call_impl)

    def restore():
        module._compiled_call_impl = previous

    return restore


def _nothing():
    pass


def _torch_version():
    import torch

    return torch.__version__
