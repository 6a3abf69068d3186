"""validate / test / predict: the evaluation loops, as plain functions over the trainer.

    run_evaluation(trainer, stage, module, loader, ckpt_path, gather)   the entry point's work (Trainer.validate, ...)
      evaluate(trainer, stage, loaders, limits, log_step)                validation / test batches (fit's too)
      predict(trainer, module, loaders, limits, gather)                  predict batches
"""
import inspect
import os
import shutil
import sys
import warnings

import torch

from torch.utils.data import DataLoader, DistributedSampler

from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning, SIGTERMException
from tasktrain.profilers import module_action, profiled, strategy_action
from tasktrain.strategies.base import MultiProcess, Plan, step_arguments
from tasktrain.strategies.watchdog import watched_batches
from tasktrain.strategies.loop_hooks import overrides
from tasktrain.trainer import guards, run, strategy_hooks
from tasktrain.trainer import loaders as fit_data
from tasktrain.trainer.combined import CombinedEvalLoaders, CombinedLoader, combined_eval, flatten, loaders_view
from tasktrain.trainer.data import _END, EvalShardSampler, held_until_next_iter, stop_workers, prepare_eval_loader, \
    record_batch_indices, set_sampler_epoch
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.lightning_loops import epochs_processed
from tasktrain.trainer.metrics import hook_scope, in_hook
from tasktrain.trainer.module import TaskModule, is_overridden
from tasktrain.trainer.states import RunningStage, TrainerFn

_LOADER_HOOK = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}


def run_evaluation(trainer, stage, module, loader, ckpt_path, gather):
    from tasktrain.trainer.resume import resolve_ckpt_path, restores_after_setup

    strategy = trainer.strategy
    path = None if ckpt_path is None else resolve_ckpt_path(trainer, ckpt_path, stage)
    # the checkpoint's module part before the strategy's set-up, or after it (Lightning's
    # strategy.restore_checkpoint_after_setup: True for an engine that shards the module)
    after_setup = path is None or restores_after_setup(strategy)
    ckpt = None if after_setup else _restore_module(trainer, module, path, into_module=True)

    def set_up():  # (inside strategy.setup(trainer) where a subclass overrides it: Lightning's place)
        strategy.setup_module_and_optimizers(module, [], Plan(training=False))
        run.connect_precision(strategy, [], [])
    strategy_hooks.run_setup(trainer, strategy, set_up)
    module.zero_grad()  # Lightning clears the gradients when each entry point starts
    trainer._log_hyperparams(module)  # (Lightning's: at the start of every run)
    if path is not None:
        from tasktrain.trainer.resume import restore_precision

        if ckpt is None:
            ckpt = _restore_module(trainer, module, path, into_module=False)
        restore_precision(trainer, ckpt)  # (Lightning's restore_training_state at every entry point)
        restore_eval_total(trainer, stage, ckpt)
        datamodule = trainer.datamodule  # its state too, under its class name (Lightning's, at every entry point)
        if datamodule is not None and type(datamodule).__qualname__ in ckpt:
            run.datamodule_call(trainer, "load_state_dict", ckpt[type(datamodule).__qualname__])
    trainer._resumed_from = path  # trainer.ckpt_path: what this run loaded (Lightning's, for every entry point)
    guards.install_sigterm_handler(trainer)  # (Lightning's place: after the restore, before the loop; issue 37)
    limit_arg = {"validate": trainer.limit_val_batches, "test": trainer.limit_test_batches,
                 "predict": trainer.limit_predict_batches}[stage]
    if limit_arg == 0:  # Lightning's: limit_*_batches=0 skips the loop, its loader and its hooks
        return None if stage == "predict" else []
    loaders, limits = eval_loaders(trainer, stage, module, loader)
    trainer._watch()
    if no_batches(trainer, limits):  # Lightning's: loaders without a batch skip the loop and its hooks
        return None if stage == "predict" else []
    if stage == "predict":
        per_loader = predict(trainer, module, loaders, limits, gather)
        guards.restore_sigterm_handler(trainer)  # (Lightning's: before the teardown hooks)
        if per_loader is None:  # return_predictions=False
            return None
        return per_loader if len(loaders) > 1 else per_loader[0]  # a list per loader when there are several
    values = evaluate(trainer, stage, loaders, limits)
    guards.restore_sigterm_handler(trainer)  # (Lightning's: before the teardown hooks)
    # What validate / test return and print are the logged metrics only (Lightning's: a self.log(..., logger=False)
    # name is among callback_metrics, not in the results)
    # (evaluate wrote them to the loggers before on_<stage>_end, at batches_that_stepped: the fit's count, 0 without one)
    logged = trainer._metrics.logger_epoch_values(values) if values else {}
    results = per_loader_results(trainer, logged, result_count(loaders))
    if trainer.is_global_zero and getattr(trainer, "_verbose", True):  # (the entry points only, never fit's)
        print_results(results, stage)
    return results


def _restore_module(trainer, module, path, into_module):
    """Read the checkpoint at `path`, then the module's on_load_checkpoint and its weights (through the strategy's
    load_model_state_dict where a subclass overrides it): into the module itself before the strategy's set-up, into
    what it set up after it. Returns the checkpoint."""
    from tasktrain.checkpoint_io import trusted_pickles

    strategy = trainer.strategy
    with trusted_pickles(trainer._ckpt_weights_only is False):  # the entry point's weights_only= (Lightning's)
        ckpt = strategy_hooks.load_checkpoint(strategy, path, trainer._ckpt_weights_only)
    with hook_scope(trainer, "on_load_checkpoint"):  # (named for self.log, which refuses it there)
        module.on_load_checkpoint(ckpt)
    if overrides(strategy, "load_model_state_dict"):
        if into_module:
            strategy.connect(module)  # (the strategy's lightning_module is this run's module before its set-up)
        strategy.load_model_state_dict(ckpt, strict=module.strict_loading)
    else:
        strategy.load_module_state_dict(ckpt["state_dict"], module if into_module else None,
                                        strict=module.strict_loading)
    return ckpt


