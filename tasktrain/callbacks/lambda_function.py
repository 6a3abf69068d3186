"""LambdaCallback: a callback made on the spot from functions, one per event.

    LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))

Each function gets what the event's Callback method gets (trainer, module, then the event's own arguments). The
arguments are Lightning's, one per Callback event, in Lightning's order. Only the events given are hooked: the
Trainer sees them as overridden (the instance holds them), the others cost nothing. An unknown event name is a
TypeError (Python's, for an unexpected keyword argument), and so is a value that cannot be called, before training
rather than at the event.
"""
from typing import Callable, Optional

from tasktrain.callbacks.base import Callback


class LambdaCallback(Callback):
    def __init__(
        self,
        setup: Optional[Callable] = None,
        teardown: Optional[Callable] = None,
        on_fit_start: Optional[Callable] = None,
        on_fit_end: Optional[Callable] = None,
        on_sanity_check_start: Optional[Callable] = None,
        on_sanity_check_end: Optional[Callable] = None,
        on_train_batch_start: Optional[Callable] = None,
        on_train_batch_end: Optional[Callable] = None,
        on_train_epoch_start: Optional[Callable] = None,
        on_train_epoch_end: Optional[Callable] = None,
        on_validation_epoch_start: Optional[Callable] = None,
        on_validation_epoch_end: Optional[Callable] = None,
        on_test_epoch_start: Optional[Callable] = None,
        on_test_epoch_end: Optional[Callable] = None,
        on_validation_batch_start: Optional[Callable] = None,
        on_validation_batch_end: Optional[Callable] = None,
        on_test_batch_start: Optional[Callable] = None,
        on_test_batch_end: Optional[Callable] = None,
        on_train_start: Optional[Callable] = None,
        on_train_end: Optional[Callable] = None,
        on_validation_start: Optional[Callable] = None,
        on_validation_end: Optional[Callable] = None,
        on_test_start: Optional[Callable] = None,
        on_test_end: Optional[Callable] = None,
        on_exception: Optional[Callable] = None,
        on_save_checkpoint: Optional[Callable] = None,
        on_load_checkpoint: Optional[Callable] = None,
        on_before_backward: Optional[Callable] = None,
        on_after_backward: Optional[Callable] = None,
        on_before_optimizer_step: Optional[Callable] = None,
        on_before_zero_grad: Optional[Callable] = None,
        on_predict_start: Optional[Callable] = None,
        on_predict_end: Optional[Callable] = None,
        on_predict_batch_start: Optional[Callable] = None,
        on_predict_batch_end: Optional[Callable] = None,
        on_predict_epoch_start: Optional[Callable] = None,
        on_predict_epoch_end: Optional[Callable] = None,
    ):
        for event, fn in dict(locals()).items():
            if event == "self" or fn is None:
                continue
            if not callable(fn):
                raise TypeError(f"LambdaCallback({event}={fn!r}): give a function of (trainer, module, ...).")
            setattr(self, event, fn)  # an instance attribute: called as fn(trainer, module, ...)
