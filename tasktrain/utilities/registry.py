"""Lightning's `lightning.fabric.utilities.registry` path of `_load_external_callbacks`: the callbacks that installed
packages register through the entry-point group "lightning.pytorch.callbacks_factory" (each entry point a function
returning a callback or a list of them), which the Trainer adds to its callbacks when built, as Lightning's does
(trainer/arguments.py, `default_callbacks`). `entry_points` is read from this module at each call, so a test patches
it here."""
import logging
from importlib.metadata import entry_points

__all__ = ["_load_external_callbacks"]

CALLBACKS_GROUP = "lightning.pytorch.callbacks_factory"  # (Lightning's group: its packages' callbacks run here too)

log = logging.getLogger("tasktrain")


def _load_external_callbacks(group: str) -> list:
    """Every callback the factories of the entry-point `group` return, in the order of the entry points."""
    callbacks = []
    for factory in entry_points(group=group):
        made = factory.load()()
        made = made if isinstance(made, list) else [made]
        if made:
            log.info(f"Adding {len(made)} callbacks from entry point '{factory.name}': "
                     f"{', '.join(type(callback).__name__ for callback in made)}")
        callbacks.extend(made)
    return callbacks
