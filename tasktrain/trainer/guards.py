"""Guards of a run the user can trust (issue 38): no silent no-op, no poisoned checkpoint, a clean Ctrl-C.

- `check_limits`: the loop's limits, checked when the Trainer is built (Lightning's rules).
- `check_training_batches`: an empty training loader is an error before training, not zero steps and a checkpoint;
  `trains_nothing`: limit_train_batches=0 skips the loop, as in Lightning.
- `finished_run`: a resume from a run that has nothing left to train says so, and the fit writes nothing.
- `may_save_checkpoint`: before any checkpoint is written, whether the state since the last check stayed finite.
- `interrupt_begin`: Ctrl-C is one line per rank, the on_exception hooks, then exit code 1 (Lightning's).
- `install_sigterm_handler`: SIGTERM sets trainer.received_sigterm for the run (issue 37: Lightning's handler); the
  loops raise SIGTERMException where Lightning's do (loop.py, evaluation.py).
"""
import logging
import numbers
import os
import signal
import sys
import threading
import warnings
import weakref
from datetime import timedelta

import torch

from tasktrain.checkpoint_io import note_sigterm
from tasktrain.exceptions import MisconfigurationException
from tasktrain.strategies.base import MultiProcess


# -- limits -----------------------------------------------------------------------------------------------------------
def _is_int(value):  # 3, numpy's int64(3), 3.0 from a config file; not True, not 1.5
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())


def check_limits(max_epochs, max_steps, min_epochs, min_steps, val_check_interval, **batch_limits):
    """Raise MisconfigurationException (a ValueError) for a limit that would train nothing or be ignored, with
    Lightning's words first where Lightning refuses it too."""
    for name, value in (("max_epochs", max_epochs), ("max_steps", max_steps)):
        if value is not None and (not _is_int(value) or value < -1):
            infinite = " (infinite steps)" if name == "max_steps" else ""  # (Lightning's two sentences)
            raise MisconfigurationException(f"`{name}` must be a non-negative integer or -1{infinite}. You passed in "
                                            f"{value}. "
                                            f"Trainer({name}={value!r}): use a non-negative integer, or -1 for no "
                                            "limit.")
    for name, value in (("min_epochs", min_epochs), ("min_steps", min_steps)):
        if value is not None and (not _is_int(value) or value < 0):
            raise ValueError(f"Trainer({name}={value!r}): use a non-negative integer (or None for no minimum).")
    for name, value in batch_limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                  or (isinstance(value, float) and value > 1.0)):
            raise MisconfigurationException(  # Lightning's type and first sentence
                f"{invalid_value_sentence(value, name)}"
                f"Trainer({name}={value!r}): a float is a fraction of the loader in [0.0, 1.0]; an int is a number "
                "of batches (>= 0).")
    if val_check_interval is not None and not isinstance(val_check_interval, (str, dict, timedelta)):
        value = val_check_interval
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or \
                (isinstance(value, float) and value > 1.0):
            # Lightning's first sentence where Lightning refuses it too (a negative value, a fraction above 1)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            lightnings = invalid_value_sentence(value, "val_check_interval") \
                if number and (value < 0 or (value > 1 and value % 1)) else ""
            raise MisconfigurationException(
                f"{lightnings}Trainer(val_check_interval={value!r}): a float is a fraction of the training epoch in "
                "(0.0, 1.0]; an int is a number of training batches (>= 1); a time ('DD:HH:MM:SS', a timedelta or a "
                "dict of timedelta's arguments) validates once that long has passed since the last validation.")


def invalid_value_sentence(value, name):
    """Lightning's words for a batch limit, overfit_batches or val_check_interval it refuses (its
    _determine_batch_limits), put first in ours."""
    return f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] or an int. "