def restore_eval_total(trainer, stage, ckpt):
    """Lightning's validate / test / predict restore their loop's progress from the file: the loop's `total` (its
    batch_progress, trainer.validate_loop / test_loop / predict_loop) goes on from the count the file holds, at every
    run given a ckpt_path. (A batch the file was saved inside is counted completed, as it was; Lightning's keeps it
    ready and never completed: docs/lightning.md.)"""
    from tasktrain.checkpoint_io import own_state

    saved = own_state(ckpt).get("train_state")
    if not isinstance(saved, dict):
        return
    counts = saved.get("eval_batches")
    if stage in ("validate", "test") and isinstance(counts, dict) and stage in counts:
        trainer.state.eval_batches[stage][0] = int(counts[stage][0])
    if stage == "predict" and "predict_batches" in saved:  # (a file from before tasktrain saved it: kept as it is)
        trainer._predict_counts[0] = int(saved["predict_batches"])


def result_count(loaders):
    """Dicts validate / test return: one per loader, one for loaders read together (Lightning's: one per
    dataloader_idx its loop saw)."""
    return 1 if isinstance(loaders, CombinedEvalLoaders) else len(loaders)


def per_loader_results(trainer, values, n_loaders):
    """What validate / test return."""
    # One dict per loader (Lightning's shape): its own suffixed metrics, those it logged with add_dataloader_idx=False
    # (one loader per hook and name, Lightning's rule; a name several loaders logged so from different hooks: one
    # value over them, in each of their dicts),
    # and those logged outside the loaders (the epoch-end hooks).
    if n_loaders == 1:
        return [{k: float(v) for k, v in values.items()}]
    owners = trainer._metrics.loader_of_name
    everywhere = {f"/dataloader_idx_{idx}" for idx in range(n_loaders)}
    return [{k: float(v) for k, v in values.items() if k.endswith(f"/dataloader_idx_{idx}") or
             ("/dataloader_idx_" not in k and f"/dataloader_idx_{idx}" in
              owners.get(k.removesuffix("_epoch"), owners.get(k, everywhere)))} for idx in range(n_loaders)]


def print_results(results, stage):
    """The results table Lightning prints after validate / test (verbose=True, global rank zero): one row per
    metric name (the /dataloader_idx_N suffix dropped, sorted), one column per loader ("DataLoader N", blank where
    that loader did not log the name), under a "Validate metric" / "Test metric" header. Drawn by rich's console
    when rich is installed (`rich_available()`, the same rule as the default progress bar), else as plain text
    ruled with "─" across the terminal. Nothing is printed when no metric was logged."""
    from tasktrain.callbacks import progress

    names = sorted({key.split("/dataloader_idx_")[0] for result in results for key in result})
    if not names:
        return
    columns = [{key.split("/dataloader_idx_")[0]: value for key, value in result.items()} for result in results]
    cells = [[str(column[name]) if name in column else " " for column in columns] for name in names]
    headers = [f"DataLoader {idx}" for idx in range(len(results))]
    # The width Lightning sizes every column to: the longest name or header, at least 25, at most half the terminal
    # (120 columns where the terminal's width is unknown); as many loader columns as fit beside the name column go
    # in one table, the rest in the tables below it.
    width = shutil.get_terminal_size(fallback=(120, 30)).columns or 120
    cell = int(min(max(max(len(n) for n in names), max(len(h) for h in headers), 25), width / 2))
    per_table = int((width - cell) / cell)
    title = f"{stage} metric".capitalize()  # "Validate metric", "Test metric"
    for start in range(0, len(headers), per_table):
        shown = headers[start:start + per_table]
        rows = [row[start:start + per_table] for row in cells]
        if progress.rich_available():
            _print_rich_table([title, *shown], names, rows, cell)
        else:
            _print_plain_table([title, *shown], names, rows, cell, width)


def _print_rich_table(headers, names, rows, cell):
    from rich import get_console
    from rich.table import Column, Table

    table = Table(*[Column(header, justify="center", style="cyan" if idx == 0 else "magenta", width=cell)
                    for idx, header in enumerate(headers)])
    for name, row in zip(names, rows):
        table.add_row(name, *row)
    get_console().print(table)


def _print_plain_table(headers, names, rows, cell, width):
    def line(*texts):  # each text centred in its column, trailing blanks dropped
        return "".join(f"{text:^{cell}}" for text in texts).rstrip()

    try:  # a terminal whose encoding lacks the box-drawing rule gets "-"
        "─".encode(sys.stdout.encoding or "utf-8")
        rule = "─" * width
    except UnicodeEncodeError:
        rule = "-" * width
    half = int(width / 2)
    lines = [rule, line(*headers), rule]
    for name, row in zip(names, rows):
        if len(name) <= half:
            lines.append(line(name, *row))
            continue
        # A name longer than half the terminal (its table then has one loader column) is cut into pieces of that
        # length: each full piece on a line with the row's value, the rest beside a blank.
        while len(name) > half:
            lines.append(line(name[:half], *row))
            name = name[half:]
        lines.append(line(name, *[" "] * len(row)))
    lines.append(rule)
    print(os.linesep.join(lines))


