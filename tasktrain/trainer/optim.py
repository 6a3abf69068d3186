"""configure_optimizers: every usual return form, checked up front with errors that say what is expected."""
import contextlib
import functools
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from tasktrain.exceptions import MisconfigurationException
from tasktrain.trainer.metrics import hook_scope

_FORMS = (
    "an optimizer; a list of optimizers; a tuple (optimizers, schedulers); or a dict "
    "{'optimizer': opt, 'lr_scheduler': scheduler or {'scheduler': s, 'interval': 'step'|'epoch', 'frequency': 1, "
    "'monitor': 'val_loss'}} (or a list of such dicts)"
)


@dataclass
class SchedulerConfig:
    """Lightning's LRSchedulerConfig (`tasktrain.utilities.types.LRSchedulerConfig`), its fields in its order."""
    scheduler: object
    name: Optional[str] = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False  # (automatic optimisation: a ReduceLROnPlateau, unless the dict says)
    monitor: Optional[str] = None
    strict: bool = True


def parse_optimizers(module):
    """configure_optimizers' result as (optimizers, scheduler configs), checked as Lightning checks it (Lightning's
    `_init_optimizers_and_lr_schedulers`)."""
    with hook_scope(module._trainer, "configure_optimizers"):  # (named for self.log, which refuses it there)
        result = module.configure_optimizers()
    where = f"{type(module).__name__}.configure_optimizers()"
    # in manual optimisation training_step steps the schedulers itself: Lightning checks none of them (any object
    # with a state_dict, a ReduceLROnPlateau without a monitor) and warns about the keys it ignores
    manual = not module.automatic_optimization
    custom_step = _overrides_lr_scheduler_step(module)
    if result is None:  # Lightning's: a fit without an optimizer (forward and backward, no weight changes)
        warnings.warn("`LightningModule.configure_optimizers` returned `None`, this fit will run with no optimizer",
                      UserWarning, stacklevel=2)
        result = _NoOptimizer()
    optimizers, items = _split_forms(result, where)
    schedulers = [_scheduler_config(item, where, manual) for item in items]
    if not optimizers:
        raise ValueError(f"{where} returned no optimizer. It must return {_FORMS}.")
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise MisconfigurationException(f"Unknown configuration for model optimizers. {where} returned "
                                            f"{type(opt).__name__} where an optimizer was expected. It must return "
                                            f"{_FORMS}.")
    if not manual and len(optimizers) > 1:
        raise RuntimeError(  # (Lightning's error and words first)
            "Training with multiple optimizers is only supported with manual optimization. Set "
            "`self.automatic_optimization = False`, then access your optimizers in `training_step` with "
            f"`opt1, opt2, ... = self.optimizers()`. ({where} returned {len(optimizers)} optimizers: automatic "
            "optimisation steps one; step them yourself with self.manual_backward(loss).)"
        )
    for config in schedulers:
        owned = any(getattr(config.scheduler, "optimizer", None) is opt for opt in optimizers)
        if not owned:
            raise MisconfigurationException(
                "Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`. "
                f"({where}: the scheduler {type(config.scheduler).__name__} does not belong to any of the returned "
                "optimizers; build it on one of them.)")
    for config in schedulers:
        _check_scheduler_api(config, where, manual, custom_step)
    return optimizers, schedulers


def _split_forms(result, where):
    """The optimizers and the scheduler entries (a scheduler, or its dict) of one configure_optimizers return form;
    a dict's top-level `monitor` goes into its bare scheduler's entry."""
    optimizers, items = [], []
    if isinstance(result, torch.optim.Optimizer):
        optimizers = [result]
    elif isinstance(result, dict):
        optimizers, items = _from_dict(result, where)
    elif isinstance(result, (list, tuple)) and len(result) == 2 and isinstance(result[0], (list, tuple)):
        optimizers = list(result[0])
        items = list(result[1]) if isinstance(result[1], (list, tuple)) else [result[1]]
    elif isinstance(result, (list, tuple)) and result and all(isinstance(d, dict) for d in result):
        for d in result:
            opts, scheds = _from_dict(d, where)
            optimizers += opts
            items += scheds
    elif isinstance(result, (list, tuple)):
        optimizers = list(result)
    else:
        raise MisconfigurationException(f"Unknown configuration for model optimizers. {where} returned a "
                                        f"{type(result).__name__}. It must return {_FORMS}.")
    return optimizers, items


