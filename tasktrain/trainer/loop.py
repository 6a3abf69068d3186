"""The training loop: plain functions over one FitState (tasktrain/trainer/fit_state.py), read top to bottom.

    fit_loop(trainer, fit)                 epochs until max_epochs / max_steps / an agreed stop
      begin_epoch / train_epoch            the epoch's start, its micro-batches, then its end (metrics, validation, ...)
        training_step(trainer, fit, ...)   one micro-batch; at its window's last one, the optimizer step

One micro-batch of automatic optimisation, in Lightning's order (in each event the callbacks' hooks, then the
module's):

    on_train_batch_start
    closure():  training_step -> (window's first) on_before_zero_grad, optimizer_zero_grad -> on_before_backward,
                backward, on_after_backward (under the strategy's no_backward_sync inside a window)
    window's last micro-batch:  module.optimizer_step(epoch, batch_idx, optimizer, closure), whose default is
                optimizer.step(closure=closure): the closure runs, then on_before_optimizer_step, the clipping
                (configure_gradient_clipping / the planned GradientClip requests) and the strategy's step;
                then the step-interval schedulers
    otherwise:  closure()
    on_train_batch_end
    then (Lightning's on_advance_end): a stepped batch's step values to the loggers at Lightning's log steps,
                validation when due (after any batch), then a stepped batch is counted in batches_that_stepped
                (the loggers' step)
"""
import logging
import os
import sys
import time
import warnings

import torch

from tasktrain.profilers import module_action
from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning, SIGTERMException
from tasktrain.strategies.watchdog import watched_batches
from tasktrain.trainer import guards, loaders
from tasktrain.trainer.data import draw_loader_seed
from tasktrain.trainer.epoch import EpochIterator
from tasktrain.trainer.fit_state import Window
from tasktrain.trainer.metrics import hook_scope
from tasktrain.trainer.module import TaskModule

_log = logging.getLogger("tasktrain")
_rank_zero_log = logging.getLogger("tasktrain.utilities.rank_zero")  # (Lightning's rank_zero_debug's logger)


# -- the loop --------------------------------------------------------------------------------------------------------
def fit_loop(trainer, fit):
    # (no module.train() here: Lightning leaves the module's modes as they are, and evaluation gives them back)
    trainer.training = True
    fit.first_epoch = trainer.state.epoch  # its first step may compile: no watchdog deadline (issue 19)
    guards.check_val_interval_fits(trainer, trainer._loader_data.has_len())
    if trainer.loggers and trainer._num_training_batches is not None and not trainer.fast_dev_run and \
            trainer._num_training_batches < trainer.log_every_n_steps:
        warnings.warn(f"The number of training batches ({trainer._num_training_batches}) is smaller than the logging "
                      f"interval Trainer(log_every_n_steps={trainer.log_every_n_steps}). Set a lower value for "
                      "log_every_n_steps if you want to see logs for the training epoch.", PossibleUserWarning)
    warn_if_modules_in_eval_mode(trainer, fit.module)
    fit.epoch_phase = "run" if trainer.state.batch_in_epoch else None  # (resumed inside an epoch: it goes on)
    trainer._call("on_train_start")
    fit.last_val_time = time.monotonic()  # a val_check_interval of time counts from here
    while not done(trainer):
        if trainer.should_stop and may_stop(trainer, fit):  # asked before the epoch (a spent Timer at fit start)
            break
        epoch = trainer.state.epoch
        # Lightning re-calls the loader hook (not a given loader) once reload_dataloaders_every_n_epochs epochs passed
        # since the epoch it last requested it at
        reloaded = loaders.train_reload_due(trainer)
        if reloaded:
            loaders.reload(trainer, fit)
            # Lightning's setup_data iterates a reloaded loader once more, before set_epoch and on_train_epoch_start
            # (its new fetcher reads a loader without a length ahead unprofiled)
            start_pass(trainer, fit, epoch, profile_first=False)
        # (on_train_epoch_start: outside the epoch's profile, as Lightning's)
        begun = begin_epoch(trainer, fit, epoch, profile_first=not reloaded)
        with trainer._profile("run_training_epoch"):
            train_epoch(trainer, fit, epoch, begun)
        finished = trainer.state.epoch_finished
        if finished:  # current_epoch counts the finished epochs, also when the run stops here
            fit.epochs.end_epoch()
            trainer.state.epoch_finished = trainer.state.epoch_started = False
        fit.epoch_phase, fit.restarting = None, False  # (Lightning's restart ends with the first epoch)
        if sigterm_due(trainer, fit):  # Lightning's fit loop checks at each epoch's end (issue 37)
            stop_on_sigterm(trainer, fit)
        if (trainer.should_stop and may_stop(trainer, fit)) or max_steps_reached(trainer):
            # Lightning counts an epoch the run stopped inside too (its epoch loop ended); the position stays in
            # the train state, so a resume continues inside that epoch
            trainer._epoch_cut_short = not finished
            break
        if trainer.should_stop and "min limits" not in trainer._said_once:  # kept until min_epochs/min_steps
            trainer._said_once.add("min limits")  # allow it, even inside an epoch (Lightning's rule); said once
            _log.info(f"Trainer was signaled to stop but the required `min_epochs={trainer.min_epochs!r}` or "
                      f"`min_steps={trainer.min_steps!r}` has not been met. Training will continue...")
    fit.restarting = False  # (also where no epoch ran: Lightning's loop ends its restart with its run)
    say_why_fit_stopped(trainer, stopped=trainer.should_stop and may_stop(trainer, fit))
    trainer._call("on_train_end")  # (trainer.training stays True until the run ends, as Lightning's)


