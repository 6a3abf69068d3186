"""What `self.log` collects.

Values stay tensors until something needs a number (a logger flush, the progress bar, a monitor): logging a
loss every step costs a dict write, not a host sync. Epoch values are reduced once per epoch; `sync_dist=True`
epoch values are reduced across ranks at that point, with one collective per reduction kind. A `sync_dist=True`
training step value is reduced when it is logged (Lightning's rule: every rank's callbacks see the same value), one
collective per such call. Where self.log may be called, and its defaults there, is Lightning's table (HOOK_LOGGING),
checked against the hook the loop is in (MetricStore.fx, set by in_hook / hook_scope around each hook it calls).
"""
import contextlib
import dataclasses
import sys
from collections.abc import Iterable, Mapping
import threading
from functools import partial

import warnings

import torch

from tasktrain.exceptions import MisconfigurationException, PossibleUserWarning
from tasktrain.strategies.watchdog import collective_label

_REDUCE_FX = ("mean", "sum", "max", "min")
_EPOCH_END_HOOKS = ("on_train_epoch_end", "on_validation_epoch_end", "on_test_epoch_end")


def _log_dtype():
    """The dtype a logged value is kept in (Lightning's): the default dtype, but no lower than float32."""
    dtype = torch.get_default_dtype()
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


_WARNED_NOT_FLOATING = set()  # messages already given (Lightning's warning cache: once per message per process)
_WARNED_UNSYNCED = set()  # names already warned about (Lightning's warning cache: once per name per process)

# Where self.log may be called, Lightning 2.6's table (its _FxValidator): hook -> (allowed on_step values, allowed
# on_epoch values, default on_step, default on_epoch); None: self.log is refused there. The hook is the one the loop
# is in (MetricStore.fx, set around each hook call), so a callback's hook and the module's of the same name share it.
_ANY_STEP = ((False, True), (False, True), True, False)  # training's per-step hooks: logged per step by default
_ANY_EVAL = ((False, True), (False, True), False, True)  # an evaluation's per-batch hooks: per epoch by default
_EPOCH_ONLY = ((False,), (True,), False, True)  # run once per epoch or run: an epoch value only
HOOK_LOGGING = {
    **dict.fromkeys((
        "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step", "optimizer_step",
        "configure_gradient_clipping", "clip_gradients", "on_before_zero_grad", "optimizer_zero_grad",
        "on_train_batch_start", "on_train_batch_end", "training_step"), _ANY_STEP),
    **dict.fromkeys((
        "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
        "validation_step", "test_step"), _ANY_EVAL),
    **dict.fromkeys((
        "on_train_start", "on_validation_start", "on_test_start", "on_train_epoch_start", "on_train_epoch_end",
        "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end"),
        _EPOCH_ONLY),
    **dict.fromkeys((
        "lr_scheduler_step", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
        "on_train_end", "on_validation_end", "on_test_end", "on_predict_start", "on_predict_end",
        "on_predict_epoch_start", "on_predict_epoch_end", "on_before_batch_transfer", "transfer_batch_to_device",
        "on_after_batch_transfer", "on_predict_batch_start", "on_predict_batch_end", "on_exception", "state_dict",
        "on_save_checkpoint", "on_load_checkpoint", "load_state_dict", "setup", "teardown", "configure_sharded_model",
        "configure_model", "predict_step", "configure_optimizers", "train_dataloader", "val_dataloader",
        "test_dataloader", "predict_dataloader", "prepare_data", "configure_callbacks",
        "on_validation_model_zero_grad", "on_validation_model_eval", "on_test_model_eval",
        "on_validation_model_train", "on_test_model_train"), None),
}