# Lightning's private helpers under their names (lightning.pytorch.core.optimizer; scripts and Lightning's own tests
# call them): the same checks as a fit's, from the functions above
def _init_optimizers_and_lr_schedulers(model):
    """Calls `model.configure_optimizers()`: (optimizers, scheduler configs), checked as at a fit's start."""
    return parse_optimizers(model)


def _configure_optimizers(optim_conf):
    """(optimizers, scheduler entries, monitor) of a configure_optimizers return value. Lightning returns a single
    dict's `monitor` apart; here it is already in its bare scheduler's entry, so the monitor returned is None."""
    optimizers, items = _split_forms(optim_conf, "configure_optimizers()")
    return optimizers, items, None


def _configure_schedulers_automatic_opt(schedulers, monitor):
    """The scheduler entries as configs, automatic optimisation's checks (the API checks come later, at the fit)."""
    return [_scheduler_config({"scheduler": s, "monitor": monitor} if monitor is not None and not isinstance(s, dict)
                              else s, "configure_optimizers()") for s in schedulers]


def _configure_schedulers_manual_opt(schedulers):
    """The scheduler entries as configs, manual optimisation's rules (monitor / strict ignored, with a warning)."""
    return [_scheduler_config(s, "configure_optimizers()", manual=True) for s in schedulers]


class _NoOptimizer(torch.optim.Optimizer):
    """What a configure_optimizers that returned None trains with (Lightning's _MockOptimizer): an optimizer of one
    parameter of its own, so a step changes none of the module's weights."""

    def __init__(self):
        super().__init__([torch.zeros(1)], {})

    def step(self, closure=None):
        return closure() if closure is not None else None


def _overrides_lr_scheduler_step(module):
    from tasktrain.trainer.module import TaskModule, is_overridden

    return is_overridden("lr_scheduler_step", module, TaskModule)


def _from_dict(d, where):
    # Lightning 2's keys; its 1.x optimizer "frequency" is gone there too (said and left out, as Lightning does)
    unknown = set(d) - {"optimizer", "lr_scheduler", "monitor"}
    if "optimizer" not in d:
        raise ValueError(f"{where} returned a dict that has no 'optimizer' key. It must return {_FORMS}.")
    if unknown:  # Lightning's: said and left out
        warnings.warn(f"Found unsupported keys in the optimizer configuration: {unknown}", RuntimeWarning, stacklevel=4)
    items = []
    if d.get("lr_scheduler") is not None:
        sched = d["lr_scheduler"]
        if not isinstance(sched, dict) and "monitor" in d:
            sched = {"scheduler": sched, "monitor": d["monitor"]}
        items.append(sched)
    return [d["optimizer"]], items


def _scheduler_config(item, where, manual=False):
    """One scheduler entry as a SchedulerConfig, with Lightning's checks of the entry (the scheduler object's API is
    checked apart, by _check_scheduler_api, as Lightning does once every entry is read)."""
    if isinstance(item, dict):
        unknown = set(item) - {"scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"}
        if unknown and not manual and "scheduler" in item:  # Lightning's: said and left out
            warnings.warn(f"Found unsupported keys in the lr scheduler dict: {unknown}. HINT: remove them from the "
                          "output of `configure_optimizers`.", RuntimeWarning, stacklevel=3)
            item, unknown = {k: v for k, v in item.items() if k not in unknown}, set()
        if "scheduler" not in item or unknown:
            problem = "has no 'scheduler' key" if "scheduler" not in item else f"has unknown keys {sorted(unknown)}"
            detail = (f"{where}: the 'lr_scheduler' dict {problem}. Expected keys: scheduler, interval ('step' or "
                      "'epoch'), frequency, monitor, strict, name, reduce_on_plateau.")
            raise MisconfigurationException(  # (Lightning's words first, where it has some)
                f'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler ({detail})'
                if "scheduler" not in item else detail)
        if manual:
            ignored = [k for k in item if k in ("monitor", "strict")]
            if ignored:  # (Lightning's words)
                warnings.warn(f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You "
                              "need to call `lr_scheduler.step()` manually in manual optimization.", RuntimeWarning,
                              stacklevel=3)
            item = {k: v for k, v in item.items() if k not in ("monitor", "strict")}
        config = SchedulerConfig(**item)
    else:
        config = SchedulerConfig(scheduler=item)
    if manual:  # (the interval is kept: LearningRateMonitor reads it)
        return config
    if isinstance(config.scheduler, torch.optim.lr_scheduler.OneCycleLR) and config.interval == "epoch":
        warnings.warn("A `OneCycleLR` scheduler is using 'interval': 'epoch'. Are you sure you didn't mean "
                      "'interval': 'step'?", RuntimeWarning, stacklevel=3)
    if not (isinstance(item, dict) and "reduce_on_plateau" in item):
        config.reduce_on_plateau = isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if config.interval not in ("step", "epoch"):
        raise MisconfigurationException(f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is '
                                        f'"{config.interval}" ({where})')
    if int(config.frequency) < 1:
        raise ValueError(f"{where}: lr_scheduler frequency={config.frequency}; use a positive integer.")
    if config.reduce_on_plateau and not config.monitor:  # (a dict's reduce_on_plateau=True too, as Lightning)
        lightning = ('The lr scheduler dict must include a monitor when a `ReduceLROnPlateau` scheduler is used. '
                     'For example: {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": '
                     '"your_loss"}}' if isinstance(item, dict) else
                     "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used. "
                     'For example: {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "metric_to_track"}')
        raise MisconfigurationException(f"{lightning} (ReduceLROnPlateau needs a metric to watch: {where}.)")
    return config