def check_val_schedule(val_check_interval, check_val_every_n_epoch):
    """Lightning's refusals of a validation schedule, raised when the Trainer is built."""
    if check_val_every_n_epoch is not None and (isinstance(check_val_every_n_epoch, bool)
                                                or not isinstance(check_val_every_n_epoch, int)):
        raise MisconfigurationException(
            f"`check_val_every_n_epoch` should be an integer, found {check_val_every_n_epoch!r}.")
    if check_val_every_n_epoch is None and isinstance(val_check_interval, float):
        raise MisconfigurationException(
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`.")


def check_val_interval_fits(trainer, has_length):
    """At training start (Lightning's point), where the training loader is known: a val_check_interval that no epoch
    reaches, or a fraction of an epoch that has no length, is an error (it would never validate)."""
    interval = trainer.val_check_interval
    if not trainer.enable_validation or interval is None or trainer._val_check_time_interval is not None:
        return
    if isinstance(interval, int) and not isinstance(interval, bool):
        batches = trainer._num_training_batches
        if has_length and batches is not None and interval > batches and \
                trainer.check_val_every_n_epoch is not None and trainer.limit_val_batches != 0:
            raise ValueError(
                f" `val_check_interval` ({interval}) must be less than or equal to the number of the training "
                f"batches ({batches}). If you want to disable validation set `limit_val_batches` to 0.0 instead. If "
                "you want to validate based on the total training batches, set `check_val_every_n_epoch=None`.")
    elif not has_length and interval != 1.0:
        raise MisconfigurationException(
            "When using an IterableDataset for `train_dataloader`, `Trainer(val_check_interval)` must be time based, "
            "`1.0` or an int. An int k specifies checking validation every k training batches.")


def val_check_seconds(value):
    """val_check_interval given as a time (Lightning's: 'DD:HH:MM:SS', a timedelta, a dict of timedelta's
    arguments) -> seconds; None for a fraction or a count of batches."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, dict):
        try:
            seconds = timedelta(**value).total_seconds()
        except TypeError as error:
            raise MisconfigurationException(f"Trainer(val_check_interval={value!r}): {error}; use timedelta's "
                                            "arguments (days, hours, minutes, seconds, ...).") from None
    elif isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 4:
            raise MisconfigurationException(
                f"Invalid time format for `val_check_interval`: {value!r}. Expected 'DD:HH:MM:SS'.")
        try:
            days, hours, minutes, secs = (int(part) for part in parts)
        except ValueError:
            raise MisconfigurationException(
                f"Non-integer component in `val_check_interval` string: {value!r}. Use 'DD:HH:MM:SS'.") from None
        seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    else:
        return None
    if seconds < 0:
        raise MisconfigurationException(f"Trainer(val_check_interval={value!r}): a time cannot be negative.")
    return seconds


# -- an empty training loader -----------------------------------------------------------------------------------------
def check_training_batches(length, loader):
    """`length`: the batches this rank's training loader yields per epoch (None: unknown, an iterable)."""
    if length != 0:
        return
    dataset = getattr(loader, "dataset", None)
    try:
        rows = len(dataset)
    except TypeError:
        rows = None
    batch_size, drop_last = getattr(loader, "batch_size", None), getattr(loader, "drop_last", False)
    if rows == 0:
        why = "its dataset is empty"
    elif dataset is None:  # an empty list (train_dataloader() returned []) or an iterable that yields nothing
        why = f"it is an empty {type(loader).__name__}"
    elif drop_last and rows is not None and batch_size:
        why = f"its dataset has {rows} rows, fewer than batch_size={batch_size}, and drop_last=True drops them"
    else:
        why = f"(dataset rows: {rows}, batch_size={batch_size}, drop_last={drop_last})"
    raise ValueError(
        f"The training loader yields no batches: {why}. fit would take no step and still write checkpoints. "
        "Give it data, a smaller batch_size, or drop_last=False.")


def allows_zero_length(trainer):
    """Lightning's allow_zero_length_dataloader_with_multiple_devices: the module's, or the attached DataModule's."""
    from tasktrain.trainer.module import instance_flag

    name = "allow_zero_length_dataloader_with_multiple_devices"
    datamodule = trainer.datamodule
    return bool(instance_flag(trainer.module, name) or (datamodule is not None and instance_flag(datamodule, name)))


def zero_length_ranks(trainer, lengths):
    """Lightning's has_len_all_ranks, for each loader's length on this rank (None: no length) in one collective:
    (total batches of each loader over the ranks, ranks where each has none), [] for the unknown ones; every rank
    gets the same answer, so every rank decides alike (Lightning's raises on the empty rank only, and the others
    wait for it)."""
    known = [0 if n is None else n for n in lengths]
    local = torch.tensor(known + [int(n == 0) for n in lengths], dtype=torch.float64)
    summed = trainer.strategy.reduce(local, op="sum").tolist()
    count = len(lengths)
    totals = [None if n is None else (int(t) if t < float("inf") else t) for n, t in zip(lengths, summed[:count])]
    return totals, [int(z) for z in summed[count:]]


def check_zero_length_ranks(trainer, names, lengths):
    """On several processes, Lightning's has_len_all_ranks on each training loader (`names`: their class names;
    `lengths`: their batches on this rank, None: no length), the last one the whole training loader (Lightning's
    CombinedLoader around them), in one collective. A loader that has batches on some ranks and none on others is
    refused with Lightning's RuntimeError, unless the module or DataModule sets
    allow_zero_length_dataloader_with_multiple_devices = True: then Lightning's warning, by rank 0 where rank 0 is
    the one without batches (Lightning's rank_zero_warn on the empty rank: where another rank is the empty one,
    nothing is said). A loader with no batch on any rank, beside others that have some: Lightning's warning by rank
    0; where the whole training loader has none, issue 38's error says it instead (check_training_batches). Returns
    each loader's total over the ranks (None: no length), or the lengths as given on one process."""
    if trainer.world_size <= 1 or not torch.distributed.is_initialized():
        # (no group yet: a loop's setup_data called before the launch; Lightning's reduce there gives the local value)
        return list(lengths)
    totals, empty_ranks = zero_length_ranks(trainer, lengths)
    says = trainer.is_global_zero
    for name, local, total, empty in zip(names, lengths, totals, empty_ranks):
        if total == 0 and totals[-1] != 0 and says:
            warnings.warn(f"Total length of `{name}` across ranks is zero. Please make sure this was your intention.")
        if not total or not empty:
            continue
        if not allows_zero_length(trainer):
            # every rank raises (Lightning's: the empty ranks only, and the others wait for them in a collective
            # until they are stopped): the ranks with batches say it in the same words, naming how many have none
            raise RuntimeError(f"`{name}` within local rank has zero length. Please make sure that it returns at least "
                               f"1 batch. ({empty} of {trainer.world_size} ranks have none; set "
                               "`self.allow_zero_length_dataloader_with_multiple_devices = True` in the module's or "
                               "DataModule's __init__ to run such uneven loaders, as under Lightning.)")
        if says and local == 0:
            warnings.warn(f"Total length of `{name}` across ranks is zero, but local rank has zero length. Please be "
                          "cautious of uneven batch length.")
    return totals


def trains_nothing(trainer):
    """limit_train_batches=0: Lightning skips fit's loop (no epoch, no checkpoint, `last` unchanged); so do we, and
    say so instead of counting empty epochs and saving an `epoch=N-step=0` checkpoint."""
    if trainer.limit_train_batches != 0 and trainer._num_training_batches != 0:
        return False
    if trainer.is_global_zero:
        print(f"[tasktrain] limit_train_batches={trainer.limit_train_batches}: fit trains nothing (no epoch, no "
              "checkpoint).", file=sys.stderr, flush=True)
    return True


# -- a finished run resumed -------------------------------------------------------------------------------------------
def finished_run(trainer, path):
    """True (and says so on rank 0) when the restored position leaves nothing to train."""
    if not trainer._done():
        return False
    if trainer.is_global_zero:
        name = "max_steps" if trainer._max_steps_reached() else "max_epochs"
        print(f"[tasktrain] {path} is a finished run (epoch {trainer.current_epoch}, global step "
              f"{trainer.global_step}) and {name}={getattr(trainer, name)} is reached: nothing to train, nothing "
              f"written. To train on, raise {name}.", file=sys.stderr, flush=True)
    return True


# -- non-finite state -------------------------------------------------------------------------------------------------
class NonFiniteCheckpointWarning(UserWarning):
    """A checkpoint was not written because the loss or the weights went non-finite."""


_CHECKED = weakref.WeakKeyDictionary()  # trainer -> (position, reason): one check per position, however many saves


def _local(tensor):
    # a DTensor (FSDP2, tensor parallel): this rank's shard; the ranks' answers are combined below. Read from
    # sys.modules, not imported: a DTensor exists only once torch.distributed.tensor is imported, and importing it
    # here cost every run (a DDP or one-process one too) ~0.4 s of CPU at start-up.
    dtensor = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor


def nonfinite_reason(trainer):
    """None when the losses since the last check and the weights are finite on every rank, else what was not.

    The losses are the detached ones the loop keeps anyway (no host sync per step); here they and every parameter
    are tested in one batch, with one host read and, on several processes, one small all-reduce."""
    module = trainer.module
    losses = list(getattr(trainer, "_loss_window", None) or [])
    device = trainer.strategy.root_device
    flags = torch.zeros(2, device=device)
    if losses:
        flags[0] = (~torch.isfinite(torch.stack([l.float().reshape(()) for l in losses]))).any().to(device)
    if module is not None:
        bad = [(~torch.isfinite(_local(p.detach()))).any().to(device) for p in module.parameters()
               if p.dtype.is_floating_point and not p.is_meta and _local(p).numel()]
        if bad:
            flags[1] = torch.stack(bad).any()
    if trainer.world_size > 1:
        flags = trainer.strategy.reduce(flags, op="max")
    loss_bad, weights_bad = (bool(v) for v in flags.tolist())
    if not (loss_bad or weights_bad):
        return None
    what = " and ".join(w for w, bad in (("the training loss", loss_bad), ("the weights", weights_bad)) if bad)
    return f"{what} went non-finite (NaN/inf)"


def may_save_checkpoint(trainer, filepath):
    """Whether a checkpoint of the trainer's state may be written now. A non-finite state is not written: a
    NonFiniteCheckpointWarning says what was skipped; inside fit's loop a FloatingPointError then ends the run (the
    error the loop's own loss check raises), so no save of that state is ever made, and nothing is deleted or
    pointed at for it. Called on every rank (the answer is the same everywhere)."""
    # The same state asked twice (ModelCheckpoint, then save_checkpoint) is checked once: every in-place change of
    # a parameter (an optimizer step, a user's edit) bumps its version counter
    module, state = trainer.module, trainer.state
    versions = sum(p._version for p in module.parameters()) if module is not None else 0
    position = (id(module), versions, state.global_step, len(getattr(trainer, "_loss_window", ()) or ()))
    cached = _CHECKED.get(trainer)
    if cached is not None and cached[0] == position:
        reason = cached[1]
    else:
        reason = nonfinite_reason(trainer)
        _CHECKED[trainer] = (position, reason)
    if reason is None:
        return True
    where = f"epoch {trainer.current_epoch}, global step {trainer.global_step}"
    if trainer.is_global_zero:
        warnings.warn(f"Not saving a checkpoint to {filepath}: {reason} at {where}. Checkpoints already written "
                      "are kept, and 'last', 'best' and the top k stay on them.", NonFiniteCheckpointWarning,
                      stacklevel=3)
    handling_error = sys.exc_info()[1] is not None  # an exception save (on_exception): that error is the one raised
    in_fit = state.fn == "fit" and state.status == "running"
    if in_fit and not handling_error:
        raise FloatingPointError(
            f"Training stopped: {reason} at {where}, so {filepath} was not saved. Lower the learning rate, clip "
            "gradients (gradient_clip_val=1.0), check the data for NaN/inf, or use bf16-mixed instead of 16-mixed.")
    return False


# -- Ctrl-C -----------------------------------------------------------------------------------------------------------
class _Interrupt:
    def __init__(self, previous):
        self.previous = previous

    def exit(self):
        """The SystemExit that ends the interrupted run: code 1, Lightning's; a worker our launcher started exits 130
        (the shell's code for SIGINT), which rank 0's watcher reads as "stopped as asked", not as a failure. One
        process: Ctrl-C works again (a notebook goes on); several: it stays ignored, the process is ending."""
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return SystemExit(130 if os.environ.get("TASKTRAIN_ERROR_FILE") else 1)


def sigint_once():
    """While a stage runs (main thread, Python's own Ctrl-C handler in place): the first SIGINT raises
    KeyboardInterrupt and ignores the next ones at once, before any Python runs. A worker receives both the
    terminal's SIGINT and rank 0's forwarded one; the second must not interrupt the graceful shutdown. Returns the
    handler restore_sigint puts back, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None

    def on_sigint(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    return previous


def restore_sigint(previous, strategy):
    """Put back what sigint_once replaced; except after a Ctrl-C on several processes: the process is on its way out,
    and a late forwarded SIGINT must not interrupt its exit (atexit's group teardown) with a traceback."""
    if previous is None:
        return
    if strategy.world_size > 1 and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, previous)


def interrupt_begin(exc, strategy):
    """Ctrl-C (KeyboardInterrupt): one line instead of a traceback, a second Ctrl-C ignored while the on_exception
    hooks save, and the workers this process started told (those the terminal's SIGINT reached already ignore it);
    returns the _Interrupt whose exit() to raise once the hooks ran. None for other errors."""
    if not isinstance(exc, KeyboardInterrupt):
        return None
    previous = None
    if threading.current_thread() is threading.main_thread():
        # first: a worker gets the terminal's SIGINT and rank 0's forwarded one; the second must not land mid-print
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"[tasktrain] rank {strategy.global_rank}: Detected KeyboardInterrupt, attempting graceful shutdown ...",
          file=sys.stderr, flush=True)
    if strategy.world_size > 1:
        previous = None
        if isinstance(strategy, MultiProcess):
            strategy.forward_signal(signal.SIGINT)
    return _Interrupt(previous)


# -- SIGTERM (issue 37: Lightning's signal connector) ------------------------------------------------------------------
def install_sigterm_handler(trainer):
    """Lightning's SIGTERM handler for one run (fit, validate, test, predict), installed where Lightning registers it:
    after the set-up and the checkpoint's restore, before the loop (the sanity check included). It sets
    trainer.received_sigterm (False again here), passes the signal on once to the workers this process started (a
    self-launched DDP run), and calls the handler that was there before (the user's; not SIG_IGN / SIG_DFL), as
    Lightning composes them. The loops raise SIGTERMException at their next check (loop.py, evaluation.py); predict
    has none and runs on. restore_sigterm_handler puts the previous handler back at the run's end. Main thread only
    (Python's rule for signal handlers)."""
    trainer.received_sigterm = False
    if threading.current_thread() is not threading.main_thread():
        return
    strategy = trainer.strategy
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        logging.getLogger("tasktrain").info(f"[rank: {strategy.local_rank}] Received SIGTERM: {signum}")
        if not trainer.received_sigterm and isinstance(strategy, MultiProcess):
            strategy.forward_signal(signal.SIGTERM)  # to the workers it started itself, if any
        trainer.received_sigterm = True
        note_sigterm()  # (a wait for a background checkpoint write gives up on parts of dead ranks)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    trainer._sigterm_previous = (previous,)


def restore_sigterm_handler(trainer):
    """The run's end (its loop done, or after the on_exception hooks): the handler there before the run is back."""
    saved = getattr(trainer, "_sigterm_previous", None)
    trainer._sigterm_previous = None
    if saved is not None and saved[0] is not None:
        signal.signal(signal.SIGTERM, saved[0])