def start_training(trainer, fit):
    """Lightning's first iter() of the training data (its fit loop's setup_data), before on_train_start: the fit's
    first pass is started here (workers start, a loader without a length is read one batch ahead), also where the
    loop then has nothing left to run (Lightning's sets its data up before it asks). A resumed fit sets the epoch and
    position first (begin_before_start), so that workers, which take their first indices inside iter(), read the
    resumed epoch from the resumed position: Lightning's iter() there comes before its set_epoch, and its workers read
    the order of the epoch the sampler was at (docs/lightning.md); tasktrain's resume stays exact."""
    state = trainer.state
    fit.first_epoch = state.epoch
    if fit.resumed:
        fit.epochs.begin_before_start(state.epoch)
    # (a fit resumed mid-epoch got its generators' states back from after the draws of its pass's iter(): issue 37)
    start_pass(trainer, fit, state.epoch, draw=state.batch_in_epoch == 0, profile_first=False)


def start_pass(trainer, fit, epoch, draw=True, profile_first=True):
    """Lightning's iter() of the training data (its fetcher's): the draws the user's loader would make there, which
    the Trainer's rebuilt loader does not (draw_loader_seed: its base seed; with workers, a RandomSampler's seed),
    then the pass's iterator (EpochIterator.start_pass). A loader without a length is read one batch ahead there, so
    its first-batch draw is made there too, not after on_train_epoch_start."""
    reads_ahead = fit.epochs.length is None
    if draw:
        draw_loader_seed(trainer._loader_data, epoch, at_first_batch=reads_ahead)
    fit.first_batch_drawn = draw and reads_ahead
    if trainer._watchdog is not None:  # (workers start, a first batch may be read: it may take any time)
        trainer._watchdog.mark("fetching a batch", trainer.state.global_step, trainer.state.batch_in_epoch, True)
    fit.epochs.start_pass(trainer._profiler, profile_first)


def warn_if_modules_in_eval_mode(trainer, module):
    """Lightning's warning: the loop does not call module.train(), so a submodule left in eval mode (dropout off,
    BatchNorm frozen) trains that way; often a leftover of an earlier evaluation or of loading."""
    in_eval = [name for name, child in module.named_modules() if not child.training]
    if in_eval and trainer.is_global_zero:
        warnings.warn(f"Found {len(in_eval)} module(s) in eval mode at the start of training. This may lead to "
                      "unexpected behavior during training. If this is intentional, you can ignore this warning.",
                      PossibleUserWarning, stacklevel=2)


def begin_epoch(trainer, fit, epoch, profile_first=True):
    """An epoch's start (on_train_epoch_start, unless a resume goes on inside the epoch), before Lightning's
    "run_training_epoch" profile as in its fit loop (on_advance_start); (the epoch's batches, the batch it starts at)
    for train_epoch."""
    state, metrics = trainer.state, fit.metrics
    metrics.set_stage("train", True, False)
    metrics.step_values.clear()  # Lightning resets the epoch's results: a step value of the last epoch is not written
    # Resumed mid-epoch: the epoch iterator skips what was trained on, without loading it on the Trainer's order.
    num_batches = trainer.num_training_batches = fit.epochs.begin(epoch)
    start = state.batch_in_epoch
    if start == 0:  # a mid-epoch resume goes on with the epoch: it does not start it again (Lightning's)
        state.epoch_validated = False
        fit.epoch_phase, state.batch_phase = "start", None
        state.epoch_started = True  # (before the hook: a checkpoint saved in it holds it)
        epochs = fit.epochs
        trainer._call("on_train_epoch_start")
        rebuilt = fit.epochs is not epochs
        if rebuilt:  # the hook built the training data again (a BatchSizeFinder): this epoch reads it
            num_batches = trainer.num_training_batches = fit.epochs.begin(epoch)
        fit.epoch_phase = "run"
        # Lightning's epoch loop resets its batch counts (`current`) and is_last_batch after on_train_epoch_start
        state.epoch_batches_from, state.epoch_cut = state.batches_taken, False
        state.epoch_steps_from, state.epoch_zero_grads_from = state.global_step, state.zero_grads
        state.epoch_scheduler_steps_from = state.scheduler_steps
        state.eval_batches["val"][0] = 0  # (Lightning's total counts the validation batches of each epoch)
        # Lightning's iter() of each epoch after the first (its epoch loop's rule: current_epoch > 0, unless this is
        # the first epoch of a fit resumed from a checkpoint: a second fit of the same Trainer iterates again), after
        # on_train_epoch_start (the first epoch reads the pass start_training made; one whose data a hook built again
        # starts it here), then (every epoch) its first batch, where a RandomSampler it kept draws the order
        first_of_resumed = fit.resumed and epoch == fit.first_epoch
        if epoch > 0 and not first_of_resumed:
            start_pass(trainer, fit, epoch, profile_first=profile_first)
        elif rebuilt:
            start_pass(trainer, fit, epoch, draw=False)
        if not fit.first_batch_drawn:  # (a pass read ahead at its iter() made it there)
            draw_loader_seed(trainer._loader_data, epoch, at_iter=False)
        fit.first_batch_drawn = False
    return num_batches, start


