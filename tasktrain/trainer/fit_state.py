"""The state of one fit, as one plain object built once (`FitState`), and the hook tables of a run.

Everything the loop (tasktrain/trainer/loop.py) reads at each micro-batch is here, bound once when the fit's
module, optimizers and data are set up: the optimizers and schedulers, the epoch iterator, the hook tables, the
metric store, the step's parts (the strategy's training_step / backward / step / zero_grad, or the module's
optimization hooks where it overrides them, wrapped for the profiler and the watchdog where those are on), the
clipping the plan asked for, the loss window and the stop flags. The Trainer keeps its public attributes
(`trainer.optimizers`, `trainer.lr_scheduler_configs`, ...) pointing at the same objects.
"""
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from tasktrain.callbacks.base import EVENTS, Callback
from tasktrain.profilers import module_action, profiled, profiled_calls, strategy_action
from tasktrain.strategies.base import ClipsInsideStep, step_arguments
from tasktrain.strategies.watchdog import watched_action
from tasktrain.trainer import strategy_hooks
from tasktrain.trainer.metrics import in_hook
from tasktrain.trainer.module import TaskModule, hook_is_called, is_overridden


@dataclass(slots=True)
class Window:
    """One accumulation window of micro-batches: its first and last index in the epoch, what its losses are
    divided by (accumulate_grad_batches, also where the epoch's end cuts the window short: Lightning's), and
    whether it ends the epoch (its step is then followed by the epoch-end schedulers)."""

    first: int
    divisor: int
    last: int
    ends_epoch: bool


@dataclass(eq=False)
class HookTables:
    """For each event the callables to run, bound once per run, in Lightning's order (`all`): each overriding
    callback's, bound to (trainer, module), then the module's hook (where overridden); on_load_checkpoint the
    module's first; on_train_epoch_end the callbacks other than EarlyStopping/ModelCheckpoint, the module's, then
    those two ("monitoring": they see what the module logs there). `callbacks` holds every callback's,
    `plain` / `monitoring` the two groups."""

    module: dict
    callbacks: dict
    all: dict
    plain: dict = None
    monitoring: dict = None


@dataclass(eq=False)
class FitState:
    module: Any
    optimizers: list
    lr_scheduler_configs: list
    epochs: Any  # EpochIterator of the training data (replaced when reload_dataloaders_every_n_epochs rebuilds it)
    metrics: Any  # MetricStore
    module_hooks: dict  # the HookTables' (the run's hook tables), as plain fields: read at every micro-batch
    callback_hooks: dict
    all_hooks: dict
    to_device: Callable
    # the step's parts
    training_step: Callable  # strategy.training_step(batch, batch_idx)
    backward: Callable  # (loss): strategy.backward, through the module's backward where it overrides it
    step: Callable  # (optimizer) -> stepped: strategy.optimizer_step
    zero_grad: Callable  # (optimizer): strategy.zero_grad
    optimizer_zero_grad: Optional[Callable]  # (epoch, batch_idx, optimizer): the module's, where it overrides it
    optimizer_step: Callable  # (epoch, batch_idx, optimizer, closure): the module's optimizer_step
    lr_scheduler_step: Callable  # (scheduler, metric)
    configure_clipping: Optional[Callable]  # the module's configure_gradient_clipping where it clips its own way
    clippers: list  # GradientClipping callbacks whose requests the step applies (the plan's clipping)
    accumulation_schedules: list  # callbacks that set the window by epoch (get_accumulate_grad_batches(epoch))
    # the precision plugin whose step hooks the step runs (a Lightning plugin subclass overriding one: pre_backward,
    # backward, post_backward, optimizer_step, clip_gradients, ...), or None: tasktrain's own step
    lightning_precision: Any = None
    optimizer: Any = None  # the optimizer automatic optimisation steps (the first)
    stepper: Any = None  # the LightningOptimizer the module's optimizer_step receives (self.optimizers()'s)
    stepped: bool = False  # whether the window's optimizer step really stepped (schedulers follow it)
    plateau_step_batch: Optional[int] = None  # the batch_idx that stepped, for its frequency (None: a resume's)
    plateau_step_due: bool = False  # a step-interval scheduler that watches a metric steps after the validation
    plateau_values: Optional[dict] = None  # the values it watches, from a checkpoint saved before it stepped
    # per epoch
    first_epoch: int = 0
    resumed: bool = False  # this fit continues a checkpoint (ckpt_path): Lightning's is_resuming
    first_batch_drawn: bool = False  # the started pass read its first batch ahead: its first-batch draw was made
    loss_window: list = field(default_factory=list)
    loss_window_start: int = 0
    val_every: Optional[int] = None
    window_backwards: int = 0  # backwards run in this accumulation window (training_step may return None)
    last_val_time: float = 0.0  # time.monotonic() at training start or the last validation's end (a time interval)
    ended_by_hook: bool = False
    # where the loop is, for Lightning's loop counters (lightning_loops.py): None outside an epoch, "start" in its
    # on_train_epoch_start, "run" over its batches and validations, "end" from its on_train_epoch_end on (the batch's:
    # TrainState.batch_phase); restarting: Lightning's fit_loop.restarting
    epoch_phase: Optional[str] = None
    optimizer_step_from: Optional[int] = None  # global_step when the module's optimizer_step began (None: not in it)
    # manual optimisation: the batch's training_step runs; Lightning counts (global_step) only the steps taken there,
    # not an opt.step() of another hook (on_train_epoch_end, a callback's on_train_batch_end)
    in_manual_training_step: bool = False
    zero_grad_phase: Optional[str] = None  # "ready" (on_before_zero_grad), "started" (optimizer_zero_grad), None
    validates_counted_batch: bool = False  # a validation after the batch it follows is in batches_that_stepped
    restarting: bool = False
    # stop flags (should_stop is the trainer's: callbacks set it)
    preempted: bool = False  # SLURM's requeue signal (issue 40)
    sigterm: bool = False  # SIGTERM, as the ranks agreed on it (several processes: loop.agree_on_stop_flags)
    preempt_path: Optional[str] = None
    # the strategy's (pre_backward, post_backward) where a subclass of one's own overrides them (strategy_hooks.py)
    backward_hooks: Optional[tuple] = None


