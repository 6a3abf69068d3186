"""Lightning 2.6's public signatures beside tasktrain's (the rename rule of docs/lightning.md): for each public class
and function Lightning's public modules export, and each public method Lightning's classes define, the parameters'
names, order, kinds and defaults are compared with tasktrain's of the same (renamed) name. A difference fails the test
unless ALLOWED below names it, with the difference as it is and why it is kept; an entry whose difference went away
fails too, so the list stays true."""
import enum
import importlib
import inspect

import pytest

pytest.importorskip("lightning")

RENAMED = {"LightningModule": "TaskModule", "LightningDataModule": "DataModule", "LightningCLI": "TaskCLI"}
MODULES = ["", ".callbacks", ".callbacks.progress", ".loggers", ".profilers", ".strategies", ".plugins",
           ".plugins.precision", ".plugins.environments", ".plugins.io", ".plugins.layer_sync", ".tuner",
           ".accelerators", ".core", ".loops", ".cli", ".utilities", ".utilities.combined_loader",
           ".utilities.model_summary", ".utilities.rank_zero", ".utilities.seed", ".utilities.memory",
           ".utilities.parsing", ".utilities.grads", ".utilities.data", ".utilities.compile",
           ".utilities.model_helpers", ".utilities.parameter_tying", ".utilities.migration",
           ".utilities.signature_utils"]


def _default(value):
    """A default as compared: Lightning's and tasktrain's functions and classes by name (their objects differ), a
    string enum by its value (Lightning's `Interval.step` is the string "step")."""
    if value is inspect.Parameter.empty:
        return "-"
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if inspect.isclass(value) or inspect.isfunction(value):
        return f"<{RENAMED.get(value.__name__, value.__name__)}>"
    return repr(value)


def _params(function):
    """(name, kind, default) of each parameter. *args and **kwargs by kind alone (their names are nobody's
    business); the `cls` of Lightning's load_from_checkpoint (a descriptor of its own, not a classmethod) left out."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    params = []
    for p in signature.parameters.values():
        name = {p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}.get(p.kind, p.name)
        params.append((name, p.kind.name.lower(), _default(p.default)))
    if params and params[0][0] == "cls":
        params = params[1:]
    return params


def _difference(theirs, ours):
    """A short description of how `ours` differs from `theirs` ("" where they match)."""
    theirs, ours = _params(theirs), _params(ours)
    if theirs is None or ours is None or theirs == ours:
        return ""
    their_names, our_names = [p[0] for p in theirs], [p[0] for p in ours]
    parts = []
    missing = [n for n in their_names if n not in our_names]
    extra = [n for n in our_names if n not in their_names]
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"extra {extra}")
    their_by, our_by = {p[0]: p for p in theirs}, {p[0]: p for p in ours}
    positional = [n for n in their_names if their_by[n][1].startswith("positional")]  # (keyword-only: no order)
    if [n for n in positional if n in our_names] != [n for n in our_names if n in positional]:
        parts.append("order")
    # a call by position binds Lightning's n-th parameter to ours: the same name at each of Lightning's positions
    # (an extra of ours before one of Lightning's moves it)
    our_positional = [p[0] for p in ours if p[1].startswith("positional")]
    moved = [n for i, n in enumerate(positional) if n in our_by and our_positional[i:i + 1] != [n]]
    if moved and "order" not in parts:
        parts.append(f"positions of {moved}")
    for name in their_names:
        if name in our_by and their_by[name][1] != our_by[name][1]:
            parts.append(f"{name} kind {their_by[name][1]} -> {our_by[name][1]}")
        if name in our_by and their_by[name][2] != our_by[name][2]:
            parts.append(f"{name} default {their_by[name][2]} -> {our_by[name][2]}")
    if not parts:  # the same names in the same order and kinds: a position differs
        parts.append(f"positions {their_names} -> {our_names}")
    return "; ".join(parts)


def _takes_nothing(self):
    pass


def differences():
    """{qualified tasktrain name: difference}, over Lightning's public names."""
    found, seen = {}, set()
    for suffix in MODULES:
        theirs_module = importlib.import_module("lightning.pytorch" + suffix)
        ours_module = importlib.import_module("tasktrain" + suffix)
        names = getattr(theirs_module, "__all__", None) or [n for n in dir(theirs_module) if not n.startswith("_")]
        for name in names:
            theirs = getattr(theirs_module, name, None)
            if not (inspect.isclass(theirs) or inspect.isfunction(theirs)) or id(theirs) in seen:
                continue
            origin = getattr(theirs, "__module__", None) or ""
            if not origin.startswith("lightning.") or (not hasattr(theirs_module, "__all__") and not origin.startswith(
                    theirs_module.__name__)):
                continue  # torch's, Python's, and names a module without __all__ imported from elsewhere
            seen.add(id(theirs))
            our_name = f"tasktrain{suffix}.{RENAMED.get(name, name)}"
            ours = getattr(ours_module, RENAMED.get(name, name), None)
            if ours is None:
                found[our_name] = "absent"
                continue
            if inspect.isfunction(theirs) or not inspect.isclass(ours):
                found[our_name] = _difference(theirs, ours)
                continue
            # (a class without an __init__ of its own in Lightning takes no arguments: object's (self, /, *args,
            # **kwargs) is not a signature to copy)
            their_init = theirs.__init__ if theirs.__init__ is not object.__init__ else _takes_nothing
            our_init = ours.__init__ if ours.__init__ is not object.__init__ else _takes_nothing
            found[our_name + ".__init__"] = _difference(their_init, our_init)
            for attribute in dir(theirs):
                if attribute.startswith("_"):
                    continue
                owner = next(c for c in theirs.__mro__ if attribute in vars(c))
                if not (owner.__module__ or "").startswith("lightning"):
                    continue  # torch's nn.Module methods, Python's
                if not callable(getattr(theirs, attribute)) or isinstance(vars(owner)[attribute], property):
                    continue
                our_method = getattr(ours, attribute, None)
                if our_method is None or not callable(our_method):
                    continue  # (absent methods and instance attributes: other tests)
                found[f"{our_name}.{attribute}"] = _difference(getattr(theirs, attribute), our_method)
    return {name: difference for name, difference in found.items() if difference}


ALLOWED = {}