def train_epoch(trainer, fit, epoch, begun):
    """One epoch, begun (begin_epoch): its micro-batches through `training_step`, then its end (metrics, validation,
    schedulers, hooks)."""
    state, metrics, module = trainer.state, fit.metrics, fit.module
    num_batches, start = begun
    if start and fit.accumulation_schedules:  # what the schedule set when the epoch began (its on_train_epoch_start)
        trainer.accumulate_grad_batches = fit.accumulation_schedules[0].get_accumulate_grad_batches(epoch)
    if start and fit.plateau_values is not None:  # resumed from a checkpoint saved before that step: taken now
        step_plateau_schedulers(trainer, fit)
    # In manual optimisation training_step steps the optimizers itself: every batch is a window of one. Read after
    # the epoch-start hooks: a GradientAccumulationScheduler sets it there.
    accumulate = trainer.accumulate_grad_batches if module.automatic_optimization else 1
    fit.loss_window, fit.loss_window_start = [], start
    fit.val_every = val_every_n_batches(trainer)
    if start:  # a batch a checkpoint was saved in (its on_train_batch_end) completes when the loop goes on
        if state.batch_phase == "restored" and val_this_epoch(trainer) and val_due_after(trainer, fit, start - 1):
            # Lightning's restart does not run again the validation due after that batch, and counts its batches
            # as run (its val_loop's increment_progress_to_evaluation_end); neither runs it here
            count_validation_as_run(trainer)
        state.batch_phase = None
    state.saved_in_stepping_batch = False  # (the saved batch is counted from here on: lightning_loops.py)
    fit.ended_by_hook = False
    batches = watched_batches(trainer._watchdog, fit.epochs.batches(trainer._profiler), "training_step",
                              lambda: state.global_step, start, epoch == fit.first_epoch,
                              end_event="end of the training epoch")
    if start == 0:
        state.is_last_batch = False
    for batch_idx, batch, window in windows(batches, accumulate, num_batches):
        state.is_last_batch = batch_idx == window.last and window.ends_epoch  # (trainer.is_last_batch)
        if not training_step(trainer, fit, batch, batch_idx, window):
            break
    del batches  # (the watchdog's end-of-epoch mark)

    check_finite_loss(trainer, fit)
    if fit.preempted and trainer.should_stop:
        return
    # epoch end: validation when due, train epoch metrics, on_train_epoch_end, then the metric-watching schedulers.
    complete = num_batches is None or state.batch_in_epoch >= num_batches or fit.ended_by_hook
    # the epoch's batches all ran: a loader without a length ran out (not cut by max_steps or a stop): the epoch-end
    # validation and the epoch schedulers need that, as Lightning's (is_last_batch, _num_ready_batches_reached)
    ran_out = state.is_last_batch if num_batches is None else complete
    # Lightning writes the epoch's values (and the epoch-end validation's) at the last stepped batch's index
    last_step = state.batches_that_stepped - 1
    # (-1: no validation, as Lightning; nor with a val_check_interval of batches that the epoch's length is no
    # multiple of: Lightning validates at those multiples only; without a length, val_due_after ran those, the last
    # batch's included)
    interval_ends_here = fit.val_every is None or (num_batches is not None and num_batches % fit.val_every == 0)
    # (not again when resumed from a checkpoint its on_validation_end saved, as Lightning's restart skips it)
    if ran_out and not fit.ended_by_hook and interval_ends_here and not state.epoch_validated and \
            val_at_epoch_end(trainer, epoch):
        state.epoch_validated = True  # (before: a checkpoint saved in it holds it)
        run_validation(trainer, last_step)
    step_plateau_schedulers(trainer, fit)  # the last batch's, after its (epoch-end) validation as in Lightning
    metrics.set_stage("train", False, True)
    # Lightning reduces the epoch's training values once its validation ran (the fit loop's epoch end): the epoch-end
    # validation's callbacks and progress bar see those of the epoch before; written after on_train_epoch_end
    epoch_values = metrics.reduce_epoch("train")
    if complete:
        state.epoch_finished = True
    fit.epoch_phase = "end"
    # Lightning's order: the callbacks, the module, then EarlyStopping/ModelCheckpoint, which see the epoch's metrics
    # (what the module logged here included)
    for fn in trainer._plain_hooks["on_train_epoch_end"]:
        fn()
    for fn in fit.module_hooks["on_train_epoch_end"]:
        fn()
    epoch_values.update(metrics.reduce_epoch("train"))
    for fn in trainer._monitoring_hooks["on_train_epoch_end"]:
        fn()
    # one write, as Lightning's, after ModelCheckpoint's save of the epoch (its after_save_checkpoint comes first)
    trainer._flush_epoch_metrics(epoch_values, last_step)
    metrics.reset_metric_objects()  # (Lightning's reset_results: the epoch-end hooks could read their state)
    if ran_out and module.automatic_optimization:  # (under manual optimisation training_step steps its schedulers)
        # the metric-watching ones after the epoch-end hooks (Lightning's fit loop: they may watch a value logged in
        # on_train_epoch_end); the others stepped at the epoch's last batch (or the one on_train_batch_start ended it at)
        step_schedulers(trainer, fit, "epoch", plateau=True)
    stop_agreed(trainer, fit, at_interval=False)


def count_validation_as_run(trainer):
    """Lightning's val_loop.increment_progress_to_evaluation_end: the validation's batches counted as run (`total` and
    `current`, the longest loader's), without running it."""
    counts = [n for n in trainer.num_val_batches if n != float("inf")]
    if counts and trainer.limit_val_batches != 0:
        trainer.state.eval_batches["val"] = [count + max(counts) for count in trainer.state.eval_batches["val"]]
        trainer.state.eval_is_last_batch["val"] = True


def windows(batches, accumulate, num_batches):
    """(index, batch, Window) from the epoch iterator's (index, batch, last of the epoch): the accumulation window
    of each micro-batch as one record, made once per window. Windows start at multiples of `accumulate`; the last
    one is cut short by the epoch's end. Every window's losses are divided by `accumulate`, the short one's too
    (Lightning's closure divides by accumulate_grad_batches always): its step takes a smaller gradient."""
    window = None
    for batch_idx, batch, last_of_epoch in batches:
        if window is None or batch_idx > window.last:
            first, size = EpochIterator.window(batch_idx, accumulate, num_batches)
            window = Window(first, accumulate, first + size - 1,
                            num_batches is not None and first + size == num_batches)
        if last_of_epoch and (batch_idx != window.last or not window.ends_epoch):
            window = Window(window.first, window.divisor, batch_idx, True)  # an epoch without a length ended here
        yield batch_idx, batch, window