def build_fit_state(trainer, module, optimizers, lr_scheduler_configs, epochs):
    """The FitState of `trainer`'s fit: the step's parts bound once (see the module's docstring)."""
    from tasktrain.trainer.loop import automatic_step, step_scheduler
    from tasktrain.trainer.optim import lightning_optimizers, manual_step

    strategy, profiler, watchdog = trainer.strategy, trainer._profiler, trainer._watchdog
    # (Lightning calls these always: the module's where anything but the base's own function is there)
    overrides = {name: hook_is_called(name, module, TaskModule) for name in (
        "backward", "optimizer_zero_grad", "optimizer_step", "configure_gradient_clipping", "clip_gradients",
        "lr_scheduler_step")}
    metrics = trainer._metrics  # the module's hooks below run named for self.log (metrics.HOOK_LOGGING)
    # (Lightning's plugin object: an engine's DeepSpeedPrecision / FSDPPrecision of the user's is not the plugin the
    # engine runs, strategy.precision, but its hooks are the ones Lightning calls)
    precision = strategy.precision_plugin
    lightning_precision = precision if precision.lightning_steps else None
    if lightning_precision is not None:
        first = optimizers[0] if optimizers else None

        def plugin_backward(loss, *args, **kwargs):  # (Lightning's strategy.backward(loss, optimizer))
            lightning_precision.backward(loss, module, first, *args, **kwargs)

        def backward(loss):  # (pre_backward and post_backward around it: loop.py)
            strategy.backward(loss, None, backward_fn=plugin_backward)
    elif overrides["backward"]:
        module_backward = in_hook(metrics, "backward", module.backward)

        def backward(loss):
            strategy.backward(loss, None, backward_fn=module_backward)
    else:
        def backward(loss):
            strategy.backward(loss, None)

    def step(optimizer, closure=None, **kwargs):  # -> whether it stepped
        return strategy.optimizer_step(optimizer, closure, **kwargs)

    def strategy_training_step(batch, batch_idx):  # (Lightning's loop: batch_idx where the step takes it)
        return strategy.training_step(*step_arguments(module.training_step, batch, batch_idx))

    zero_grad = strategy.zero_grad
    training_step = in_hook(metrics, "training_step", strategy_hooks.training_step(strategy, strategy_training_step))
    module_optimizer_step = in_hook(metrics, "optimizer_step", module.optimizer_step)
    module_zero_grad = in_hook(metrics, "optimizer_zero_grad", module.optimizer_zero_grad) \
        if overrides["optimizer_zero_grad"] else None
    if profiler is not None:  # only then is a part wrapped: without one they are called as they are (Lightning's
        # names: the strategy's hooks, the module's optimizer_step (around the closure) and optimizer_zero_grad)
        training_step, backward = (profiled(profiler, strategy_action(strategy, name), fn) for name, fn in (
            ("training_step", training_step), ("backward", backward)))
        zero_grad, module_optimizer_step, module_zero_grad = (
            fn if fn is None else profiled(profiler, module_action(module, name), fn) for name, fn in (
                ("optimizer_zero_grad", zero_grad), ("optimizer_step", module_optimizer_step),
                ("optimizer_zero_grad", module_zero_grad)))
    # the module's configure_gradient_clipping (automatic optimisation only) clips in place of the Trainer's request
    # (under the plugin's step hooks always: Lightning's _after_closure calls it, the Trainer's gradient_clip_val its
    # argument, and its default clips through the plugin's clip_gradients)
    module_clips = module.automatic_optimization and (
        overrides["configure_gradient_clipping"] or overrides["clip_gradients"] or lightning_precision is not None)
    clippers = [cb for cb in clipping_callbacks(trainer.callbacks)
                if not (module_clips and getattr(cb, "from_trainer", False))]
    fit = FitState(
        module=module, optimizers=optimizers, lr_scheduler_configs=lr_scheduler_configs, epochs=epochs,
        metrics=trainer._metrics, module_hooks=trainer._module_hooks, callback_hooks=trainer._callback_hooks,
        all_hooks=trainer._all_hooks, to_device=trainer._to_device,
        training_step=training_step, backward=watched_action(watchdog, "backward", backward),
        step=watched_action(watchdog, "optimizer step", step,
                            after="after the optimizer step (logging, validation, callbacks)"),
        zero_grad=zero_grad, optimizer_step=module_optimizer_step, optimizer_zero_grad=module_zero_grad,
        lr_scheduler_step=in_hook(metrics, "lr_scheduler_step", module.lr_scheduler_step)
        if overrides["lr_scheduler_step"] else step_scheduler,
        configure_clipping=in_hook(metrics, "configure_gradient_clipping", module.configure_gradient_clipping)
        if module_clips else None, clippers=clippers,
        accumulation_schedules=accumulation_schedules(trainer.callbacks),
        first_epoch=trainer.state.epoch,  # (set again once a resume has restored the state: loop.py)
        lightning_precision=lightning_precision, backward_hooks=strategy_hooks.backward_hooks(strategy),
    )
    if profiler is not None:  # (Lightning times the module's lr_scheduler_step, its default's step too)
        fit.lr_scheduler_step = profiled(profiler, module_action(module, "lr_scheduler_step"), fit.lr_scheduler_step)
    wrappers = lightning_optimizers(trainer)  # (trainer.optimizers are `optimizers`)
    for wrapper in wrappers:  # (kept from an earlier fit where configure_optimizers returned the same objects)
        wrapper._step_fn = partial(manual_step, trainer, wrapper)
    if optimizers:
        fit.optimizer, fit.stepper = optimizers[0], wrappers[0]
        if module.automatic_optimization:
            fit.stepper._step_fn = partial(automatic_step, trainer, fit, fit.stepper)
    return fit