def logging_levels(fx, on_step, on_epoch):
    """(on_step, on_epoch) of a self.log call in hook `fx`: Lightning's defaults for the hook where not given, and
    its errors (MisconfigurationException, its words) where the hook refuses logging or the values."""
    if fx not in HOOK_LOGGING:
        raise RuntimeError(f"Logging inside `{fx}` is not implemented. Please, open an issue in "
                           "`https://github.com/Lightning-AI/pytorch-lightning/issues`.")
    options = HOOK_LOGGING[fx]
    if options is None:
        raise MisconfigurationException(f"You can't `self.log()` inside `{fx}`. HINT: You can still log directly to "
                                        "the logger by using `self.logger.experiment`.")
    allowed_step, allowed_epoch, default_step, default_epoch = options
    on_step = default_step if on_step is None else on_step
    on_epoch = default_epoch if on_epoch is None else on_epoch
    for what, value, allowed in (("on_step", on_step, allowed_step), ("on_epoch", on_epoch, allowed_epoch)):
        if value not in allowed:
            raise MisconfigurationException(f"You can't `self.log({what}={value})` inside `{fx}`, must be one of "
                                            f"{allowed}.")
    return on_step, on_epoch


def in_hook(metrics, fx, fn):
    """`fn`, called as hook `fx`: what self.log checks and takes its defaults from (the hook before is restored after:
    hooks nest, e.g. training_step inside the closure that optimizer_step runs)."""
    def call(*args, **kwargs):
        previous = metrics.fx
        metrics.fx = fx
        try:
            return fn(*args, **kwargs)
        finally:
            metrics.fx = previous
    call.func = getattr(fn, "func", fn)  # (what an on_exception failure report names, as for a partial)
    return call


