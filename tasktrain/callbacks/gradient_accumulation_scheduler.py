"""GradientAccumulationScheduler: change the accumulation window by epoch.

    GradientAccumulationScheduler(scheduling={0: 8, 4: 4, 8: 1})   # 8 micro-batches per step, from epoch 4: 4, ...

Epochs count from 0; an epoch not in `scheduling` keeps the factor of the closest earlier key. As in Lightning, a
schedule without epoch 0 gets {0: 1} added to the very dict given (`self.scheduling` is that dict). At each epoch
start it sets `trainer.accumulate_grad_batches`, which the loop reads for that epoch; an epoch whose length is not
a multiple of the window ends with a shorter window that steps too.

Refusals, Lightning's: an empty dict is a TypeError; an epoch that is not an int >= 0, or a factor that is not an
int >= 1, a MisconfigurationException (a ValueError). At train start (after on_fit_start and the sanity check, as
Lightning): manual optimisation is a RuntimeError, Trainer(accumulate_grad_batches != 1) beside the callback a
ValueError, and a module overriding optimizer_step or optimizer_zero_grad gets Lightning's warning that those hooks
run once per optimizer step, not per batch.

An engine that fixes the window at set-up (DeepSpeed writes it into its config) refuses any schedule at train start
with Lightning's RuntimeError (`strategy.check_accumulation_can_change`); use Trainer(accumulate_grad_batches=N)
there. After fit the trainer's accumulate_grad_batches stays at the last factor, as in Lightning, so a second fit of
the same Trainer with the callback is refused (the ValueError above, as Lightning's check does): use a new Trainer.
"""
import warnings

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


class GradientAccumulationScheduler(Callback):
    def __init__(self, scheduling: dict[int, int]):
        if not scheduling:
            raise TypeError("Empty dict cannot be interpreted correct: GradientAccumulationScheduler(scheduling=...) "
                            "takes {epoch: factor}, e.g. {0: 8, 4: 1}.")
        if not isinstance(scheduling, dict):
            raise TypeError(f"GradientAccumulationScheduler(scheduling={scheduling!r}): give a dict {{epoch: factor}}.")
        if any(not isinstance(k, int) or k < 0 for k in scheduling):
            raise MisconfigurationException(f"Epoch should be an int greater than or equal to 0. Got {list(scheduling)}"
                                            " (GradientAccumulationScheduler's epochs count from 0).")
        if any(not isinstance(v, int) or v < 1 for v in scheduling.values()):
            raise MisconfigurationException("Accumulation factor should be an int greater than 0. Got "
                                            f"{list(scheduling.values())} (GradientAccumulationScheduler).")
        if min(scheduling) != 0:
            scheduling.update({0: 1})
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self):
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch):
        factor = 1
        for start in self.epochs:
            if epoch >= start:
                factor = self.scheduling[start]
        return factor

    @property
    def accumulation_schedule(self):
        """{first epoch: factor}, what the loop will do (the plan's accumulation_schedule)."""
        return dict(sorted(self.scheduling.items()))

    def on_train_start(self, trainer, pl_module):
        # Lightning's checks, in Lightning's order, at Lightning's point (after on_fit_start and the sanity check)
        if not pl_module.automatic_optimization:
            raise RuntimeError("Automatic gradient accumulation and the `GradientAccumulationScheduler` is not "
                               "supported for manual optimization. Please remove the callback or switch to automatic "
                               "optimization.")
        from tasktrain.trainer.module import TaskModule, is_overridden

        overrides = [name for name in ("optimizer_step", "optimizer_zero_grad")
                     if is_overridden(name, pl_module, TaskModule)]
        if overrides and self.going_to_accumulate_grad_batches():
            warnings.warn("When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                          "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                          f"(rather, they are called on every optimization step); {type(pl_module).__name__} overrides "
                          f"{', '.join(overrides)}.", UserWarning)
        # an engine that fixes the window at set-up (DeepSpeed) refuses any schedule
        trainer.strategy.check_accumulation_can_change()
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` "
                             "callback. Either remove `accumulate_grad_batches` from the Trainer or remove the "
                             f"callback. (It is {trainer.accumulate_grad_batches}; a Trainer that already ran a fit "
                             "with the callback keeps its last factor, as Lightning's does: fit again with a new "
                             "Trainer.)")

    def on_train_epoch_start(self, trainer, *args):
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