def _check_scheduler_api(config, where, manual, custom_step):
    """Lightning's scheduler API checks: a state_dict always; in automatic optimisation a torch scheduler's step
    unless the module steps it in lr_scheduler_step."""
    if not (callable(getattr(config.scheduler, "state_dict", None))
            and callable(getattr(config.scheduler, "load_state_dict", None))):  # (Lightning's words)
        raise TypeError(f"The provided lr scheduler `{type(config.scheduler).__name__}` is invalid. It should have "
                        "`state_dict` and `load_state_dict` methods defined.")
    torch_api = isinstance(config.scheduler, (torch.optim.lr_scheduler.LRScheduler,
                                              torch.optim.lr_scheduler.ReduceLROnPlateau))
    if not manual and not custom_step and not torch_api:
        # (Lightning's words first)
        raise MisconfigurationException(
            f"The provided lr scheduler `{type(config.scheduler).__name__}` doesn't follow PyTorch's LRScheduler API. "
            "You should override the `LightningModule.lr_scheduler_step` hook with your own logic if you are using a "
            f"custom LR scheduler. ({where})")


def do_nothing_closure():
    return None


_classes = {}  # the optimizer's class -> its LightningOptimizer class (one per class, not one per instance)


def _through(name):
    """A property of the wrapped optimizer's `name`, read and written on it."""
    return property(lambda self: getattr(self._optimizer, name),
                    lambda self, value: setattr(self._optimizer, name, value))


