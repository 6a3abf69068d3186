"""The callbacks that installed packages register through Lightning's entry-point group
"lightning.pytorch.callbacks_factory" (each entry point a function returning a callback or a list of them), which the
Trainer adds to its callbacks when built, as Lightning's does (trainer/arguments.py, `default_callbacks`). This module
is also Lightning's `lightning.fabric.utilities.registry` path renamed (tasktrain.utilities.registry is this very
module), and `entry_points` is read from it at each call, so a test patches it at either path."""
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
