"""`lightning.pytorch.utilities.signature_utils`: is_param_in_hook_signature."""
import inspect

__all__ = ["is_param_in_hook_signature"]


def is_param_in_hook_signature(hook_fx, param, explicit=False, min_args=None):
    """Whether the hook (a bound method, or a function whose first argument is self) takes `param`: named among its
    arguments, or (explicit=False) through *args, or it has at least `min_args` arguments besides self."""
    hook_fx = getattr(hook_fx, "__wrapped__", hook_fx)  # a decorated hook: its own signature
    spec = inspect.getfullargspec(hook_fx)
    args = spec.args[1:]  # (getfullargspec lists self for a bound method too)
    return (param in args or (not explicit and spec.varargs is not None)
            or (isinstance(min_args, int) and len(args) >= min_args))
