"""GradientAccumulationScheduler: change the accumulation window by epoch.

    GradientAccumulationScheduler(scheduling={0: 8, 4: 4, 8: 1})   # 8 micro-batches per step, from epoch 4: 4, ...

Epochs count from 0; an epoch not in `scheduling` keeps the factor of the closest earlier key (1 before the
first). At each epoch start it sets `trainer.accumulate_grad_batches`, which the loop reads for that epoch; an
epoch whose length is not a multiple of the window ends with a shorter window that steps too.

The Trainer tells the strategy the whole schedule before training (`Plan.accumulation_schedule`), so an engine
that fixes the window at set-up (DeepSpeed writes it into its config) refuses it there. It is refused with
manual optimisation (training_step steps itself) and with Trainer(accumulate_grad_batches=N != 1): one of the
two would be ignored.
"""
from tasktrain.callbacks.base import Callback


class GradientAccumulationScheduler(Callback):
    def __init__(self, scheduling):
        if not isinstance(scheduling, dict) or not scheduling:
            raise TypeError("GradientAccumulationScheduler(scheduling=...): give a non-empty dict {epoch: factor}.")
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise ValueError(f"GradientAccumulationScheduler: epochs are integers >= 0 (counted from 0); got "
                             f"{list(scheduling)}.")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise ValueError(f"GradientAccumulationScheduler: accumulation factors are integers >= 1; got "
                             f"{list(scheduling.values())}.")
        self.scheduling = dict(scheduling)
        self.scheduling.setdefault(0, 1)
        self.epochs = sorted(self.scheduling)

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

    def setup(self, trainer, module, stage):
        if stage != "fit":
            return
        if not module.automatic_optimization:
            raise ValueError("GradientAccumulationScheduler needs automatic optimisation; this module steps its "
                             "optimizers itself (automatic_optimization = False). Remove the callback, or accumulate "
                             "in training_step.")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and a "
                             "GradientAccumulationScheduler both set the accumulation: remove one of them.")

    def on_train_epoch_start(self, trainer, module):
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def teardown(self, trainer, module, stage):
        if stage == "fit":
            trainer.accumulate_grad_batches = 1  # the Trainer's own setting, which setup required to be 1