def training_step(trainer, fit, batch, batch_idx, window):
    """One micro-batch (see the module's docstring); False when the epoch ends after it (a hook's -1, a stop
    request, max_steps)."""
    state, hooks, module = trainer.state, fit.all_hooks, fit.module
    state.batches_taken += 1  # (Lightning's batch_progress: ready, then started / processed / completed below)
    state.batch_phase = "ready"
    batch = fit.to_device(batch)
    fit.metrics.set_batch(batch)
    skip_rest = False
    if batch is None and not _warned_once["none batch"]:  # (the loader's collate_fn may drop a whole batch)
        _warned_once["none batch"] = True
        warnings.warn("train_dataloader yielded None. If this was on purpose, ignore this warning...",
                      stacklevel=2)  # Lightning's words
    for fn in fit.callback_hooks["on_train_batch_start"] if batch is not None else ():
        fn(batch, batch_idx)  # the callbacks', then the module's (Lightning's order)
    for fn in fit.module_hooks["on_train_batch_start"] if batch is not None else ():
        response = fn(batch, batch_idx)
        skip_rest = skip_rest or (type(response) is int and response == -1)
    if skip_rest:  # Lightning's rule: the module's on_train_batch_start returned -1, the epoch ends here
        fit.ended_by_hook = True
        state.batches_cut += 1  # (Lightning counts this batch processed, never started nor completed)
        state.epoch_cut = state.is_last_batch = True
        state.batch_phase = None
        if module.automatic_optimization:  # Lightning's: this batch ends the epoch, so the schedulers that do not
            # watch a metric step now, before on_train_epoch_end (no optimizer step was taken: Lightning's too)
            step_schedulers(trainer, fit, "step", plateau=False, batch_idx=batch_idx)
            step_schedulers(trainer, fit, "epoch", plateau=False)
        return False
    state.batch_phase = "started"
    steps = batch_idx == window.last
    # Lightning's "run_training_batch" action: the batch's optimization (with a profiler only; a failed batch's is
    # ended by the profiler's teardown)
    profiling = trainer._profiler is not None and batch is not None
    if profiling:
        trainer._profiler.start("run_training_batch")
    if batch is None:  # Lightning's: no training_step, no optimizer step; on_train_batch_end gets None
        batch_output = None
    elif module.automatic_optimization:
        batch_output, ran = {}, False

        def closure():  # Lightning's optimizer closure: forward, zero_grad at a window's first micro-batch, backward
            nonlocal batch_output, ran
            ran = True
            batch_output = {}  # (a training_step that returned None: Lightning's empty dict)
            # DDP skips the gradient all-reduce inside a window (it must cover the forward); DeepSpeed learns where
            # the window ends
            with trainer.strategy.no_backward_sync(not steps):
                outputs = fit.training_step(batch, batch_idx)
                skipped = outputs is None  # Lightning's rule: this batch is skipped (no backward)
                if skipped:
                    trainer.strategy.check_step_can_be_skipped(f"training_step returned None at batch {batch_idx}")
                    if not _warned_once["skip"]:  # once per process, as Lightning's (a class-level warning cache)
                        _warned_once["skip"] = True
                        warnings.warn("`training_step` returned `None`. If this was on purpose, ignore this warning...",
                                      stacklevel=2)  # Lightning's words
                else:
                    loss = loss_of(outputs, batch_idx)
                    fit.loss_window.append(_finite_probe(loss))
                    loss = EpochIterator.per_window(loss, window.divisor)
                    # what on_train_batch_end receives (Lightning's): a dict whose loss is this micro-batch's share
                    # of the window, without its graph (a user keeping it would hold every step's graph alive)
                    extra = {k: v for k, v in outputs.items() if k != "loss"} if isinstance(outputs, dict) else {}
                    batch_output = {"loss": loss.detach().clone(), **extra}
                optimizer = fit.optimizer
                if batch_idx == window.first:  # Lightning zeroes at a window's first backward, not after the step
                    fit.window_backwards = 0
                    state.zero_grads += 1  # (Lightning's optim_progress.optimizer.zero_grad)
                    fit.zero_grad_phase = "ready"
                    for fn in hooks["on_before_zero_grad"]:
                        fn(optimizer)
                    fit.zero_grad_phase = "started"
                    if fit.optimizer_zero_grad is None:
                        fit.zero_grad(optimizer)
                    else:
                        fit.optimizer_zero_grad(state.epoch, batch_idx, optimizer)
                    fit.zero_grad_phase = None
                if skipped:
                    return None
                precision, backed = fit.lightning_precision, loss
                if fit.backward_hooks is not None:  # the strategy's pre_backward (a subclass's: Lightning's place)
                    fit.backward_hooks[0](loss)
                if precision is None:
                    for fn in hooks["on_before_backward"]:
                        fn(loss)
                    fit.backward(loss)
                    fit.window_backwards += 1
                    for fn in hooks["on_after_backward"]:
                        fn()
                else:  # the precision plugin's step hooks (Lightning's strategy.backward); they call the two hooks
                    scaled = precision.pre_backward(loss, module)
                    fit.backward(scaled)
                    fit.window_backwards += 1
                    backed = precision.post_backward(scaled, module)
                if fit.backward_hooks is not None:
                    fit.backward_hooks[1](backed)
            return loss.detach()  # (Lightning's closure returns the loss without its graph)

        if not steps:
            closure()
        else:
            fit.stepped = False
            # the module's hook; its default optimizer.step(closure=closure) runs the closure, then
            # on_before_optimizer_step, the clipping and the strategy's step (loop.automatic_step)
            fit.optimizer_step_from = state.global_step  # (Lightning's optimizer step: ready, completed after)
            fit.optimizer_step(state.epoch, batch_idx, fit.stepper, closure)
            fit.optimizer_step_from = None
            if not ran:
                closure_not_run(module)
            # Lightning's: at every window's end, also where nothing stepped (GradScaler skipped it, every
            # training_step returned None, the module's optimizer_step did not step); the metric-watching ones once
            # this batch's validation ran (they may watch its values)
            step_schedulers(trainer, fit, "step", plateau=False, batch_idx=batch_idx)
            fit.plateau_step_due, fit.plateau_step_batch = True, batch_idx
            if window.ends_epoch:
                step_schedulers(trainer, fit, "epoch", plateau=False)  # Lightning: at the epoch's last batch
    else:
        fit.in_manual_training_step = True
        try:
            batch_output = manual_output(fit.training_step(batch, batch_idx))
        finally:
            fit.in_manual_training_step = False
    if profiling:
        trainer._profiler.stop("run_training_batch")
    fit.epochs.advance(batch_idx)
    state.batch_phase = "processed"

    state.stepping_batch = steps  # (a checkpoint saved from here to the count below counts this batch)
    if steps and trainer.should_update_logs:
        check_finite_loss(trainer, fit)
    for fn in hooks["on_train_batch_end"]:
        fn(batch_output, batch, batch_idx)
    state.batch_phase = None  # (completed)
    fit.metrics.set_batch(None)  # (Lightning's: what is logged after the batch's hooks infers no batch size)
    # Lightning's order: the step metrics (what on_train_batch_end logged included), validation (after any batch, a
    # window's middle included), then the count
    if steps and (trainer.should_update_logs or trainer.fast_dev_run):  # (fast_dev_run: every step, Lightning's)
        trainer._flush_step_metrics()  # at state.batches_that_stepped
    last_of_epoch = state.is_last_batch  # (a loader without a length: it ran out at this batch)
    validated = True
    if val_due_after(trainer, fit, batch_idx):
        run_validation(trainer, zero_grad=steps)
    elif trainer._val_check_time_interval is not None and val_time_is_up(trainer, fit, batch_idx):
        run_validation(trainer, zero_grad=steps)
        fit.last_val_time = time.monotonic()
    else:
        validated = False
    if fit.plateau_step_due and not window.ends_epoch:  # (the epoch's last batch: after the epoch-end validation)
        step_plateau_schedulers(trainer, fit)
    if steps:
        state.batches_that_stepped += 1
        state.stepping_batch = False
    requested = steps and stop_agreed(trainer, fit, at_interval=True) and may_stop(trainer, fit)
    if requested and not validated and not last_of_epoch and not fit.preempted and val_this_epoch(trainer):
        # Lightning validates once more where a stop request ends the epoch early (a Timer, should_stop set in a
        # hook): its ModelCheckpoint/EarlyStopping see the last weights. (The epoch's last batch: the epoch-end
        # validation.) Written at this batch's step, as the validation before the count would be.
        run_validation(trainer, state.batches_that_stepped - 1, zero_grad=steps)
    if trainer.should_stop:  # Lightning's: a stop asked, the loggers write what they hold (every rank, as there)
        for logger in trainer.loggers:
            logger.save()
    # Lightning's check after each batch (issue 37); at the epoch's last batch or max_steps it is the epoch end's
    if sigterm_due(trainer, fit) and not (state.is_last_batch or max_steps_reached(trainer)):
        stop_on_sigterm(trainer, fit)
    return not (requested or (steps and max_steps_reached(trainer)))