def grad_context(trainer):
    """What an evaluation run (its hooks included) runs under, Lightning's rule: torch.no_grad for the fit's own
    validation and sanity check (Lightning's fit validates with inference_mode=False: a callback may change the
    parameters there and train on) and in a run of several processes on gloo; otherwise torch.inference_mode, unless
    Trainer(inference_mode=False). (FSDP's eval_step runs its steps under no_grad itself.)"""
    fitting = trainer.state.fn == TrainerFn.FITTING
    return inference_or_no_grad(trainer.inference_mode and not fitting, trainer.strategy)


def inference_or_no_grad(inference_mode, strategy):
    """torch.inference_mode() where `inference_mode`, else torch.no_grad(); no_grad always in a run of several
    processes on gloo (its collectives fail on inference tensors). (Lightning's loops' _no_grad_context reads the
    same rule: tasktrain/compat/lightning/loops/utilities.py.)"""
    gloo = isinstance(strategy, MultiProcess) and torch.distributed.is_initialized() and \
        torch.distributed.get_backend() == "gloo"
    return torch.inference_mode() if inference_mode and not gloo else torch.no_grad()


def eval_loaders(trainer, stage, module, loader):
    """The run's loaders (`loader` if given, else the hook's) prepared, and their batch counts."""
    limit_arg = {"validate": trainer.limit_val_batches, "test": trainer.limit_test_batches,
                 "predict": trainer.limit_predict_batches}[stage]
    name = _LOADER_HOOK[stage]
    owner = None if loader is not None else (trainer._attached[1] if trainer._attached[1] is not None else module)
    loader = loader if loader is not None else trainer._loader_of(module, name)
    check_loaders_iterable(loader, stage, owner, name)
    world_size, rank = fit_data.shards(trainer)
    prefix = {"validate": "val"}.get(stage, stage)
    # (under a distributed strategy, a world of one included; predict's loaders are sharded there too, unshuffled by
    # this seed: PredictShardSampler's order is the epoch's alone, as Lightning's)
    shuffle_seed = fit_data.eval_shuffle_seed(trainer)
    flat = [trainer.strategy.process_dataloader(one) for one in as_loaders(loader, stage)]  # (Lightning's: what it
    # returns is read)
    if shuffle_seed is not None and world_size > 1 and stage != "predict" and trainer.state.fn == stage and \
            trainer.is_global_zero:
        warn_distributed_eval(flat, stage)
    for one in flat:
        fit_data.check_loader_workers(trainer, one, prefix)
    loaders = combined_eval(loader, [prepare_eval_loader(one, world_size, rank, prefix, shuffle_seed,
                                                         trainer.global_rank) for one in flat])
    if trainer.state.fn != TrainerFn.FITTING:
        # Lightning's _process_dataloader outside fit: the samplers get the epochs the fit has run as the loaders are
        # set up (a run without batches too); a fit's validation sets them at each run instead (start_fetch)
        epoch = epochs_processed(trainer)
        for one in loaders:
            set_sampler_epoch(one, epoch)
    limits = [limit_eval(one, limit_arg, prefix) for one in loaders]
    trainer._counts[stage] = limits  # (the stage's own: num_val_batches reads "validate" in a validate run)
    setattr(trainer, {"validate": "_val_loader", "test": "_test_loaders", "predict": "_predict_loaders"}[stage], loaders)
    trainer._loader_views[stage] = loaders_view(loader, loaders)  # (trainer.val_dataloaders, ...: as given)
    return loaders, limits


def warn_distributed_eval(loaders, stage):
    """Lightning's PossibleUserWarning (rank zero) for each loader of a validate / test run it shards with a
    DistributedSampler (a DataLoader over a map-style data set whose sampler is not one already), on several
    processes with use_distributed_sampler: its padding evaluates some samples twice. (tasktrain's unshuffled shards
    are unpadded; the advice stands for the shuffled ones and for the user's own samplers.)"""
    for one in loaders:
        if isinstance(one, DataLoader) and not isinstance(one.dataset, torch.utils.data.IterableDataset) and \
                not isinstance(one.sampler, DistributedSampler):
            warnings.warn(f"Using `DistributedSampler` with the dataloaders. During `trainer.{stage}()`, it is "
                          "recommended to use `Trainer(devices=1, num_nodes=1)` to ensure each sample/batch gets "
                          "evaluated exactly once. Otherwise, multi-device settings use `DistributedSampler` that "
                          "replicates some samples to make sure all devices have same batch size in case of uneven "
                          "inputs.", PossibleUserWarning)


def _rebuilt_if_stale(trainer, stage, loaders, limits):
    """Built again when a hook at the run's start changed what the hooks' loaders read (a BatchSizeFinder's size):
    the run's batches are read at the size found, as Lightning's loop sets its data up again."""
    rebuilt = trainer._eval_data_stale
    if not rebuilt:
        return loaders, limits
    trainer._eval_data_stale = False
    # (the search built them already, before its restore's hooks, as Lightning's resets its loop's data: tuning.py)
    return rebuilt if isinstance(rebuilt, tuple) else eval_loaders(trainer, stage, trainer.module, None)


def evaluate(trainer, stage, loaders, limits, log_step=None):
    """Run validation/test batches of each loader (grad_context); returns the reduced epoch metrics, which it writes
    to the loggers (but in the sanity check) at `log_step` (None: batches_that_stepped) with the epoch.
    With several loaders the step and batch hooks get dataloader_idx, and self.log adds the
    "/dataloader_idx_N" suffix (Lightning's rule). Loaders without a batch: nothing runs, no hook (Lightning's
    evaluation loop skips when its batch counts sum to 0: zero-length loaders, an empty list of loaders)."""
    if no_batches(trainer, limits):
        return {}
    with grad_context(trainer):
        return _evaluate(trainer, stage, loaders, limits, log_step)