class LightningOptimizer:
    """Lightning's LightningOptimizer: what `self.optimizers()` returns and what `optimizer_step` receives. It is an
    instance of the optimizer's own class too (`isinstance(opt, torch.optim.SGD)`, `str(opt)` "LightningSGD (...)");
    what it does not define is the wrapped optimizer's (`param_groups`, `state`, `defaults` are the wrapped one's).

    `step(closure=None, **kwargs)` steps through the Trainer (set when a fit attaches it): the closure, then
    on_before_optimizer_step (and, in automatic optimisation, the clipping), the strategy's step (precision,
    engine; `kwargs` reach the optimizer's step), and counts `trainer.global_step`. It returns what the optimizer's
    step returned (for torch's optimizers given a closure: the closure's first result)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        self._optimizer = optimizer
        self._step_fn = None  # (closure, kwargs) -> the step's output: set by the fit that steps it
        self._trainer = None
        base = type(optimizer)
        if base not in _classes:
            _classes[base] = type("Lightning" + base.__name__, (LightningOptimizer, base), {})
        self.__class__ = _classes[base]

    @property
    def optimizer(self):
        return self._optimizer

    # the wrapped optimizer's state, read and written through (a load_state_dict on either is seen by both)
    param_groups = _through("param_groups")
    state = _through("state")
    defaults = _through("defaults")

    def state_dict(self):
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict):
        return self._optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none=True):
        # (Lightning fires on_before_zero_grad in automatic optimisation only: not for the user's own zero_grad())
        return self._optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        return self._optimizer.add_param_group(param_group)

    def step(self, closure=None, **kwargs):
        if closure is None:
            closure = do_nothing_closure
        elif not callable(closure):
            raise MisconfigurationException("When `optimizer.step(closure)` is called, the closure should be callable")
        if self._step_fn is None:
            raise RuntimeError(f"{type(self).__name__}.step(): this optimizer is not attached to a running Trainer's "
                               "fit. Step it from training_step or optimizer_step, or step the torch optimizer "
                               "(`.optimizer`) yourself.")
        return self._step_fn(closure, kwargs)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad=True):
        """Only this optimizer's parameters require gradients inside (the module's toggle_optimizer);
        sync_grad=False: no gradient synchronisation between processes for the backwards inside (an accumulation
        window's middle)."""
        trainer = self._trainer
        if trainer is None:
            raise RuntimeError("toggle_model(): this optimizer is not attached to a running Trainer's fit.")
        module = trainer.module
        with trainer.strategy.no_backward_sync(not sync_grad):
            module.toggle_optimizer(self)
            yield
            module.untoggle_optimizer(self)

    def __reduce__(self):
        # its class is made at run time (one per optimizer class), so a pickle rebuilds it from the optimizer; the
        # link to a running fit is not kept (a step after unpickling says so)
        return LightningOptimizer, (self._optimizer,)

    def __getattr__(self, name):
        if name == "_optimizer":  # missing only mid-unpickle / mid-copy
            raise AttributeError(name)
        return getattr(self._optimizer, name)


def lightning_optimizers(trainer):
    """The LightningOptimizers of the trainer's optimizers, one per optimizer, kept while they stay the same
    objects (Lightning's strategy._lightning_optimizers): self.optimizers() gives the same objects at every call, and
    in automatic optimisation the one optimizer_step receives."""
    current = list(trainer.optimizers)
    kept = trainer.__dict__.get("_lightning_optimizers") or []
    if len(kept) != len(current) or any(w._optimizer is not o for w, o in zip(kept, current)):
        kept = [LightningOptimizer(o) for o in current]
        for wrapper in kept:
            wrapper._trainer = trainer
            wrapper._step_fn = functools.partial(manual_step, trainer, wrapper)
        trainer._lightning_optimizers = kept
    return kept


def manual_step(trainer, optimizer, closure, kwargs):
    """optimizer.step(closure, **kwargs) in manual optimisation (Lightning's order): the closure (it computes the
    gradients), on_before_optimizer_step, the clipping of Trainer(gradient_clip_val=...) and GradientClipping
    callbacks, the strategy's step; then global_step counts it, where the batch's training_step took it (Lightning's
    rule: a step in another hook is not counted). Where the strategy takes closures (32-bit) the
    closure goes into the optimizer's step, which may call it several times (LBFGS)."""
    from tasktrain.trainer.loop import after_closure

    torch_optimizer = optimizer._optimizer
    strategy, fit = trainer.strategy, trainer._fit_state
    strategy.precision.last_step_output = None
    counted = fit is not None and fit.in_manual_training_step  # (Lightning's: only a training_step's steps count)
    if counted:  # (Lightning's optim_step_progress: ready from here, completed once counted)
        fit.optimizer_step_from = trainer.state.global_step
    profiling = counted and trainer._profiler is not None  # (Lightning's "optimizer_step" of a manual step)
    if profiling:
        trainer._profiler.start("optimizer_step")
    if strategy.precision_plugin.lightning_steps:
        # the precision plugin's optimizer_step runs the closure, on_before_optimizer_step and the step (Lightning's)
        strategy.optimizer_step(torch_optimizer, closure, model=trainer.module, **kwargs)
        output = strategy.precision.last_step_output
    elif strategy.steps_with_closure():
        def wrapped():
            out = closure()
            after_closure(trainer, torch_optimizer)
            return out

        strategy.optimizer_step(torch_optimizer, wrapped, **kwargs)
        output = strategy.precision.last_step_output
    else:
        output = closure()
        strategy.unscale_gradients(torch_optimizer)  # (Lightning's AMP plugin: before on_before_optimizer_step)
        after_closure(trainer, torch_optimizer)
        strategy.optimizer_step(torch_optimizer, None, **kwargs)
        output = strategy.precision.last_step_output
    if profiling:
        trainer._profiler.stop("optimizer_step")
    if counted:
        trainer.state.global_step += 1
        fit.optimizer_step_from = None
    return output