_warned_once = {"skip": False, "none batch": False}


def manual_output(outputs):
    """What on_train_batch_end receives from a manual-optimisation training_step (Lightning's): a dict, its loss
    without the graph that manual_backward already used."""
    if outputs is None:
        return {}
    if isinstance(outputs, torch.Tensor):
        return {"loss": outputs.detach()}
    if isinstance(outputs, dict):
        return {**outputs, "loss": outputs["loss"].detach()} if "loss" in outputs else dict(outputs)
    raise MisconfigurationException(
        "In manual optimization, `training_step` must either return a Tensor or have no return.")


def closure_not_run(module):
    raise MisconfigurationException(  # (Lightning's error and words first)
        "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your `optimizer_step` hook? It "
        "could also happen because the `optimizer.step(optimizer_closure)` call did not execute it internally. ("
        f"{type(module).__name__}.optimizer_step did not run the closure it was given: call "
        "optimizer.step(closure=optimizer_closure), or optimizer_closure() before deciding not to step, so that "
        "training_step and backward run.)")


def automatic_step(trainer, fit, optimizer, closure, kwargs):
    """optimizer.step(closure, **kwargs) of automatic optimisation (the LightningOptimizer that the module's
    optimizer_step receives): the closure (training_step, zero_grad, backward), then on_before_optimizer_step, the
    clipping and the strategy's step (the engine's: DeepSpeed, FSDP, the GradScaler, which may skip it). Where the
    strategy takes closures (32-bit) the closure goes into the optimizer's step, which may call it several times
    (LBFGS), each call followed by the hooks and the clipping (Lightning's precision plugin); elsewhere it runs
    first. global_step counts the step here, as in Lightning: an optimizer_step that reads it after
    optimizer.step() (the warm-up of Lightning's docs) sees the step it just took. Returns what the optimizer's
    step returned."""
    torch_optimizer = optimizer._optimizer

    precision = trainer.strategy.precision
    precision.last_step_output = None
    if fit.lightning_precision is not None:
        # the precision plugin's optimizer_step runs the closure, then after_closure, then the step (Lightning's)
        stepped = fit.step(torch_optimizer, closure, model=fit.module, **kwargs)
        fit.stepped = stepped and fit.window_backwards > 0
        trainer.state.global_step += 1
        return precision.last_step_output
    if trainer.strategy.steps_with_closure():
        def wrapped():
            out = closure()
            after_closure(trainer, torch_optimizer)  # (Lightning's: also when every training_step returned None)
            return out

        stepped = fit.step(torch_optimizer, wrapped, **kwargs)
        # a window whose training_steps all returned None stepped on no gradients: nothing moved
        fit.stepped = stepped and fit.window_backwards > 0
    else:
        out = closure()
        # Lightning's AMP plugin: the gradients unscaled before on_before_optimizer_step sees them (the precision
        # leaves an optimizer without gradients alone), then the hooks and the clipping, even where nothing backwarded
        trainer.strategy.unscale_gradients(torch_optimizer)
        after_closure(trainer, torch_optimizer)
        if not fit.window_backwards:  # every training_step of the window returned None: nothing to step on
            trainer.state.global_step += 1
            return out
        fit.stepped = fit.step(torch_optimizer, **kwargs)
    trainer.state.global_step += 1
    return precision.last_step_output


