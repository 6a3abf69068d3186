"""`lightning.pytorch.utilities.parameter_tying`: find tied (shared) parameters by name, and tie them again (after
something that copies parameters one by one, such as moving a model to another device on some backends, split them)."""
__all__ = ["find_shared_parameters", "set_shared_parameters"]


def find_shared_parameters(module):
    """Groups of the names under which one parameter object appears, for each parameter registered under two names
    or more (`[["encoder.weight", "decoder.weight"]]`), in the order the modules are walked."""
    names_of = {}  # parameter -> its names (keyed by the object: a parameter hashes by identity)
    _collect(module, "", names_of)
    return [names for names in names_of.values() if len(names) > 1]


def _collect(module, prefix, names_of):
    # module._parameters / _modules, not named_parameters(): that one reports a shared parameter under one name only
    for name, param in module._parameters.items():
        if param is not None:
            names_of.setdefault(param, []).append(prefix + name)
    for name, child in module._modules.items():
        if child is not None:
            _collect(child, prefix + name + ".", names_of)


def set_shared_parameters(module, shared_params):
    """Make every name of each group (find_shared_parameters' result) refer to the first name's parameter again.
    Returns the module."""
    for names in shared_params:
        first = _resolve(module, names[0])
        for name in names[1:]:
            owner, _, attribute = name.rpartition(".")
            setattr(_resolve(module, owner) if owner else module, attribute, first)
    return module


def _resolve(module, path):
    for part in path.split("."):
        module = getattr(module, part)
    return module
