"""`lightning.pytorch.utilities.parsing`: AttributeDict (the core's), is_picklable, clean_namespace,
parse_class_init_keys, get_init_args / collect_init_args (an __init__ frame's arguments), save_hyperparameters(obj)
(the TaskModule / DataModule method, called for obj), and lightning_hasattr / lightning_getattr / lightning_setattr
(an attribute looked up on the module, in its hparams, on the trainer's DataModule and in its hparams: what the tuner
reads and sets)."""
import inspect

from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_warn
from tasktrain.trainer.module import AttributeDict, is_picklable

__all__ = ["AttributeDict", "clean_namespace", "collect_init_args", "get_init_args", "is_picklable",
           "lightning_getattr", "lightning_hasattr", "lightning_setattr", "parse_class_init_keys",
           "save_hyperparameters"]


def clean_namespace(hparams):
    """Remove, in place and with a warning each, the entries of a hyper-parameter mapping that cannot be pickled."""
    for key in [key for key, value in hparams.items() if not is_picklable(value)]:
        rank_zero_warn(f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this "
                       f"warning by setting `self.save_hyperparameters(ignore=['{key}'])`.")
        del hparams[key]


def parse_class_init_keys(cls):
    """(the name of self, of *args or None, of **kwargs or None) in cls.__init__."""
    params = list(inspect.signature(cls.__init__).parameters.values())
    var_args = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    var_kwargs = next((p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    return params[0].name, var_args, var_kwargs


def _init_args(frame):
    """(self, {argument: value}) of an __init__ frame whose method uses super() (its `__class__` cell says which
    class's __init__ it is); (None, {}) for any other frame. *args and **kwargs' names are left out, **kwargs' items
    taken in."""
    local = frame.f_locals
    if "__class__" not in local or frame.f_code.co_name != "__init__":
        return None, {}
    cls = local["__class__"]
    self_name, args_name, kwargs_name = parse_class_init_keys(cls)
    args = {name: local[name] for name in inspect.signature(cls.__init__).parameters}
    if kwargs_name:
        args.update(args.get(kwargs_name, {}))
    skipped = {self_name, args_name, kwargs_name, "__class__", "frame", "frame_args"}
    return local.get(self_name), {k: v for k, v in args.items() if k not in skipped}


def get_init_args(frame):
    """The arguments of the __init__ running in `frame` (see collect_init_args for the whole chain)."""
    return _init_args(frame)[1]


def collect_init_args(frame, path_args, inside=False, classes=()):
    """The arguments of each __init__ in the chain of super().__init__ calls that `frame` is in, outermost (the most
    derived class) last, appended to `path_args`; `classes`: only frames whose self is one of them."""
    if frame.f_back is None:
        return path_args
    self_arg, args = _init_args(frame)
    if "__class__" in frame.f_locals and (not classes or isinstance(self_arg, classes)):
        path_args.append(args)
        return collect_init_args(frame.f_back, path_args, inside=True, classes=classes)
    if not inside:
        return collect_init_args(frame.f_back, path_args, inside, classes=classes)
    return path_args


def save_hyperparameters(obj, *args, ignore=None, frame=None, given_hparams=None):
    """obj.save_hyperparameters(*args, ignore=..., frame=...) for a TaskModule or DataModule, reading the __init__
    arguments from `frame` (default: the caller's)."""
    if given_hparams is not None:
        raise ValueError("save_hyperparameters(given_hparams=...): pass the dict itself instead, "
                         "save_hyperparameters(obj, hparams), which stores exactly that dict.")
    if len(args) == 1 and not args[0]:  # an empty container: nothing to save (Lightning's rule)
        return
    obj.save_hyperparameters(*args, ignore=ignore, frame=frame or inspect.currentframe().f_back)


def _holders(model, attribute):
    """Everything that holds `attribute`, in Lightning's order: the module, its hparams, the trainer's DataModule,
    that DataModule's hparams."""
    found = []
    trainer = getattr(model, "_trainer", None)  # (model.trainer raises without one)
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, attribute):
            found.append(owner)
        if attribute in getattr(owner, "hparams", {}):
            found.append(owner.hparams)
    return found


def _missing(attribute):
    return AttributeError(f"{attribute} is neither stored in the model namespace nor the `hparams` namespace/dict, "
                          "nor the datamodule.")


def lightning_hasattr(model, attribute):
    return bool(_holders(model, attribute))


def lightning_getattr(model, attribute):
    """The value from the last holder (the DataModule's before the module's, as Lightning)."""
    holders = _holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, dict) else getattr(holder, attribute)


def lightning_setattr(model, attribute, value):
    """Set the value in every holder."""
    holders = _holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    for holder in holders:
        if isinstance(holder, dict):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)
