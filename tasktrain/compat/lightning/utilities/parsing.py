"""`lightning.pytorch.utilities.parsing`: AttributeDict (the core's), is_picklable, clean_namespace,
parse_class_init_keys, and lightning_hasattr / lightning_getattr / lightning_setattr (an attribute looked up on the
module, in its hparams, on the trainer's DataModule and in its hparams: what the tuner reads and sets)."""
import inspect
import pickle

from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_warn
from tasktrain.trainer.module import AttributeDict

__all__ = ["AttributeDict", "clean_namespace", "is_picklable", "lightning_getattr", "lightning_hasattr",
           "lightning_setattr", "parse_class_init_keys"]


def is_picklable(obj):
    """Whether pickle.dumps(obj) works (the errors pickling raises for a lambda, a lock, a local class: False)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


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