def check_optimization_hooks(module, strategy):
    """Before training: the module's optimization hooks that this strategy cannot honour, as a clear error."""
    if module.automatic_optimization and isinstance(strategy, ClipsInsideStep) and \
            is_overridden("backward", module, TaskModule):
        raise NotImplementedError(
            f"{type(module).__name__} overrides backward, but {type(strategy).__name__}'s engine runs the backward "
            "itself (it scales and partitions the gradients), so the override would not be called. Move what it "
            "does to on_before_backward / on_after_backward, or use a strategy without an engine of its own "
            "(ddp, fsdp).")


def clipping_callbacks(callbacks):
    """The callbacks that clip at each optimizer step (a plain interface: `requests`, the GradientClip records the
    plan tells the strategy, and `clip(trainer, module, optimizer)`, which the step calls): GradientClipping."""
    return [cb for cb in callbacks if callable(getattr(cb, "clip", None)) and isinstance(getattr(cb, "requests", None),
                                                                                          tuple)]


def accumulation_schedules(callbacks):
    """The callbacks that set the accumulation window by epoch (a plain interface: `accumulation_schedule`, a dict
    {first epoch: window}, and `get_accumulate_grad_batches(epoch)`), for the plan and for a mid-epoch resume."""
    return [cb for cb in callbacks if isinstance(getattr(cb, "accumulation_schedule", None), dict)
            and callable(getattr(cb, "get_accumulate_grad_batches", None))]