def after_closure(trainer, optimizer):
    """What follows the closure of an optimizer step, before the step (Lightning's precision plugin's
    _after_closure): on_before_optimizer_step (the callbacks', the module's), then the clipping."""
    for fn in trainer._all_hooks["on_before_optimizer_step"]:
        fn(optimizer)
    if trainer._fit_state is not None:
        clip_gradients(trainer, trainer._fit_state, optimizer)


def clip_gradients(trainer, fit, optimizer):
    """The clipping of one optimizer step, as planned (Plan.clipping, what the strategy was set up with): each
    GradientClipping callback's requests (Trainer(gradient_clip_val) adds one), or, where the module overrides
    configure_gradient_clipping or clip_gradients, its configure_gradient_clipping with the Trainer's values in
    place of the Trainer's own request (Lightning's rule)."""
    if trainer._profiler is not None and fit.module.automatic_optimization:
        # timed as the module's configure_gradient_clipping, which Lightning calls (and times) at every automatic
        # step: its default is the Trainer's clipping
        with trainer._profiler.profile(module_action(fit.module, "configure_gradient_clipping")):
            _clip(trainer, fit, optimizer)
    else:
        _clip(trainer, fit, optimizer)


def _clip(trainer, fit, optimizer):
    if fit.configure_clipping is not None:
        fit.configure_clipping(optimizer, gradient_clip_val=trainer.gradient_clip_val,
                               gradient_clip_algorithm=trainer.gradient_clip_algorithm)  # (by keyword: Lightning's call)
    for clipper in fit.clippers:
        clipper.clip(trainer, fit.module, optimizer)


def loss_of(outputs, batch_idx):
    if isinstance(outputs, dict) and outputs.get("loss") is None:
        raise MisconfigurationException(  # (Lightning's words, then ours)
            "In automatic_optimization, when `training_step` returns a dict, the 'loss' key needs to be present "
            f"(training_step returned a dict with the keys {sorted(outputs)} at batch {batch_idx}).")
    loss = outputs["loss"] if isinstance(outputs, dict) else outputs
    if not isinstance(loss, torch.Tensor):
        raise MisconfigurationException(  # (Lightning's words, then ours)
            "In automatic optimization, `training_step` must return a Tensor, a dict, or None (where the step will "
            f"be skipped). training_step returned {type(loss).__name__} at batch {batch_idx}: return the loss, or "
            "set `self.automatic_optimization = False` to step optimizers yourself."
        )
    # (a loss of more than one element, or one that requires no grad (a constant, a detached loss), goes on to
    # backward, where torch refuses it: Lightning's RuntimeError, "grad can be implicitly created only for scalar
    # outputs" / "element 0 of tensors does not require grad ...", after on_before_backward, as there)
    return loss


def _finite_probe(loss):
    """One number per step for check_finite_loss: the loss, or, for a loss of several elements (a module's own
    backward may take one, as under Lightning), its largest magnitude: NaN or infinite where any element is."""
    loss = loss.detach()
    if loss.numel() == 1:
        return loss.reshape(())
    return loss.abs().amax() if loss.numel() else loss.new_zeros(())


def check_finite_loss(trainer, fit):
    """The losses since the last check are tested in one go, so there is no host sync per step. On several processes
    every rank takes part at each check point (one small all-gather, also with no loss to test: a step that returned
    None), so a non-finite loss on one rank ends the fit on every rank with the same error, naming that rank, rather
    than one rank raising while the others wait in their next collective."""
    window = fit.loss_window
    if "check_finite_loss" in trainer._trial_skips:  # (a learning-rate sweep, one process: lr_finder.py)
        fit.loss_window = []
        return
    bad = None  # (rank, batch, value) of the first non-finite loss
    if window:
        losses = torch.stack(window).float()
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0, 0])
            bad = (trainer.global_rank, fit.loss_window_start + first, losses[first].item())
    if trainer.world_size > 1:
        row = torch.tensor(bad[1:] if bad else (-1.0, 0.0), dtype=torch.float64, device=trainer.strategy.root_device)
        rows = trainer.strategy.all_gather(row).reshape(trainer.world_size, 2).tolist()
        flagged = [rank for rank, (batch, _) in enumerate(rows) if batch >= 0]
        bad = (flagged[0], int(rows[flagged[0]][0]), rows[flagged[0]][1]) if flagged else None
    if bad is not None:
        rank, batch, value = bad
        where = f" on rank {rank}" if trainer.world_size > 1 else ""
        # float16 runs overflow where bfloat16 (fp32's exponent range) does not: name the counterpart of this one
        bf16 = {"16-mixed": "bf16-mixed", "16-true": "bf16-true"}.get(trainer.precision)
        raise FloatingPointError(
            f"The training loss became {value}{where} at epoch {trainer.current_epoch}, batch {batch} (checked at "
            f"global step {trainer.global_step}). Lower the learning rate, clip gradients (gradient_clip_val=1.0), "
            "check the data for NaN/inf" + (f", or use precision={bf16!r} instead of {trainer.precision!r}." if bf16 else ".")
        )
    fit.loss_window = []
    fit.loss_window_start += len(window)


# -- when the loop ends --------------------------------------------------------------------------------------------
def may_stop(trainer, fit):
    """A stop request (EarlyStopping, should_stop) is honoured once min_epochs and min_steps are reached;
    SLURM's requeue signal always."""
    state = trainer.state
    return fit.preempted or (state.global_step >= (trainer.min_steps or 0) and
                             state.epoch >= (trainer.min_epochs or 0))


