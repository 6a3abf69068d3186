"""LambdaCallback: a callback made on the spot from functions, one per event.

    LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))

Each function gets what the event's Callback method gets (trainer, module, then the event's own arguments). Only
the events given are hooked: the Trainer sees them as overridden (the instance holds them), the others cost
nothing. An unknown event name is a TypeError, so a misspelt hook never goes silently uncalled.
"""
from tasktrain.callbacks.base import EVENTS, Callback


class LambdaCallback(Callback):
    def __init__(self, **hooks):
        unknown = sorted(set(hooks) - set(EVENTS))
        if unknown:
            raise TypeError(f"LambdaCallback got {unknown}, which are not callback events. The events are: "
                            f"{', '.join(EVENTS)}.")
        for event, fn in hooks.items():
            if fn is None:
                continue
            if not callable(fn):
                raise TypeError(f"LambdaCallback({event}={fn!r}): give a function of (trainer, module, ...).")
            setattr(self, event, fn)  # an instance attribute: called as fn(trainer, module, ...)
