"""Where the Trainer calls Lightning's loop-facing strategy methods (tasktrain/strategies/loop_hooks.py) that a
strategy subclass of one's own overrides: at Lightning's points, with Lightning's arguments. Without an override
nothing here changes the step (the helpers give back tasktrain's own calls)."""
import inspect
from functools import partial

from tasktrain.strategies.loop_hooks import overrides


def run_setup(trainer, strategy, set_up):
    """Lightning's strategy.setup(trainer) at the set-up's place: `set_up` (tasktrain's set-up of the module and
    optimizers) runs inside it, when the override calls super().setup(trainer)."""
    if not overrides(strategy, "setup"):
        set_up()
        return
    trainer._pending_strategy_setup = set_up
    try:
        strategy.setup(trainer)
    finally:
        skipped, trainer._pending_strategy_setup = trainer._pending_strategy_setup, None
    if skipped is not None:
        raise NotImplementedError(
            f"{type(strategy).__name__}.setup(trainer) did not call super().setup(trainer): tasktrain's strategy sets up "
            "its module and optimizers there (the precision's cast, the move, the engine's wrapper), and the run "
            "cannot go on without them. Call super().setup(trainer) in the override, before or after your own code.")


def load_checkpoint(strategy, path, weights_only):
    """strategy.load_checkpoint(path): with Lightning's weights_only= keyword where a subclass of one's own
    overrides it with Lightning's signature (Lightning's checkpoint connector passes the entry point's
    weights_only); an override of tasktrain's one-argument form, and tasktrain's own, read it from the
    trusted_pickles context the caller has entered."""
    if overrides(strategy, "load_checkpoint") and _takes_weights_only(strategy.load_checkpoint):
        return strategy.load_checkpoint(path, weights_only=weights_only)
    return strategy.load_checkpoint(path)


def _takes_weights_only(method) -> bool:
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # (a callable without a signature: a mock)
        return True
    return any(p.name == "weights_only" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def event_hook(strategy, event):
    """The strategy's hook of `event` (on_train_start, ...) where a subclass overrides it, else None. What it returns
    is not read (Lightning's)."""
    if not overrides(strategy, event):
        return None
    return partial(_no_result, _declared(strategy)[event])


def _declared(strategy):
    """The strategy's methods of LoopHooks that the Trainer calls by the event's name."""
    return {"on_train_start": strategy.on_train_start, "on_train_end": strategy.on_train_end,
            "on_train_batch_start": strategy.on_train_batch_start,
            "on_validation_start": strategy.on_validation_start, "on_validation_end": strategy.on_validation_end,
            "on_test_start": strategy.on_test_start, "on_test_end": strategy.on_test_end,
            "on_predict_start": strategy.on_predict_start, "on_predict_end": strategy.on_predict_end}


def _no_result(fn, *args, **kwargs):
    fn(*args, **kwargs)


def training_step(strategy, step):
    """`step` (the strategy's training_step), then post_training_step where it is overridden (Lightning's order)."""
    if not overrides(strategy, "post_training_step"):
        return step

    def call(*args, **kwargs):
        out = step(*args, **kwargs)
        strategy.post_training_step()
        return out
    call.func = getattr(step, "func", step)
    return call


def backward_hooks(strategy):
    """(pre_backward, post_backward) of the strategy where a subclass overrides either, else None: the loop (and
    manual_backward) calls them around the backward and its on_before_backward / on_after_backward hooks, as
    Lightning's strategy.backward calls them around its precision's backward."""
    if overrides(strategy, "pre_backward") or overrides(strategy, "post_backward"):
        return strategy.pre_backward, strategy.post_backward
    return None