def nothing_left(trainer):
    """A fit whose counters are at max_epochs / max_steps already (a used Trainer's second fit, a finished run
    resumed) trains nothing: the loop does not start (no on_train_start / on_train_end), as Lightning's skips."""
    if not done(trainer):
        return False
    say_why_fit_stopped(trainer)
    return True


def say_why_fit_stopped(trainer, stopped=False):
    """Lightning's note (rank 0, the "tasktrain" logger at INFO) when fit's loop ends at max_steps / max_epochs:
    max_steps is named first where both are reached; a stop request or a Timer is not a limit reached. `stopped`: a
    stop request (should_stop, once min_epochs/min_steps allow it) ended it: Lightning's DEBUG note, on its
    rank_zero logger's name (a child of "tasktrain": setting that one to DEBUG shows it)."""
    if not trainer.is_global_zero:
        return
    if max_steps_reached(trainer):
        _log.info(f"`Trainer.fit` stopped: `max_steps={trainer.max_steps!r}` reached.")
    elif trainer.max_epochs != -1 and trainer.current_epoch >= trainer.max_epochs:
        _log.info(f"`Trainer.fit` stopped: `max_epochs={trainer.max_epochs!r}` reached.")
    elif stopped:
        _rank_zero_log.debug("`Trainer.fit` stopped: `trainer.should_stop` was set.")


def done(trainer):
    """max_steps or max_epochs reached; the epochs counted are those whose end ran (an epoch-end checkpoint's epoch
    included before the loop moves past it: resume.start_after_finished_epoch)."""
    epochs = trainer.state.epoch + int(trainer.state.epoch_finished)
    return max_steps_reached(trainer) or (trainer.max_epochs != -1 and epochs >= trainer.max_epochs)


def max_steps_reached(trainer):
    return trainer.max_steps != -1 and trainer.state.global_step >= trainer.max_steps


def stop_agreed(trainer, fit, at_interval):
    """Stop requests (should_stop, SLURM's requeue signal) and SIGTERM are agreed by all ranks at fixed points, so
    that they stop together; after the requeue signal the pre-emption checkpoint is written there. Returns whether
    this rank asked to stop (SIGTERM is no stop request: the loop raises SIGTERMException, stop_on_sigterm)."""
    local = trainer.should_stop or fit.preempted
    if trainer.world_size > 1:
        if at_interval and trainer.global_step % (trainer.log_every_n_steps or 50):  # (0: no step logs; 50 here)
            return False
        local = agree_on_stop_flags(trainer, fit)
    if fit.preempted:
        trainer.should_stop = True
        save_preemption_checkpoint(trainer, fit)
    return local


def agree_on_stop_flags(trainer, fit):
    """One small all-reduce (max) of (should_stop, requeue signal seen, SIGTERM seen): one process's request is every
    process's. Only at every log_every_n_steps-th step and at epoch ends: never a collective per step."""
    flags = trainer.strategy.reduce(torch.tensor(
        [float(trainer.should_stop), float(fit.preempted), float(trainer.received_sigterm)]), op="max")
    trainer.should_stop, fit.preempted, fit.sigterm = bool(flags[0]), bool(flags[1]), bool(flags[2])
    return trainer.should_stop or fit.preempted


def sigterm_due(trainer, fit):
    """Whether the loop's SIGTERM check fires (issue 37). One process: trainer.received_sigterm, as Lightning's loops
    read it. Several: the flag the ranks agreed on at their last agreement point (agree_on_stop_flags), so that every
    rank raises after the same batch (Lightning broadcasts rank 0's flag before every batch: a collective per step).
    Not while SLURM's requeue signal is being answered: the requeue ends the run (issue 40)."""
    if fit.preempted:
        return False
    return fit.sigterm if trainer.world_size > 1 else trainer.received_sigterm


def stop_on_sigterm(trainer, fit):
    """Lightning's SIGTERMException (issue 37): the run's on_exception hooks follow (an OnExceptionCheckpoint or
    ModelCheckpoint(save_on_exception=True) saves there: Lightning's way, and the only save SIGTERM makes), no
    teardown hooks, and a script that does not catch it exits with status 0."""
    raise SIGTERMException


def save_preemption_checkpoint(trainer, fit):
    """After SLURM's requeue signal, once per fit: preempted-epoch=E-step=S.ckpt beside the ModelCheckpoint's files
    (without one: under the log folder), the checkpoint the requeued job resumes from (issue 40)."""
    if fit.preempt_path:
        return
    callback = next((c for c in trainer.checkpoint_callbacks if hasattr(c, "dirpath_resolved")), None)
    directory = callback.dirpath_resolved(trainer) if callback else \
        os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
    path = os.path.join(directory, f"preempted-epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt")
    trainer.save_checkpoint(path, weights_only=False)
    fit.preempt_path = path
    if trainer.is_global_zero:
        print(f"[tasktrain] requeue signal: finished step {trainer.global_step}, saved {path}", file=sys.stderr,
              flush=True)


# -- validation inside fit -----------------------------------------------------------------------------------------
def val_every_n_batches(trainer):
    if not trainer.enable_validation or trainer.val_check_interval is None or \
            trainer._val_check_time_interval is not None:
        return None
    interval = trainer.val_check_interval
    if isinstance(interval, float):
        if not 0.0 < interval <= 1.0:
            raise ValueError(f"val_check_interval={interval}: a float must be a fraction of the epoch in (0, 1].")
        if interval == 1.0 or trainer._num_training_batches is None:
            return None
        return max(1, int(trainer._num_training_batches * interval))
    return int(interval)