@contextlib.contextmanager
def hook_scope(trainer, fx):
    """A hook the loop calls directly (configure_optimizers, a checkpoint hook, ...), named for self.log. Outside a
    run (no metric store: trainer.save_checkpoint after a fit) the name is kept on the trainer alone, for
    module._current_fx_name (Lightning's names every hook it calls)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None:
        if not hasattr(trainer, "_fx_outside_run"):  # (no Trainer: a module built alone, the Accelerator's)
            yield
            return
        previous = trainer._fx_outside_run
        trainer._fx_outside_run = fx
        try:
            yield
        finally:
            trainer._fx_outside_run = previous
        return
    previous = metrics.fx
    metrics.fx = fx
    try:
        yield
    finally:
        metrics.fx = previous


class _Meta:
    __slots__ = ("name", "fx", "prog_bar", "logger", "on_step", "on_epoch", "reduce_fx", "sync_dist", "args")

    def __init__(self, name, fx, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, args):
        self.name, self.fx, self.prog_bar, self.logger = name, fx, prog_bar, logger
        self.on_step, self.on_epoch, self.reduce_fx, self.sync_dist = on_step, on_epoch, reduce_fx, sync_dist
        self.args = args  # the call's own arguments (on_step/on_epoch as given): a repeated call reuses this meta

    def settings(self):
        return self.prog_bar, self.logger, self.on_step, self.on_epoch, self.reduce_fx, self.sync_dist

    def resolved_args(self):
        """args with on_step/on_epoch decided: rebuilding a meta from them (a checkpoint, another rank) gives this one."""
        return (self.fx, self.args[1], self.prog_bar, self.logger, self.on_step, self.on_epoch, self.reduce_fx,
                self.sync_dist)


class MetricStore:
    def __init__(self, strategy):
        self.strategy = strategy
        self.stage = "train"
        self.fx = None  # the hook the loop is in (in_hook / hook_scope): self.log's rules and defaults are its own
        self.metric_attributes = None  # id(Metric) -> the module's attribute that holds it, found at the first Metric
        self.dataloader_suffix = ""  # "/dataloader_idx_N" while an evaluation loop runs its N-th of several loaders
        # False while an evaluation reads a loader whose ranks may take different numbers of batches (an unpadded
        # shard: evaluation.ranks_meet): its sync_dist step values are not reduced at each batch there
        self.eval_ranks_meet = True
        self.loader_of_name = {}  # a name logged with add_dataloader_idx=False -> the suffixes of the loaders that did
        self.unsuffixed_loader = {}  # (hook, such a name) -> the one loader allowed to log it (Lightning's rule)
        self.default_on_step, self.default_on_epoch = True, False
        self.batch = None
        self._batch_size = None
        self._metas = {}
        # name -> the latest step tensor of the stage's epoch (or evaluation run), per stage: an evaluation's own,
        # written at its batches; training's, at the training log steps
        self._step_by_stage = {"train": {}}
        self.step_values = self._step_by_stage["train"]
        self.eval_batches_logged = {}  # (stage, dataloader_idx) -> batches written: the step of an evaluation write
        self._acc_by_stage = {"train": {}}  # stage -> name -> [meta, accumulated value, accumulated weight]
        self.epoch_acc = self._acc_by_stage["train"]
        self.callback_metrics = {}  # name -> tensor: what callbacks (checkpoint, early stopping) monitor
        # trainer.logged_metrics (the trainer's dict): as Lightning's, each logger=True value as it is logged (step
        # values under their step names, epoch values once reduced), loggers or not, log_every_n_steps or not
        self.logged_metrics = {}
        self.prog_bar_names = set()
        self.eval_bar_values = {}  # name -> the latest step value an evaluation logged with prog_bar=True
        self.epoch_values = {}  # name -> tensor, the last reduced epoch values (for the progress bar)
        self._resets_due = []  # the Metric objects an epoch's values were computed from: reset_metric_objects()
        if strategy.runs_steps_in_threads:
            # self.log runs in every GPU's thread (DataParallel): one thread at a time, values onto one device.
            self.log = partial(_log_from_threads, self.log, threading.Lock(), strategy.root_device)

    # -- context set by the trainer ---------------------------------------------------------------------------
    def set_stage(self, stage, on_step, on_epoch):
        self.stage, self.default_on_step, self.default_on_epoch = stage, on_step, on_epoch
        self.epoch_acc = self._acc_by_stage.setdefault(stage, {})
        self.step_values = self._step_by_stage.setdefault(stage, {})

    def set_batch(self, batch):
        self.batch = batch
        self._batch_size = None

    def batch_size(self):
        """The current batch's size as Lightning infers it (once a batch); 1 outside a batch (an epoch-end hook)."""
        if self.batch is None:
            return 1
        if self._batch_size is None:
            self._batch_size = extract_batch_size(self.batch, warn=self.strategy.is_global_zero)
        return self._batch_size

    # -- self.log -------------------------------------------------------------------------------------------------
    def log(self, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size,
            enable_graph=False):
        args = (self.fx, self.stage, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist)
        meta = self._metas.get(name)
        if meta is None or meta.args != args:  # (a repeated call, the common case, is checked once)
            meta = self._new_meta(name, value, args, logged=meta)
        if not isinstance(value, (torch.Tensor, int, float)):  # a torchmetrics Metric (_new_meta checked it)
            self._log_metric_object(name, meta, value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:  # (Lightning's words)
                raise ValueError(f"`self.log({name}, {value})` was called, but the tensor must have a single element. "
                                 f"You can try doing `self.log({name}, {value}.mean())`")
            if type(value).__name__ == "DTensor":  # a loss under tensor parallelism (issue 39): its whole value
                value = value.full_tensor()
            value = value if enable_graph else value.detach()
            if value.dim():  # a one-element tensor of any shape is logged as a scalar (Lightning squeezes it)
                value = value.reshape(())
            if not value.is_floating_point():  # Lightning's: an integer or bool tensor is logged as a float
                self._warn_not_floating(name)
                value = value.to(_log_dtype())
            elif value.dtype not in (torch.float32, torch.float64):  # a half value too (Lightning's: no lower)
                value = value.to(_log_dtype())
        else:
            value = torch.tensor(float(value))
        if meta.on_step:
            key = _forked(name, "_step") if meta.on_epoch else name
            step_value = value
            if meta.sync_dist and self.strategy.world_size > 1 and (self.stage == "train" or self.eval_ranks_meet):
                # Lightning reduces a sync_dist step value when it is logged, with its reduce_fx, so that every rank's
                # callbacks see the same value. (Not an evaluation's where a rank may have a batch fewer, an unpadded
                # shard: a collective per batch would wait for it; their epoch values are synced.)
                with collective_label(self.strategy, f"sync_dist step value [{name!r}]"):  # names both sides (issue 19)
                    step_value = self.strategy.reduce(value.float(), op=meta.reduce_fx)
            self.step_values[key] = step_value
            if meta.logger:
                self.logged_metrics[key] = step_value
            if self.stage == "train":  # Lightning's: evaluation step values reach the loggers and the bar, not
                self.callback_metrics[name] = step_value  # callback_metrics (its epoch values do)
                if key != name:
                    self.callback_metrics[key] = step_value
            elif meta.prog_bar:  # (kept for the bar after the evaluation, as Lightning's progress_bar_metrics)
                self.eval_bar_values[key] = step_value
        if meta.on_epoch:
            acc = self.epoch_acc.get(name)
            fx = meta.reduce_fx
            if fx == "mean":
                weight = batch_size if batch_size is not None else self.batch_size()
                if acc is None:
                    self.epoch_acc[name] = [meta, value.float() * weight, weight]
                else:
                    acc[1] = acc[1] + value.float() * weight
                    acc[2] += weight
            elif acc is None:
                self.epoch_acc[name] = [meta, value.float(), 1]
            elif fx == "sum":
                acc[1] = acc[1] + value
            elif fx == "max":
                acc[1] = torch.maximum(acc[1], value)
            else:
                acc[1] = torch.minimum(acc[1], value)
            if self.fx in _EPOCH_END_HOOKS and not (meta.sync_dist and self.strategy.world_size > 1):
                # Lightning's callback_metrics computes the epoch values while an epoch's end hooks run: a value
                # logged there reads back at once, in the same hook (it is reduced and published after the hooks;
                # a sync_dist value of several processes only then, synced, where Lightning syncs it on reading)
                acc = self.epoch_acc[name]
                self.callback_metrics[name] = acc[1] / acc[2] if fx == "mean" else acc[1]

    def _warn_not_floating(self, name):
        """Lightning's warning where a logged tensor is not floating (it is converted): on rank 0, once per message
        per process (its warning cache). A Python int is converted without a word, as there."""
        dtype = _log_dtype()
        message = (f"You called `self.log({name!r}, ...)` in your `{self.fx}` but the value needs to be floating to be "
                   f"reduced. Converting it to {dtype}. You can silence this warning by converting the value to "
                   "floating point yourself. If you don't intend to reduce the value (for instance when logging the "
                   f"global step or epoch) then you can use `self.logger.log_metrics({{{name!r}: ...}})` instead.")
        if message not in _WARNED_NOT_FLOATING:
            _WARNED_NOT_FLOATING.add(message)
            if self.strategy.is_global_zero:
                warnings.warn(message, UserWarning)

    def _log_metric_object(self, name, meta, metric):
        """A torchmetrics Metric, as Lightning logs it: the user's forward/update accumulates it; on_step logs the
        value of the step's forward (none after update() alone); on_epoch logs metric.compute() at the epoch's end
        (the metric synchronises its own state across ranks there), after which it is reset."""
        if meta.on_step:
            cache = metric._forward_cache
            if cache is not None:
                cache = _scalar_of(name, cache).detach()
                key = _forked(name, "_step") if meta.on_epoch else name
                self.step_values[key] = cache
                if meta.logger:
                    self.logged_metrics[key] = cache
                if self.stage == "train":
                    self.callback_metrics[name] = cache
                    if key != name:
                        self.callback_metrics[key] = cache
                elif meta.prog_bar:
                    self.eval_bar_values[key] = cache
        # kept until the stage's epoch ends, where it is computed (on_epoch) and reset (in any case)
        self.epoch_acc[name] = [meta, metric, None]

    def _new_meta(self, name, value, args, logged=None):
        fx, stage, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist = args
        if fx is not None:  # Lightning's rules of the hook: refused there, or its defaults and allowed values
            on_step, on_epoch = logging_levels(fx, on_step, on_epoch)
        else:  # a call the loop did not name (outside its hooks): the stage's defaults
            on_step = self.default_on_step if on_step is None else on_step
            on_epoch = self.default_on_epoch if on_epoch is None else on_epoch
        if not on_step and not on_epoch:
            raise MisconfigurationException("`self.log(on_step=False, on_epoch=False)` is not useful.")
        if reduce_fx not in _REDUCE_FX:
            raise MisconfigurationException(
                "Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported. If you need a custom reduction, "
                f"please log a `torchmetrics.Metric` instance instead. Found: {reduce_fx}")
        if not isinstance(value, (torch.Tensor, int, float)) and not is_metric_object(value):
            # (Lightning's words first; a ValueError, as Lightning's)
            raise ValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be "
                             "logged: self.log takes a number, a scalar tensor or a torchmetrics Metric.")
        meta = _Meta(name, fx, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, args)
        if logged is not None and fx is not None and logged.fx == fx and logged.settings() != meta.settings():
            raise MisconfigurationException(f"You called `self.log({name}, ...)` twice in `{fx}` with different "
                                            "arguments. This is not allowed")
        self._metas[name] = meta
        if prog_bar:  # (Lightning's: a value logged both on_step and on_epoch shows as "x_step" and "x_epoch")
            self.prog_bar_names.update((_forked(name, "_step"), _forked(name, "_epoch")) if on_step and on_epoch
                                       else (name,))
        return meta

    # -- reductions -----------------------------------------------------------------------------------------------
    def reset_metric_objects(self):
        """Reset the Metric objects logged in the epoch (or evaluation run) that was reduced: after its epoch-end hooks
        (training: on_train_epoch_end; evaluation: on_<stage>_end), where Lightning resets its results."""
        due, self._resets_due = self._resets_due, []
        for metric in due:
            metric.reset()

    def reduce_epoch(self, stage):
        """Reduce `stage`'s accumulated epoch values (across ranks for sync_dist), publish them, and reset."""
        acc = self._acc_by_stage.setdefault(stage, {})
        if stage != "train" and self.strategy.world_size > 1:
            self._agree_on_synced_names(acc)
        if not acc:
            return {}
        names = sorted(acc)
        self._warn_unsynced(acc, names)
        synced = [n for n in names if acc[n][0].sync_dist and acc[n][2] is not None and self.strategy.world_size > 1]
        if synced:
            self._sync_accumulators(acc, synced)
        values = {}
        for name in names:
            meta, total, weight = acc[name]
            if weight is None:  # a Metric object: computed (in the same order on every rank: it syncs); reset once
                # the epoch-end hooks ran (reset_metric_objects), as Lightning's: they may still read its state
                if meta.on_epoch:
                    values[_forked(name, "_epoch") if meta.on_step else name] = \
                        _scalar_of(name, total.compute()).detach()
                if not any(total is due for due in self._resets_due):
                    self._resets_due.append(total)
                if not meta.on_epoch:
                    continue
            else:
                key = _forked(name, "_epoch") if meta.on_step else name
                values[key] = total / weight if meta.reduce_fx == "mean" else total
            key = _forked(name, "_epoch") if meta.on_step else name
            self.callback_metrics[name] = values[key]
            if meta.logger:
                self.logged_metrics[key] = values[key]
        acc.clear()
        self.epoch_values.update(values)
        self.callback_metrics.update(values)
        return values

    def _warn_unsynced(self, acc, names):
        """Lightning's PossibleUserWarning where an epoch value (not a Metric object, which syncs itself) is reduced
        without sync_dist under an initialised process group: each rank then keeps its own value. On rank 0, once
        per name per process."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
                not self.strategy.is_global_zero:
            return
        for key in names:
            meta, _, weight = acc[key]
            name = key.partition(_LOADER)[0]  # (Lightning's message names the value as logged, without its loader)
            if weight is not None and not meta.sync_dist and name not in _WARNED_UNSYNCED:
                _WARNED_UNSYNCED.add(name)
                warnings.warn(f"It is recommended to use `self.log({name!r}, ..., sync_dist=True)` when logging on "
                              "epoch level in distributed setting to accumulate the metric across devices.",
                              PossibleUserWarning)

    def _agree_on_synced_names(self, acc):
        """Evaluation shards are unpadded, so a rank may have seen no batch (or not logged a metric): every rank
        takes part in the sync of every sync_dist metric any rank logged, with an empty accumulator if need be.
        One small object collective per evaluation run, never per step."""
        mine = sorted(((n, item[0].resolved_args()) for n, item in acc.items()
                       if item[0].sync_dist and item[2] is not None), key=lambda pair: pair[0])
        union = {}
        with collective_label(self.strategy, "sync_dist metric names"):
            gathered = self.strategy.all_gather_object(mine)
        for names in gathered:
            union.update(dict(names))
        for name, args in union.items():
            if name not in acc:
                meta = self._new_meta(name, 0.0, tuple(args))
                empty = {"mean": 0.0, "sum": 0.0, "max": float("-inf"), "min": float("inf")}[meta.reduce_fx]
                acc[name] = [meta, torch.tensor(empty, device=self.strategy.root_device), 0]

    def _sync_accumulators(self, acc, names):
        # One collective per reduction kind: means and sums are summed (value and weight), max and min apart.
        for op, fxs in (("sum", ("mean", "sum")), ("max", ("max",)), ("min", ("min",))):
            group = [n for n in names if acc[n][0].reduce_fx in fxs]
            if not group:
                continue
            flat = []
            for n in group:
                _, total, weight = acc[n]
                flat += [total.float().reshape(()), torch.as_tensor(weight, dtype=torch.float32, device=total.device)]
            with collective_label(self.strategy, f"sync_dist epoch values {group}"):  # names both sides (issue 19)
                reduced = self.strategy.reduce(torch.stack(flat), op=op)
            for i, n in enumerate(group):
                acc[n][1] = reduced[2 * i]
                acc[n][2] = reduced[2 * i + 1] if op == "sum" else 1

    def step_metrics_for_logger(self, loader_suffix=None):
        """The latest value of each step metric of the stage's epoch (training's sync_dist values were reduced across
        ranks when logged). As Lightning: a value logged once is written again at each later write of the epoch (the
        stage's values are dropped when its epoch, or evaluation run, starts). `loader_suffix`: while one of several
        evaluation loaders runs, only its values ("/dataloader_idx_N") and unsuffixed ones.
        """
        names = sorted(n for n in self.step_values if self._meta_of(n, "_step").logger)
        if loader_suffix:
            names = [n for n in names if n.endswith(loader_suffix) or "/dataloader_idx_" not in n]
        return {n: self.step_values[n] for n in names}

    def logger_epoch_values(self, values):
        return {n: v for n, v in values.items() if self._meta_of(n, "_epoch").logger}

    def _meta_of(self, key, suffix):
        # "loss_step"/"loss_epoch" belong to "loss" (on_step and on_epoch), "x_step/dataloader_idx_0" to
        # "x/dataloader_idx_0"; a name that itself ends so, to itself
        base, loader, idx = key.rpartition(_LOADER)
        meta = self._metas.get(base.removesuffix(suffix) + loader + idx if loader else key.removesuffix(suffix))
        return meta if meta is not None and (meta.on_step and meta.on_epoch) else self._metas.get(key, meta)

    def progress_bar_metrics(self) -> dict:
        out = {}
        # in callback_metrics' order (first logged since the sanity check, as Lightning's), not the set's
        for name, value in self.callback_metrics.items():  # the latest step value, or the epoch value once reduced
            if name in self.prog_bar_names and value is not None:
                out[name] = value.item() if isinstance(value, torch.Tensor) else value
        for name, value in self.eval_bar_values.items():  # an evaluation's step values (not among callback_metrics)
            if name not in out:
                out[name] = value.item()
        return out

    def state_dict(self):
        # the training epoch's accumulators, so that epoch metrics after a mid-epoch resume cover the whole epoch
        acc = self._acc_by_stage.get("train", {})
        return {name: {"total": total, "weight": weight, "args": list(meta.resolved_args())}
                for name, (meta, total, weight) in acc.items() if weight is not None}  # (a Metric: its own state)

    def load_state_dict(self, state):
        acc = self._acc_by_stage.setdefault("train", {})
        acc.clear()
        for name, item in state.items():
            args = tuple(item["args"])
            if len(args) == 7:  # written before the hook's name was kept (it had none: the stage's defaults)
                args = (None,) + args
            meta = self._new_meta(name, item["total"], args)
            acc[name] = [meta, item["total"], item["weight"]]


_LOADER = "/dataloader_idx_"


def _forked(name, tag):
    """The step or epoch form of a name, Lightning's: "x_step", and "x_step/dataloader_idx_0" for a name that
    carries an evaluation loader's suffix."""
    base, loader, idx = name.rpartition(_LOADER)
    return f"{base}{tag}{loader}{idx}" if loader else name + tag


def is_metric_object(value, kind="Metric"):
    """A torchmetrics Metric (or `kind`: "MetricCollection"): torchmetrics is not imported here (an optional extra); a
    Metric exists only once the user's code has imported it."""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, getattr(torchmetrics, kind))


