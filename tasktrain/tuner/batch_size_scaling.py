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

import torch

from tasktrain.tuner.lr_finder import set_attr, start_counters_over


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
    """Run the trial fit; False if it ran out of memory."""
    try:
        trainer.fit(model, **loaders)
        return True
    except RuntimeError as err:  # torch.OutOfMemoryError is a RuntimeError
        if not is_oom_error(err):
            raise
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return False


def batch_attr(model, datamodule, name):
    """Where the batch size lives: the module (attribute or hparams), else the DataModule."""
    for owner in (model, datamodule):
        if owner is not None and (hasattr(owner, name) or name in getattr(owner, "hparams", {})):
            return owner
    raise AttributeError(f"scale_batch_size(batch_arg_name={name!r}): neither {type(model).__name__} nor its "
                         "DataModule has such an attribute or hyper-parameter; its train_dataloader() must read the "
                         "batch size from there.")


def _get(owner, name):
    return getattr(owner, name) if hasattr(owner, name) else owner.hparams[name]


def scale_batch_size(trainer, model, loaders, mode, steps_per_trial, init_val, max_trials, batch_arg_name):
    if mode not in ("power", "binsearch"):
        raise ValueError(f"scale_batch_size(mode={mode!r}): use 'power' or 'binsearch'.")
    for arg, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"scale_batch_size({arg}={value!r}): use a positive integer.")
    from tasktrain.tuner import batch_size_scaling as this  # look run_trial up at call time: it may be replaced

    owner = batch_attr(model, loaders.get("datamodule"), batch_arg_name)
    limit = _dataset_length(model, loaders)
    trainer.callbacks = []
    trainer.max_steps, trainer.max_epochs = steps_per_trial, -1
    trainer.limit_train_batches = steps_per_trial
    trainer.limit_val_batches = steps_per_trial  # the validation batches must fit too
    trainer.accumulate_grad_batches = 1
    size, low, high, trials = init_val, None, None, 0
    while trials < max_trials:
        trials += 1
        set_attr(owner, batch_arg_name, size)
        start_counters_over(trainer)
        fits = this.run_trial(trainer, model, loaders)
        print(f"[tasktrain] scale_batch_size: batch size {size} {'fits' if fits else 'ran out of memory'}", flush=True)
        if fits:
            low = size
            if limit is not None and size >= limit:
                break  # the whole dataset in one batch: no larger size means anything
            if high is None:
                size = size * 2 if limit is None else min(size * 2, limit)
            elif mode == "binsearch" and high - low > 1:
                size = (low + high) // 2
            else:
                break
        else:
            high = size
            if low is not None and mode == "power":
                size = low
                break
            if low is None:
                if size == 1:
                    raise RuntimeError("scale_batch_size: even a batch of 1 runs out of memory.")
                size = max(1, size // 2)
            elif high - low > 1:
                size = (low + high) // 2
            else:
                size = low
                break
    size = low if low is not None else size
    set_attr(owner, batch_arg_name, size)
    print(f"[tasktrain] scale_batch_size: {batch_arg_name} set to {size}", flush=True)
    return size


def _dataset_length(model, loaders):
    """The training set's length, read from the loader the module builds (None when it has none)."""
    source = loaders.get("datamodule") or model
    try:
        return len(source.train_dataloader().dataset)
    except (TypeError, AttributeError):
        return None