# the events Lightning also calls on its strategy (`_call_strategy_hook`), timed under a profiler
_STRATEGY_EVENTS = ("on_train_start", "on_train_end", "on_train_batch_start", "on_validation_start", "on_validation_end",
                    "on_test_start", "on_test_end", "on_predict_start", "on_predict_end")


def _nothing(*args, **kwargs):
    return None


def build_hook_tables(trainer, module):
    """For each event the overriding callbacks, then the module's hook (if overridden), bound once (Lightning's
    order; HookTables)."""
    from tasktrain.callbacks.base import Checkpoint
    from tasktrain.callbacks.early_stopping import EarlyStopping

    tables = {}
    # With a profiler, every hook is in the tables, overridden or not (the base's are no-ops): Lightning profiles
    # each hook call of each callback and of the module, so the recorded actions and counts are its. Without one, a
    # hook nobody overrides costs nothing.
    every = trainer._profiler is not None
    for event in EVENTS:
        fns = []
        for cb in trainer.callbacks:
            if hook_is_called(event, cb, Callback) or (every and callable(getattr(cb, event, None))):
                kind = "monitor" if isinstance(cb, (EarlyStopping, Checkpoint)) else "callback"
                fns.append((kind, partial(getattr(cb, event), trainer, module), cb))
        # (the module's hooks are the events TaskModule defines: Lightning calls no module's on_sanity_check_* or
        # on_exception)
        if hasattr(TaskModule, event) and (hook_is_called(event, module, TaskModule) or
                                           (every and callable(getattr(module, event, None)))):
            own = ("module", getattr(module, event), module)
            if event == "on_load_checkpoint":
                fns.insert(0, own)
            elif event == "on_train_epoch_end":
                fns.append(own)
                fns.sort(key=lambda item: {"callback": 0, "module": 1, "monitor": 2}[item[0]])  # (a stable sort)
            else:
                fns.append(own)
        strategy_hook = strategy_hooks.event_hook(trainer.strategy, event) if event in _STRATEGY_EVENTS else None
        if strategy_hook is not None:  # a subclass's override, after the callbacks' and the module's (Lightning's)
            fns.append(("strategy", strategy_hook, trainer.strategy))
        elif every and event in _STRATEGY_EVENTS:  # Lightning times its strategy's hooks of these events too (its
            # strategies do nothing there, nor does tasktrain's: an empty call, timed under Lightning's name)
            fns.append(("strategy", _nothing, trainer.strategy))
        # each hook named for self.log while it runs (Lightning's rules and defaults per hook: metrics.HOOK_LOGGING)
        fns = [(kind, in_hook(trainer._metrics, event, fn), owner) for kind, fn, owner in fns]
        if trainer._profiler is not None:  # only then is a hook wrapped: without one they are called as they are
            # each call is named by its owner, carried with it (the epoch-end sort and bare Mocks move no name)
            tables[event] = [(k, f) for (k, _, _), f in zip(fns, profiled_calls(trainer._profiler, event, fns))]
        else:
            tables[event] = [(k, f) for k, f, _ in fns]

    def pick(*kinds):
        return {e: [f for k, f in fns if k in kinds] for e, fns in tables.items()}

    return HookTables(module=pick("module", "strategy"), callbacks=pick("callback", "monitor"),
                      all={e: [f for _, f in fns] for e, fns in tables.items()}, plain=pick("callback"),
                      monitoring=pick("monitor"))