def _scalar_of(name, value):
    if not isinstance(value, torch.Tensor):  # Lightning's words first (scripts match them), then what to do
        raise ValueError(f"The `.compute()` return of the metric logged as {name!r} must be a tensor. Found {value}. "
                         f"(self.log({name!r}, metric): log a metric that computes one number, or log its parts "
                         "with self.log_dict.)")
    if value.numel() != 1:
        raise ValueError(f"self.log({name!r}, metric): the metric's value must be a scalar tensor, got a tensor of "
                         f"shape {tuple(value.shape)}. Log "
                         "a metric that computes one number (or log its parts with self.log_dict).")
    return value


CANNOT_INFER_BATCH_SIZE = ("We could not infer the batch_size from the batch. Either simplify its structure or "
                          "provide the batch_size as `self.log(..., batch_size=batch_size)`.")
_ambiguity_warned = set()  # each ambiguity message once per process (Lightning's warning cache)


def _batch_sizes(batch):
    """The first dimension of every tensor in the batch (1 for a scalar tensor), in order; None for any other leaf."""
    if isinstance(batch, torch.Tensor):
        yield batch.size(0) if batch.ndim else 1
    elif isinstance(batch, (Iterable, Mapping)) and not isinstance(batch, str):
        for item in batch.values() if isinstance(batch, Mapping) else batch:
            yield from _batch_sizes(item)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _batch_sizes(getattr(batch, field.name))
    else:
        yield None


