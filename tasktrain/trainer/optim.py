"""configure_optimizers: every usual return form, checked up front with errors that say what is expected."""
from dataclasses import dataclass
from typing import Optional

import torch

_FORMS = (
    "an optimizer; a list of optimizers; a tuple (optimizers, schedulers); or a dict "
    "{'optimizer': opt, 'lr_scheduler': scheduler or {'scheduler': s, 'interval': 'step'|'epoch', 'frequency': 1, "
    "'monitor': 'val_loss'}} (or a list of such dicts)"
)


@dataclass
class SchedulerConfig:
    scheduler: object
    interval: str = "epoch"
    frequency: int = 1
    monitor: Optional[str] = None
    strict: bool = True
    name: Optional[str] = None


def parse_optimizers(module):
    result = module.configure_optimizers()
    where = f"{type(module).__name__}.configure_optimizers()"
    if result is None:
        raise ValueError(f"{where} returned None. It must return {_FORMS}.")
    optimizers, schedulers = [], []
    if isinstance(result, torch.optim.Optimizer):
        optimizers = [result]
    elif isinstance(result, dict):
        optimizers, schedulers = _from_dict(result, where)
    elif isinstance(result, (list, tuple)) and len(result) == 2 and isinstance(result[0], (list, tuple)):
        optimizers = list(result[0])
        schedulers = [_scheduler_config(s, where) for s in (result[1] if isinstance(result[1], (list, tuple)) else [result[1]])]
    elif isinstance(result, (list, tuple)) and result and all(isinstance(d, dict) for d in result):
        for d in result:
            opts, scheds = _from_dict(d, where)
            optimizers += opts
            schedulers += scheds
    elif isinstance(result, (list, tuple)):
        optimizers = list(result)
    else:
        raise ValueError(f"{where} returned a {type(result).__name__}. It must return {_FORMS}.")
    if not optimizers:
        raise ValueError(f"{where} returned no optimizer. It must return {_FORMS}.")
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError(f"{where} returned {type(opt).__name__} where an optimizer was expected. It must return {_FORMS}.")
    for config in schedulers:
        owned = any(getattr(config.scheduler, "optimizer", None) is opt for opt in optimizers)
        if not owned:
            raise ValueError(f"{where}: the scheduler {type(config.scheduler).__name__} does not belong to any of the "
                             "returned optimizers; build it on one of them.")
    return optimizers, schedulers


def _from_dict(d, where):
    unknown = set(d) - {"optimizer", "lr_scheduler", "monitor", "frequency"}
    if "optimizer" not in d or unknown:
        problem = "has no 'optimizer' key" if "optimizer" not in d else f"has unknown keys {sorted(unknown)}"
        raise ValueError(f"{where} returned a dict that {problem}. It must return {_FORMS}.")
    schedulers = []
    if d.get("lr_scheduler") is not None:
        sched = d["lr_scheduler"]
        if not isinstance(sched, dict) and "monitor" in d:
            sched = {"scheduler": sched, "monitor": d["monitor"]}
        schedulers.append(_scheduler_config(sched, where))
    return [d["optimizer"]], schedulers


def _scheduler_config(item, where):
    if isinstance(item, dict):
        unknown = set(item) - {"scheduler", "interval", "frequency", "monitor", "strict", "name"}
        if "scheduler" not in item or unknown:
            problem = "has no 'scheduler' key" if "scheduler" not in item else f"has unknown keys {sorted(unknown)}"
            raise ValueError(f"{where}: the 'lr_scheduler' dict {problem}. Expected keys: scheduler, interval "
                             "('step' or 'epoch'), frequency, monitor, strict, name.")
        config = SchedulerConfig(**item)
    else:
        config = SchedulerConfig(scheduler=item)
    if config.interval not in ("step", "epoch"):
        raise ValueError(f"{where}: lr_scheduler interval={config.interval!r}; use 'step' or 'epoch'.")
    if int(config.frequency) < 1:
        raise ValueError(f"{where}: lr_scheduler frequency={config.frequency}; use a positive integer.")
    if isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and not config.monitor:
        raise ValueError(f"{where}: ReduceLROnPlateau needs a metric to watch. Return "
                         "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}}.")
    if not hasattr(config.scheduler, "step"):
        raise ValueError(f"{where}: {type(config.scheduler).__name__} is not a learning-rate scheduler (no .step()).")
    return config


class ManualOptimizer:
    """What self.optimizers() returns in manual optimisation: step() goes through precision and counts steps."""

    def __init__(self, optimizer, trainer):
        self.optimizer = optimizer
        self._trainer = trainer

    def step(self, closure=None):
        """on_before_optimizer_step fires when the gradients are there: before the step, or, with a closure (which
        computes them), after each call of it, inside the optimizer's step (Lightning's order)."""
        trainer = self._trainer
        hooks = trainer._all_hooks["on_before_optimizer_step"]
        # the clipping of Trainer(gradient_clip_val=...) and GradientClipping callbacks, after the hooks as in the
        # automatic step (tasktrain/trainer/loop.py)
        clippers = trainer._fit_state.clippers if trainer._fit_state is not None else ()
        if closure is None:
            for fn in hooks:
                fn(self.optimizer)
            for clipper in clippers:
                clipper.clip(trainer, trainer.module, self.optimizer)
            wrapped = None
        else:
            def wrapped():
                out = closure()
                for fn in hooks:
                    fn(self.optimizer)
                for clipper in clippers:
                    clipper.clip(trainer, trainer.module, self.optimizer)
                return out
        stepped = trainer.strategy.optimizer_step(self.optimizer, wrapped)
        trainer.state.global_step += 1
        return stepped

    def zero_grad(self, set_to_none=True):
        # (Lightning fires on_before_zero_grad in automatic optimisation only: not for the user's own zero_grad())
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)
