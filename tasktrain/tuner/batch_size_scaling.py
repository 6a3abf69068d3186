"""The batch-size finder: the largest batch size with which a few training steps run without running out of memory.

On a GPU, a batch that does not fit raises torch.OutOfMemoryError ("CUDA out of memory"), which the trial
catches. On a CPU, memory is the machine's RAM, and Linux usually over-commits it: an allocation that does not fit
rarely raises ("DefaultCPUAllocator: can't allocate memory" when it does) but gets the process killed instead.
So on a CPU the finder in practice grows the size until it reaches the dataset's length or max_trials, and what it
measures there is that the steps run, not a memory limit: choose a CPU batch size for speed, not with this.

`run_trial(trainer, model, loaders)` is the one place a trial decides whether a size fits (True/False; any error
that is not out-of-memory is raised): replace it to make the decision some other way.
"""
import gc
import logging

import torch

from tasktrain.tuner.lr_finder import start_counters_over

log = logging.getLogger(__name__)


def is_oom_error(exception):
    """Out of memory: torch's OutOfMemoryError, or a RuntimeError saying so (CPU allocator, cuDNN)."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if not isinstance(exception, RuntimeError) or not exception.args:
        return False
    text = str(exception.args[0])
    return ("out of memory" in text or "can't allocate memory" in text
            or "CUDNN_STATUS_NOT_SUPPORTED" in text or "CUDNN_STATUS_ALLOC_FAILED" in text)


def run_trial(trainer, model, loaders):
    """Run the trial (a fit, or the validate / test / predict run loaders["method"] names); False if it ran out of
    memory."""
    kwargs = dict(loaders)
    method = kwargs.pop("method", "fit")
    if method in ("validate", "test"):
        kwargs["verbose"] = False  # the trials' results are not the run's
    elif method == "predict":
        kwargs["return_predictions"] = False
    try:
        getattr(trainer, method)(model, **kwargs)
        return True
    except RuntimeError as err:  # torch.OutOfMemoryError is a RuntimeError
        if not is_oom_error(err):
            raise
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return False


def holders(model, datamodule, name):
    """Everything that holds the batch size, in Lightning's order: the module's attribute, its hparams, the
    DataModule's attribute, its hparams (Lightning's search sets it in each, as its lightning_setattr)."""
    found = []
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            found.append(owner)
        if name in getattr(owner, "hparams", {}):
            found.append(owner.hparams)
    if not found:
        raise AttributeError(f"scale_batch_size(batch_arg_name={name!r}): neither {type(model).__name__} nor its "
                             "DataModule has such an attribute or hyper-parameter; its train_dataloader() must read "
                             "the batch size from there.")
    return found


def set_size(found, name, value):
    for holder in found:
        if isinstance(holder, dict):
            holder[name] = value
        else:
            setattr(holder, name, value)


_TRIAL_LIMIT = {"fit": "limit_train_batches", "validate": "limit_val_batches", "test": "limit_test_batches",
                "predict": "limit_predict_batches"}


def scale_batch_size(trainer, model, loaders, mode, steps_per_trial, init_val, max_trials, batch_arg_name,
                     margin=0.05, max_val=8192):
    """Lightning's search, on `trainer` set up for trials by the caller (tuning.py): "power" doubles from init_val
    while a trial fits (and halves while none has: a size that fits is then doubled again), and stops at the
    first failure after a success with the last size that fitted; "binsearch" doubles the same way, then bisects
    between the last size that fitted and the first that failed, and takes `margin` off what it found. Both stop
    once a size reaches the dataset's length (a larger batch holds no more samples), or `max_val`, or after
    `max_trials` trials (binsearch counts the trials that fitted, as Lightning's)."""
    if mode not in ("power", "binsearch"):
        raise ValueError("`mode` should be either of ('power', 'binsearch')")
    if not 0.0 <= margin < 1.0:
        raise AssertionError(f"`margin` should be between 0 and 1. Found margin={margin!r}")
    for arg, value, least in (("steps_per_trial", steps_per_trial, 1), ("init_val", init_val, 1),
                              ("max_trials", max_trials, 0), ("max_val", max_val, 1)):
        if not isinstance(value, int) or value < least:  # (max_trials=0: no trial, init_val kept, as Lightning's)
            raise ValueError(f"scale_batch_size({arg}={value!r}): use an integer of at least {least}.")
    from tasktrain.tuner import batch_size_scaling as this  # look run_trial up at call time: it may be replaced

    method = loaders.get("method", "fit")
    found = holders(model, loaders.get("datamodule"), batch_arg_name)
    # (tuning._tuning set the callbacks aside; the Trainer's gradient clipping stays, as in Lightning's trials)
    if method == "fit":
        # Lightning's trial of a fit: steps_per_trial optimizer steps into the whole epoch (max_epochs and
        # accumulation as set), so the validation batches run only where the fit's would within them (an epoch's
        # end, val_check_interval), on at most steps_per_trial batches
        trainer.max_steps, trainer.limit_train_batches = steps_per_trial, 1.0
        trainer.limit_val_batches = steps_per_trial
    else:
        setattr(trainer, _TRIAL_LIMIT[method], steps_per_trial)
    limit = [None]  # the dataset's length, read from the loader of the last trial that ran

    tried = [False]

    def fits(size):
        set_size(found, batch_arg_name, size)
        last = trainer.state, trainer._epoch_cut_short
        start_counters_over(trainer)
        if method == "fit" and tried[0]:
            # Lightning requests a fit's loaders for the next size between its trials, before it resets its loop's
            # progress: the loader hooks read the last trial's counters (tasktrain's trial requests them itself)
            trainer._trial_counters_shown = last
        tried[0] = True
        try:
            ok = this.run_trial(trainer, model, loaders)
        finally:
            trainer._trial_counters_shown = None
        if ok:  # (Lightning reads it from the loader its trial read)
            limit[0] = _dataset_length(trainer, method)
        return ok

    hook = {"fit": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader",
            "predict": "predict_dataloader"}[method]

    def requested_as_lightning(tried, new, trial_follows):
        """The loader requests Lightning's search makes between its trials, which a user's loader hooks see: an
        evaluation loop requests its loaders each time it is set up, so after a trial at `tried` its search asks
        for them at that size (to read the dataset's length) and, the size changed, at `new` (its reset), and then
        its next trial's run at `new` again (tasktrain's trial requests that one); a fit's loop keeps its loaders,
        so only the reset requests them (train, then val), which the next trial's own request is where one follows.
        The counters are the last trial's, as Lightning's (its loop's progress is reset after)."""
        if method != "fit":
            trainer._loader_of(model, hook)
            if new != tried:
                set_size(found, batch_arg_name, new)
                trainer._loader_of(model, hook)
        elif new != tried and not trial_follows:
            set_size(found, batch_arg_name, new)
            if trainer.limit_train_batches != 0:
                trainer._loader_of(model, hook)
            if trainer._fit_validates:
                trainer._loader_of(model, "val_dataloader")

    def grows_past_data(size):
        """The size already holds every sample, so a larger one tells nothing new (Lightning's line)."""
        if limit[0] is not None and size >= limit[0]:
            log.info(f"The batch size {size} is greater or equal than the length of your dataset: {limit[0]}.")
            return True
        return False

    def doubled(size):
        if size * 2 > max_val:
            log.info(f"Batch size {size * 2} exceeds max_val limit {max_val}, capping at {max_val}")
        return min(size * 2, max_val)

    def reached_max(size):  # (Lightning stops there untried; tasktrain has tried it: docs/tuner.md)
        if size >= max_val:
            log.info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            return True
        return False

    size = min(init_val, max_val)
    if method != "fit" and max_trials > 0:  # (Lightning's search first asks for the loader at the module's size)
        trainer._loader_of(model, hook)
    set_size(found, batch_arg_name, size)
    if mode == "power":
        fitted_once = False
        for trial in range(max_trials):
            if fits(size):
                if trial + 1 >= max_trials:
                    break
                if grows_past_data(size) or reached_max(size):
                    requested_as_lightning(size, size, False)
                    break
                new = doubled(size)
                log.info(f"Batch size {size} succeeded, trying batch size {new}")
                requested_as_lightning(size, new, True)
                size, fitted_once = new, True
            else:
                if size == 1:
                    raise RuntimeError("scale_batch_size: even a batch of 1 runs out of memory.")
                log.info(f"Batch size {size} failed, trying batch size {size // 2}")
                requested_as_lightning(size, size // 2, not fitted_once)
                size //= 2
                set_size(found, batch_arg_name, size)
                if fitted_once:
                    break
    else:
        low, high, fitted = 1, None, 0
        while True:
            if fits(size):
                fitted += 1
                if fitted >= max_trials:
                    break
                if high is not None and high - size <= 1:
                    break
                if grows_past_data(size) or reached_max(size):
                    requested_as_lightning(size, size, False)
                    break
                low = size
                new = (low + high) // 2 if high is not None else doubled(size)
                log.info(f"Batch size {size} succeeded, trying batch size {new}")
                requested_as_lightning(size, new, True)
                size = new
            else:
                high = size
                log.info(f"Batch size {size} failed, trying batch size {(low + high) // 2}")
                requested_as_lightning(size, (low + high) // 2, high - low > 1)
                size = (low + high) // 2
                set_size(found, batch_arg_name, size)
                if high - low <= 1:
                    break
        if margin > 0:  # (binsearch only, as Lightning's: its size is at the edge of what fits)
            reduced = max(1, int(size * (1 - margin)))
            if reduced != size:
                log.info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
            size = reduced
    set_size(found, batch_arg_name, size)
    log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
    return size


def _dataset_length(trainer, method):
    """The length of the dataset the last trial read (the training set for fit, else the stage's loader's: the sum of
    several), from the loaders it built; None when they have none."""
    loaders = {"fit": lambda: trainer.train_dataloader, "validate": lambda: trainer.val_dataloaders,
               "test": lambda: trainer.test_dataloaders, "predict": lambda: trainer.predict_dataloaders}[method]()
    if loaders is None:
        return None
    ones = list(loaders.values()) if isinstance(loaders, dict) else list(loaders) if isinstance(
        loaders, (list, tuple)) else [loaders]
    try:
        return sum(len(one.dataset) for one in ones)
    except (TypeError, AttributeError, NotImplementedError):
        return None