def extract_batch_size(batch, warn=True):
    """Lightning's extract_batch_size, the weight of a self.log(on_epoch=True, reduce_fx="mean") value without
    batch_size=: the first size found walking the batch (tensors, lists, tuples, dicts, dataclasses, in order;
    leaves without a size before it, strings, numbers, are passed over); a warning, once a process (with `warn`: on
    global rank 0), when a later leaf disagrees (a tensor of another size, or, Lightning's rule, a leaf without a
    size); MisconfigurationException when nothing in the batch has a size."""
    size = None
    try:
        for found in _batch_sizes(batch):
            if size is None:
                size = found
            elif found != size:
                message = ("Trying to infer the `batch_size` from an ambiguous collection. The batch size we found "
                           f"is {size}. To avoid any miscalculations, use `self.log(..., batch_size=batch_size)`.")
                if message not in _ambiguity_warned:
                    _ambiguity_warned.add(message)
                    if warn:
                        warnings.warn(message, UserWarning, stacklevel=4)
                break
    except RecursionError:
        raise RecursionError(CANNOT_INFER_BATCH_SIZE) from None
    if size is None:
        raise MisconfigurationException(CANNOT_INFER_BATCH_SIZE)
    return size


def _log_from_threads(log, lock, device, name, value, *args):
    if isinstance(value, torch.Tensor):
        value = value.detach().to(device)
    with lock:
        log(name, value, *args)