def val_due_after(trainer, fit, batch_idx):
    """A validation of val_check_interval batches is due after batch `batch_idx` (not the epoch's last: the epoch-end
    validation). check_val_every_n_epoch=None: every val_check_interval batches of the whole run, counted over
    epochs, fits and resumes as Lightning's total_batch_idx (TrainState.batches_taken): an epoch's length need not
    be a multiple of the interval. Only in the epochs check_val_every_n_epoch names, as Lightning's."""
    if not fit.val_every or not val_this_epoch(trainer):  # (check_val_every_n_epoch skips the epoch's middle too)
        return False
    if trainer.check_val_every_n_epoch is None:
        return trainer.state.batches_taken % fit.val_every == 0
    return (batch_idx + 1) % fit.val_every == 0 and batch_idx + 1 != trainer._num_training_batches


def val_time_is_up(trainer, fit, batch_idx):
    """val_check_interval as a time (Lightning's): validate after a batch once that long has passed since training
    started or the last validation ended, in the epochs check_val_every_n_epoch names. Rank 0's clock decides for
    every rank (the ranks' clocks differ: each deciding alone would send some into a validation the others skip)."""
    every = trainer.check_val_every_n_epoch
    if not trainer.enable_validation or (every is not None and (trainer.state.epoch + 1) % every):
        return False
    up = time.monotonic() - fit.last_val_time >= trainer._val_check_time_interval
    if trainer.world_size > 1:
        up = trainer.strategy.broadcast(up)
    return up


def val_this_epoch(trainer):
    """Lightning's _should_check_val_epoch: validation is on and check_val_every_n_epoch names this epoch."""
    every = trainer.check_val_every_n_epoch
    return trainer.enable_validation and (every is None or (trainer.state.epoch + 1) % every == 0)


def val_at_epoch_end(trainer, epoch):
    if not trainer.enable_validation:
        return False
    if trainer._val_check_time_interval is not None:  # validated by the clock after batches, not at epoch ends
        return False
    every = trainer.check_val_every_n_epoch
    return every is not None and (epoch + 1) % every == 0


def run_validation(trainer, step=None, zero_grad=True):
    """Validation inside fit; its epoch values are written at `step` (None: batches_that_stepped, the count of the
    batch it runs after, which is not yet counted), with the epoch, as Lightning's."""
    fit = trainer._fit_state
    # a step given: the batch it follows is counted already (the epoch's end, a stop), where Lightning's is not yet
    # (its fit_loop.epoch_loop._batches_that_stepped: lightning_loops.py)
    fit.validates_counted_batch = step is not None
    try:
        _run_validation(trainer, step, zero_grad)
    finally:
        fit.validates_counted_batch = False


def _run_validation(trainer, step, zero_grad):
    from tasktrain.trainer.evaluation import evaluate

    if trainer.limit_val_batches == 0:
        return
    module = trainer.module
    # Lightning clears the gradients before each validation, except in an accumulation window's middle; under
    # manual optimisation too (its default's module.zero_grad() drops gradients a training_step accumulates across
    # the validation). (None in the hook's place switches it off.)
    if zero_grad and callable(getattr(module, "on_validation_model_zero_grad", None)):
        with hook_scope(trainer, "on_validation_model_zero_grad"), \
                trainer._profile(module_action(module, "on_validation_model_zero_grad")):  # (named for self.log)
            module.on_validation_model_zero_grad()
    if loaders.val_data_now(trainer) is None:  # val_dataloader: requested at the first validation (Lightning's)
        return
    loaders.reload_val_when_due(trainer)
    evaluate(trainer, "validate", trainer._val_loader, trainer._counts["fit"], log_step=step)
    trainer._metrics.set_stage("train", True, False)


# -- schedulers ----------------------------------------------------------------------------------------------------
def step_plateau_schedulers(trainer, fit):
    """The step-interval schedulers that watch a metric, once the stepped batch's validation (if any) ran."""
    if fit.plateau_step_due:
        fit.plateau_step_due = False
        values, fit.plateau_values = fit.plateau_values, None
        step_schedulers(trainer, fit, "step", plateau=True, values=values, batch_idx=fit.plateau_step_batch)


def step_schedulers(trainer, fit, interval, plateau=None, values=None, batch_idx=None):
    """Step the schedulers of `interval`; plateau=True/False: only those that watch a metric / only the others;
    `values`: the watched values as a checkpoint saved them (in place of callback_metrics). A step scheduler's
    `frequency` counts the epoch's batches (batch_idx + 1: Lightning's rule, which starts again each epoch), an epoch
    scheduler's the epochs."""
    step_scheduler = fit.lr_scheduler_step
    for config in fit.lr_scheduler_configs:
        if config.interval != interval:
            continue
        if plateau is not None and plateau != (config.monitor is not None):
            continue
        if interval == "step":
            count = (batch_idx if batch_idx is not None else trainer.state.batch_in_epoch - 1) + 1
        else:
            count = trainer.current_epoch + 1
        if count % config.frequency:
            continue
        if config.monitor is None:
            step_scheduler(config.scheduler, None)
            trainer.state.scheduler_steps += 1  # (Lightning's scheduler_progress)
            continue
        # (through the loop view's method, as Lightning reads it: a patch on it is seen)
        value = trainer.fit_loop.epoch_loop._get_monitor_value(config.monitor) if values is None else \
            values.get(config.monitor)
        if value is None:
            if trainer.sanity_checking:
                continue
            if not config.strict:  # (Lightning's words)
                warnings.warn(f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not available but "
                              "strict is set to `False`. Skipping learning rate update.", RuntimeWarning)
                continue
            from tasktrain.exceptions import MisconfigurationException

            raise MisconfigurationException(
                f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not available. Available metrics "
                f"are: {list(trainer.callback_metrics)}. Condition can be set using `monitor` key in lr scheduler "
                f"dict (the scheduler {type(config.scheduler).__name__}: log it with self.log({config.monitor!r}, "
                "...) or change 'monitor')")
        step_scheduler(config.scheduler, float(value))
        trainer.state.scheduler_steps += 1


def step_scheduler(scheduler, metric):
    if metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)