def check_dataloader_idx(module, stage, several):
    """Lightning's check at an evaluation or predict run's start (its loops' _verify_dataloader_idx_requirement):
    with several loaders read in turn, the step and the module's batch hooks get dataloader_idx, so each must take
    it; with one loader (or a CombinedLoader read together) they get none, so a dataloader_idx without a default
    could never be filled. Either is Lightning's RuntimeError, before any hook, instead of a TypeError mid-run."""
    prefix, loader = {"validate": ("validation", "val"), "test": ("test", "test"),
                      "predict": ("predict", "predict")}[stage]
    for hook in (f"{prefix}_step", f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"):
        fx = getattr(module, hook)
        spec = inspect.getfullargspec(getattr(fx, "__wrapped__", fx))
        takes = "dataloader_idx" in spec.args[1:] or spec.varargs is not None  # (self listed for a bound method too)
        if several and not takes:
            raise RuntimeError(f"You provided multiple `{loader}_dataloader`, but no `dataloader_idx` argument in "
                               f"`{type(module).__name__}.{hook}()`. Try adding `dataloader_idx=0` to its signature.")
        parameter = inspect.signature(fx).parameters.get("dataloader_idx") if not several and takes else None
        if parameter is not None and parameter.default is inspect.Parameter.empty:
            raise RuntimeError(f"You provided only a single `{loader}_dataloader`, but have included `dataloader_idx` "
                               f"in `{type(module).__name__}.{hook}()`. Either remove the argument or give it a "
                               "default value i.e. `dataloader_idx=0`.")


def _evaluate(trainer, stage, loaders, limits, log_step):
    module, strategy, metrics = trainer.module, trainer.strategy, trainer._metrics
    prefix = "validation" if stage == "validate" else stage
    # Lightning's loop (its reset) sets the samplers' epoch and calls iter() before any hook of the run: the first
    # loader's workers start, its sampler's or data set's __iter__ runs there
    fetch = start_fetch(trainer, loaders, limits, prefix)
    check_dataloader_idx(module, stage, not isinstance(loaders, CombinedEvalLoaders) and len(loaders) > 1)
    step_fn = getattr(module, f"{prefix}_step")
    modes = training_modes(module)  # each submodule's flag, given back at the end (Lightning's _ModuleMode)
    state = trainer.state
    outer_stage = state.stage
    if not trainer.sanity_checking:
        state.stage = RunningStage(stage)
    with hook_scope(trainer, f"on_{prefix}_model_eval"), \
            trainer._profile(module_action(module, f"on_{prefix}_model_eval")):  # (named for self.log)
        getattr(module, f"on_{prefix}_model_eval")()
    metrics.set_stage(stage, False, True)
    metrics.step_values.clear()  # (Lightning resets an evaluation's results: nothing of the last one is written)
    hooks = trainer._all_hooks
    # Lightning's strategy.validation_step / test_step (each through the strategy's eval_step): a strategy of one's
    # own that overrides one is called for every batch
    eval_step = strategy.test_step if prefix == "test" else strategy.validation_step
    if trainer._profiler is not None:
        eval_step = profiled(trainer._profiler, strategy_action(strategy, f"{prefix}_step"), eval_step)
    eval_step = in_hook(metrics, f"{prefix}_step", eval_step)  # (named for self.log: its defaults and rules)
    # batches completed (Lightning's evaluation batch_progress, read through trainer.validate_loop / test_loop /
    # fit_loop.epoch_loop.val_loop: lightning_loops.py): [total, in this run] (TrainState.eval_batches), and how far
    # the batch being evaluated got: "ready" (its on_*_batch_start), "started" (its step), "processed" (its
    # on_*_batch_end), None once completed
    key = "val" if trainer.state.fn == "fit" else stage
    completed, phases = state.eval_batches[key], trainer._eval_phase
    completed[1] = 0
    # Lightning's batch_progress.is_last_batch (the last batch of the last loader taken; kept after the run) and
    # _has_run (a batch completed in this run, the sanity check's not counted)
    state.eval_is_last_batch[key], trainer._eval_has_run[key] = False, False
    trainer._call(f"on_{prefix}_start")
    if not trainer.sanity_checking and trainer.state.fn == stage and trainer._eval_data_stale:
        # (a validate/test run's own loaders, built again by a hook: Lightning's loop sets them up and iterates
        # them again inside that hook)
        fetch = None  # (the first loaders' iterator goes: their workers stop)
        loaders, limits = _rebuilt_if_stale(trainer, stage, loaders, limits)
        fetch = start_fetch(trainer, loaders, limits, prefix)
    trainer._call(f"on_{prefix}_epoch_start")
    # the batches: each loader in turn with its dataloader_idx, or (a CombinedLoader not sequential) one pass over
    # all of them together, dataloader_idx 0 and not given to the step and hooks (Lightning's _is_sequential)
    together = isinstance(loaders, CombinedEvalLoaders)
    several = not together and len(loaders) > 1
    current = None
    batches = watched_batches(trainer._watchdog, fetch, f"{prefix}_step", lambda: state.global_step,
                              end_event=f"end of the {prefix} epoch")
    for batch_idx, dataloader_idx, batch, last in batches:
        extra = (dataloader_idx,) if several else ()
        if dataloader_idx != current:  # (Lightning's loop notes where its combined loader went on to the next one)
            current = dataloader_idx
            metrics.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if extra else ""
            metrics.eval_ranks_meet = trainer.world_size == 1 or all(
                ranks_meet(trainer, stage, one) for one in (loaders if together else [loaders[dataloader_idx]]))
        batch = trainer._eval_to_device(batch, dataloader_idx)
        metrics.set_batch(batch)
        phases[key] = "ready"
        state.eval_is_last_batch[key] = last  # (Lightning's fetcher's `done`)
        for fn in hooks[f"on_{prefix}_batch_start"]:
            fn(batch, batch_idx, *extra)
        phases[key] = "started"
        outputs = eval_step(*step_arguments(step_fn, batch, batch_idx, *extra))
        phases[key] = "processed"
        for fn in hooks[f"on_{prefix}_batch_end"]:
            fn(outputs, batch, batch_idx, *extra)
        completed[0] += 1
        completed[1] += 1
        phases[key] = None
        metrics.set_batch(None)  # (Lightning's: the epoch-end hooks' values infer no batch size)
        if not trainer.sanity_checking:
            trainer._eval_has_run[key] = True
            log_eval_step(trainer, stage, dataloader_idx)
        # Lightning's check: SIGTERM ends the evaluation after this batch, unless it was the last one (of the last
        # loader; known without a length too: such a pass is read one batch ahead)
        if trainer.received_sigterm and not last:
            sigterm_in_evaluation(trainer)
    metrics.dataloader_suffix = ""
    metrics.eval_ranks_meet = True  # (the epoch-end hooks run on every rank)
    # Lightning's order: the callbacks then the module, each seeing the epoch's values of what was logged in
    # the steps; what they log here is reduced after them
    values = metrics.reduce_epoch(stage)
    trainer._call(f"on_{prefix}_epoch_end")
    values.update(metrics.reduce_epoch(stage))
    # Lightning's on_run_end: the epoch values go to the loggers here, before on_<stage>_end (where ModelCheckpoint
    # and EarlyStopping act, and trainer.logged_metrics holds them); none in the sanity check
    logged = metrics.logger_epoch_values(values) if values else {}
    if logged and not trainer.sanity_checking:  # every rank (log_to_loggers)
        trainer.log_to_loggers(logged, log_step, add_epoch=True)
    trainer._call(f"on_{prefix}_end")
    metrics.reset_metric_objects()  # (Lightning's reset_results, after on_<stage>_end)
    # Lightning's: the module's on_<stage>_model_train where overridden, else each submodule's mode as it was (a
    # frozen BatchNorm the user put in eval mode stays so)
    if is_overridden(f"on_{prefix}_model_train", module, TaskModule):
        with hook_scope(trainer, f"on_{prefix}_model_train"):  # (named for self.log, which refuses it there)
            getattr(module, f"on_{prefix}_model_train")()
    else:
        restore_training_modes(module, modes)
    state.stage = outer_stage
    return values


def sigterm_in_evaluation(trainer):
    """SIGTERM seen after an evaluation batch (issue 37): Lightning raises SIGTERMException here, on the rank that got
    it; so does tasktrain, except in a fit's validation (not its sanity check) on several processes: there the
    training loop raises it at the ranks' next agreement point, every rank together (loop.sigterm_due), so that an
    on_exception save finds all of them. Nor while a fit answers SLURM's requeue signal: the requeue ends it."""
    fit = trainer._fit_state
    if fit is not None and fit.preempted:
        return
    if fit is None or trainer.sanity_checking or trainer.world_size == 1:
        raise SIGTERMException


def log_eval_step(trainer, stage, dataloader_idx):
    """The step values an evaluation batch logged (self.log(..., on_step=True)), written after each batch as
    Lightning does (log_every_n_steps does not apply) at that loader's own batch count: counted over the entry point
    (fit's validations go on counting), never the training step."""
    metrics = trainer._metrics
    key = (stage, dataloader_idx)
    step = metrics.eval_batches_logged.get(key, 0)
    metrics.eval_batches_logged[key] = step + 1
    # (a sync_dist value is reduced across ranks when logged, where the ranks meet at every batch: ranks_meet)
    values = metrics.step_metrics_for_logger(loader_suffix=metrics.dataloader_suffix)
    if values:  # every rank (log_to_loggers)
        trainer.log_to_loggers(values, step)


def predict(trainer, module, loaders, limits, gather):
    """The predictions of each loader (a list per loader); predict_step and the batch hooks get dataloader_idx
    when there are several."""
    with grad_context(trainer):
        return _predict(trainer, module, loaders, limits, gather)


def _predict(trainer, module, loaders, limits, gather):
    writers = _prediction_writers(trainer)
    # Lightning's loop (its reset) calls iter() before any hook of the run (the samplers' epoch set before)
    loaders, per_loader = _predict_outputs(trainer, loaders, writers)
    fetch = start_fetch(trainer, loaders, limits, "predict")
    check_dataloader_idx(module, "predict", len(loaders) > 1)
    modes = training_modes(module)
    trainer.state.stage = RunningStage.PREDICTING
    with trainer._profile(module_action(module, "on_predict_model_eval")):
        module.on_predict_model_eval()
    returns = getattr(trainer, "_return_predictions", True)
    keep = returns or any(w.writes_on_epoch for w in writers)
    # the batches started per loader (Lightning's predict_loop.epoch_batch_indices: lightning_loops.py)
    started = trainer._predict_started = [0] * len(loaders)
    # Lightning's predict_loop.batch_progress ([total over the Trainer's runs, this run's] completed) and
    # .predictions (kept after the run, until the next one)
    counts = trainer._predict_counts
    counts[1], trainer._predict_kept = 0, per_loader
    trainer._call("on_predict_start")
    if trainer._eval_data_stale:  # (a BatchSizeFinder's size: the loaders again, their indices recorded again)
        fetch = None  # (the first loaders' iterator goes: their workers stop)
        loaders, limits = _rebuilt_if_stale(trainer, "predict", loaders, limits)
        loaders, per_loader = _predict_outputs(trainer, loaders, writers)
        trainer._predict_kept = per_loader
        started = trainer._predict_started = [0] * len(loaders)
        fetch = start_fetch(trainer, loaders, limits, "predict")
    trainer._call("on_predict_epoch_start")
    eval_step = trainer.strategy.predict_step  # (Lightning's; through the strategy's eval_step)
    if trainer._profiler is not None:
        eval_step = profiled(trainer._profiler, strategy_action(trainer.strategy, "predict_step"), eval_step)
    if trainer._metrics is not None:  # named as the hook it is (module._current_fx_name; self.log refuses it there)
        eval_step = in_hook(trainer._metrics, "predict_step", eval_step)  # (the step itself stays the bound method:
        # DataParallel's eval_step calls it by name)
    done = [0] * len(loaders)
    for batch_idx, dataloader_idx, batch, last in watched_batches(trainer._watchdog, fetch, "predict_step",
                                                                  lambda: trainer.state.global_step):
        extra = (dataloader_idx,) if len(loaders) > 1 else ()
        batch = trainer._eval_to_device(batch, dataloader_idx)
        started[dataloader_idx] += 1
        trainer._predict_phase = "ready"
        trainer._predict_is_last = last  # (Lightning's fetcher's `done`)
        if any(writer.writes_on_batch for writer in writers):  # (Lightning's predict_loop.current_batch_indices)
            trainer._predict_current_indices = trainer.predict_batch_indices[dataloader_idx][batch_idx]
        trainer._call("on_predict_batch_start", batch, batch_idx, *extra)
        trainer._predict_phase = "started"
        out = eval_step(*step_arguments(module.predict_step, batch, batch_idx, *extra))
        trainer._predict_phase = "processed"
        if out is None and not trainer._predict_none_warned:  # (Lightning's: once per Trainer)
            trainer._predict_none_warned = True
            if trainer.is_global_zero:
                warnings.warn("predict returned None if it was on purpose, ignore this warning...", UserWarning)
        trainer._call("on_predict_batch_end", out, batch, batch_idx, *extra)
        counts[0] += 1
        counts[1] += 1
        trainer._predict_phase = None
        if keep:  # (after on_predict_batch_end, as Lightning's)
            per_loader[dataloader_idx].append(out)
        done[dataloader_idx] += 1
    if writers:  # the samplers ran ahead of the batches predicted (a limit, workers' prefetch): not theirs
        for dataloader_idx, count in enumerate(done):
            del trainer.predict_batch_indices[dataloader_idx][count:]
    trainer._call("on_predict_epoch_end")
    trainer._predict_started = None  # (Lightning empties epoch_batch_indices before on_predict_end)
    if not returns:  # (and predict_loop.predictions, unless they are returned)
        trainer._predict_kept = []
    trainer._call("on_predict_end")
    restore_training_modes(module, modes)  # (Lightning calls no on_predict_model_train)
    trainer.predictions, trainer.predict_batch_indices = [], []  # the writers are done with them
    if not returns:
        return None
    if gather and trainer.world_size > 1:
        return [gather_predictions(trainer.strategy, predictions) for predictions in per_loader]
    return per_loader


def _prediction_writers(trainer):
    """A prediction writer gets each batch's dataset indices; one that writes at the epoch's end, every prediction."""
    from tasktrain.callbacks.prediction_writer import BasePredictionWriter

    return [c for c in trainer.callbacks if isinstance(c, BasePredictionWriter)]


def _predict_outputs(trainer, loaders, writers):
    """The predict loaders (their batches' dataset indices recorded in trainer.predict_batch_indices when there are
    prediction writers) and an empty list per loader for the predictions, set as trainer.predictions: what an epoch
    writer gets, the one loader's list or a list per loader (Lightning's shape)."""
    if writers:
        recorded = [record_batch_indices(loader) for loader in loaders]
        loaders = [loader for loader, _ in recorded]
        trainer.predict_batch_indices = [indices for _, indices in recorded]
    per_loader = [[] for _ in loaders]
    trainer.predictions = per_loader[0] if len(loaders) == 1 else per_loader
    return loaders, per_loader


def start_fetch(trainer, loaders, limits, prefix):
    """Lightning's evaluation loop's reset: in a fit (its sanity check, each validation) the loaders' samplers get the
    epochs the fit has run (set_epoch; validate / test / predict set them as their loaders are set up: eval_loaders),
    then iter() of its fetcher over them (EvalFetch): before any hook of the run. The epoch is Lightning's
    fit_loop.epoch_progress.current.processed, not current_epoch: the two differ in the sanity check of a fit resumed
    from a save in on_train_epoch_end (processed is one more) and after a fit that failed in on_train_epoch_end."""
    if trainer.state.fn == TrainerFn.FITTING:
        epoch = epochs_processed(trainer)
        for loader in loaders:
            set_sampler_epoch(loader, epoch)
    together = isinstance(loaders, CombinedEvalLoaders)
    name = "[_PredictionLoop].predict_next" if prefix == "predict" else \
        f"[_EvaluationLoop].{'val' if prefix == 'validation' else prefix}_next"
    if trainer._watchdog is not None:  # (workers start, a first batch may be read: it may take any time)
        trainer._watchdog.mark("fetching a batch", trainer.state.global_step, 0, True)
    if together:
        return EvalFetch([loaders], [loaders.length(limits)], trainer._profiler, name)
    return EvalFetch(list(loaders), list(limits), trainer._profiler, name)


class EvalFetch:
    """An evaluation run's batches as Lightning's fetcher reads its sequential CombinedLoader: (batch_idx,
    dataloader_idx, batch, whether it is the run's last). Made where Lightning's loop calls iter(): the first
    loader's iterator now; each next loader's when the batches ask for its first one (its iter() then, the previous
    one's iterator dropped: its workers stop, as Lightning's combined loader keeps one). Each loader stops at its
    limit without reading a batch more (a loader read to its end moves what its RandomSampler draws from, the user's
    generator; issue 37). Where a loader has no length and no limit (the run's count is not known) the batches are
    read one ahead, the first inside iter() (not profiled, as Lightning's fetcher has no profiler then), so that the
    last is known as it runs; otherwise the run stops once its count is read. `sources`: the loaders (one
    CombinedEvalLoaders read together: its batches), `limits` their counts (None: to their end)."""

    def __init__(self, sources, limits, profiler, name):
        self.sources, self.limits, self.profiler, self.name = sources, limits, profiler, name
        self.total = None if any(limit is None for limit in limits) else sum(limits)
        self.index, self.batch_idx, self.iterator = 0, 0, None
        if sources:
            self.iterator = self._open(sources[0])
        self.ahead = self._next() if self.total is None else None

    @staticmethod
    def _open(source):
        if isinstance(source, CombinedEvalLoaders):
            return source.batches()
        # (a DataLoader's iterator is kept until its next iter(): its workers live on after the run's batches, as
        # Lightning's fetcher keeps its iterator)
        return held_until_next_iter(source, iter(source)) if isinstance(source, DataLoader) else iter(source)

    def _next(self):
        """The next (batch_idx, dataloader_idx, batch), or _END: Lightning's _Sequential.__next__."""
        while self.index < len(self.sources):
            limit = self.limits[self.index]
            if limit is None or self.batch_idx < limit:
                batch = next(self.iterator, _END)
                if batch is not _END:
                    self.batch_idx += 1
                    return self.batch_idx - 1, self.index, batch
            previous = self.sources[self.index]
            self.index, self.batch_idx = self.index + 1, 0
            following = self.sources[self.index] if self.index < len(self.sources) else None
            self.iterator = self._open(following) if following is not None else None
            if isinstance(previous, DataLoader) and previous is not following and previous.num_workers > 0 and \
                    not previous.persistent_workers:
                stop_workers(previous)  # (held_until_next_iter's: the combined loader dropped it)
        return _END

    def _fetched(self):
        if self.profiler is None:
            return self._next()
        with self.profiler.profile(self.name):
            return self._next()

    def __iter__(self):
        if self.total is not None:  # (Lightning's fetcher is done once it fetched the run's count)
            for fetched in range(1, self.total + 1):
                item = self._fetched()
                if item is _END:
                    return
                yield (*item, fetched == self.total)
            return
        item = self.ahead
        while item is not _END:
            upcoming = self._fetched()
            yield (*item, upcoming is _END)
            item = upcoming


def gather_predictions(strategy, predictions):
    """Every rank's predictions in dataset order (ranks hold samples r, r+W, ... of an unpadded shard)."""
    gathered = strategy.all_gather_object([p.cpu() if isinstance(p, torch.Tensor) else p for p in predictions])
    if all(isinstance(p, torch.Tensor) for rank in gathered for p in rank):
        rows = [torch.cat(rank) if rank else None for rank in gathered]
        total = sum(r.shape[0] for r in rows if r is not None)
        out = [None] * total
        for rank, tensor in enumerate(rows):
            for i in range(0 if tensor is None else tensor.shape[0]):
                out[rank + i * len(rows)] = tensor[i]
        return torch.stack(out) if out else torch.empty(0)
    return gathered


def training_modes(module):
    return {name: sub.training for name, sub in module.named_modules()}


def restore_training_modes(module, modes):
    for name, sub in module.named_modules():
        if name in modes:
            sub.training = modes[name]


def no_batches(trainer, limits):
    """Every loader has 0 batches to run (None, a loader without a length, is not known to be empty), on every rank:
    an unpadded shard can leave one rank without a batch while another has some, and the ranks must agree on
    running the loop (its hooks and metrics' collectives), as Lightning's padded shards always do."""
    empty = all(limit == 0 for limit in limits)
    if trainer.world_size > 1:
        return trainer.strategy.reduce_boolean_decision(empty, all=True)
    return empty


def check_loaders_iterable(loader, fn, owner, name):
    """Before a run uses them: each of the loaders (those of a list, dict or CombinedLoader too) must be iterable, as
    Lightning checks. `owner`: None where the loaders were passed to the entry point `fn` ("fit", "validate", ...),
    else the module or DataModule whose hook `name` ("train_dataloader", ...) returned them; a hook that is not
    defined at all is Lightning's MisconfigurationException (the base's hook's words)."""
    if loader is None and owner is not None and callable(getattr(owner, name, None)) and \
            not is_overridden(name, owner, DataModule if isinstance(owner, DataModule) else TaskModule):
        arg = "train_dataloaders" if fn == "fit" else "dataloaders"
        raise MisconfigurationException(
            f"`{name}` must be implemented to be used with the Trainer: define {name}() on the "
            f"{type(owner).__name__}, or pass {arg}= (or a datamodule=) to trainer.{fn}().")
    if isinstance(loader, CombinedLoader):
        flat = list(loader.flattened)
    else:
        flat = flatten(loader)[0] if isinstance(loader, (list, tuple, dict)) else [loader]
    for one in flat:
        check_loader_iterable(one, fn, owner, name)


def check_loader_iterable(loader, fn, owner, name):
    """Lightning's TypeError for one loader that cannot be iterated (a DataLoader is not asked: iter() would start
    its workers), naming where it came from: passed to `trainer.<fn>(...)`, or returned by `<owner class>.<name>()`
    (`owner` None: passed; a hook set to None on the owner counts as not defined, as there)."""
    if isinstance(loader, DataLoader):
        return
    try:
        iter(loader)
    except TypeError:
        prefix = "train_" if fn == "fit" else ""
        passed = f"An invalid dataloader was passed to `Trainer.{fn}({prefix}dataloaders=...)`. Found {loader}."
        if owner is None:
            raise TypeError(passed) from None
        if not is_overridden(name, owner, DataModule if isinstance(owner, DataModule) else TaskModule):
            raise TypeError(f"{passed} Either pass the dataloader to the `.{fn}()` method OR implement "
                            f"`def {name}(self):` in your TaskModule/DataModule.") from None
        raise TypeError(f"An invalid dataloader was returned from `{type(owner).__name__}.{name}()`. "
                        f"Found {loader}.") from None


def as_loaders(loader, stage=None):
    """Evaluation loaders as a flat list: several in a (nested) list, tuple or dict, in its order, or a
    CombinedLoader's (sequential: Lightning's evaluation mode, each loader in turn with its dataloader_idx; the other
    modes read them together, combined_eval; predict refuses those, as Lightning)."""
    if isinstance(loader, CombinedLoader):
        if loader.mode != "sequential" and stage == "predict":
            raise ValueError('`trainer.predict()` only supports the `CombinedLoader(mode="sequential")` mode.')
        return list(loader.flattened)
    if isinstance(loader, (list, tuple, dict)) and not loader:
        # Lightning's: an empty collection is one loader without batches, so the stage runs no batch and no hook
        # (as a zero-length loader), num_*_batches is [0]
        return [[]]
    return flatten(loader)[0]


def ranks_meet(trainer, stage, loader):
    """Whether every rank takes as many batches of the evaluation `loader` as this one, known from what every rank
    knows alike (no collective), so that a `sync_dist=True` step value can be reduced at each batch, as Lightning
    does. Lightning's DistributedSampler pads the shards to equal lengths (evaluating some samples twice: Lightning
    #5060); tasktrain's unpadded shard (EvalShardSampler) leaves some ranks a batch more where the samples do not
    divide evenly, unless the limit stops every rank before. Not known: a loader without a length or a sampler of the
    user's own that is not a DistributedSampler (use_distributed_sampler=False): each rank keeps its own value."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return False
    if isinstance(sampler, DistributedSampler):  # (padded, or drop_last: equal lengths by construction)
        return True
    if not isinstance(sampler, EvalShardSampler) or loader.batch_size is None:
        return False
    world, size = sampler.num_replicas, loader.batch_size
    samples = [len(range(rank, sampler.length, world)) for rank in range(world)]
    lengths = [n // size if loader.drop_last else -(-n // size) for n in samples]
    arg, prefix = (trainer.limit_val_batches, "val") if stage == "validate" else (trainer.limit_test_batches, "test")
    limits = [apply_limit(length, arg, f"limit_{prefix}_batches") for length in lengths]
    if trainer.sanity_checking and trainer.num_sanity_val_steps not in (-1, float("inf")):
        limits = [min(trainer.num_sanity_val_steps, limit) for limit in limits]
    return len(set(limits)) == 1


def limit_eval(loader, limit, prefix="val"):
    """`prefix`: the loader's stage as Lightning names it in messages ("val", "test", "predict")."""
    try:
        length = len(loader)
    except (TypeError, NotImplementedError):  # (Lightning's sized_len: a __len__ that raises either has none)
        length = None
    return apply_limit(length, limit, f"limit_{prefix}_batches")


def apply_limit(length, limit, name):
    """Batches a loader of `length` batches (None: no length) runs under limit_<stage>_batches `limit` (`name`), as
    Lightning's _parse_num_batches: a fraction that leaves no batch of a loader that has some is its
    MisconfigurationException (the run would silently do nothing), as is a fraction of a loader without a length."""
    if limit is None:
        return length
    if isinstance(limit, float):
        if not 0.0 <= limit <= 1.0:
            raise ValueError(f"{name}={limit}: a float is a fraction of the loader in [0, 1]; an int is a batch count.")
        if length is None:
            if limit == 1.0:
                return None
            stage = name[len("limit_"):-len("_batches")]
            raise MisconfigurationException(
                f"When using an `IterableDataset`, `Trainer({name})` must be `1.0` or an int. An int specifies "
                f"`num_{stage}_batches` to use.")
        batches = int(length * limit) if limit < 1.0 else length
        if batches == 0 and length > 0 and limit > 0.0:
            stage = name[len("limit_"):-len("_batches")]
            raise MisconfigurationException(
                f"You requested to check {limit} of the `{stage}_dataloader` but {limit} * {length} < 1. Please "
                f"increase the `{name}` argument. Try at least `{name}={1.0 / length}`")
        return batches
    limit = int(limit)
    return limit if length is None else min(limit, length)
