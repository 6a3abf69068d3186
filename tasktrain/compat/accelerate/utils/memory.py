"""find_executable_batch_size and release_memory (Accelerate's `accelerate.utils` names)."""
import functools
import gc
import inspect

import torch

# The messages torch raises when an allocation fails (CUDA/HIP/XPU, MPS, the CPU allocator) or cuDNN cannot run.
_OUT_OF_MEMORY = (" out of memory.", "MPS backend out of memory", "DefaultCPUAllocator: can't allocate memory",
                  "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")


def is_out_of_memory(error) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return (isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str)
            and any(text in error.args[0] for text in _OUT_OF_MEMORY))


def release_memory(*objects):
    """Drop the references given (returns Nones to assign back: `a, b = release_memory(a, b)`), collect garbage
    and empty the accelerator's cache."""
    objects = [None] * len(objects)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return objects


def find_executable_batch_size(function=None, starting_batch_size=128, reduce_batch_size_fn=None):
    """Decorator: call `function(batch_size, *args, **kwargs)` from `starting_batch_size`, and after each
    out-of-memory error again with a smaller one (x0.9, or `reduce_batch_size_fn()`), until it runs.

        @find_executable_batch_size(starting_batch_size=64)
        def train(batch_size, model):
            ...
        train(model)                # batch_size is the decorator's to pass
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    state = {"batch_size": int(starting_batch_size)}

    def smaller():
        return int(state["batch_size"] * 0.9)

    shrink = reduce_batch_size_fn or smaller

    @functools.wraps(function)
    def run(*args, **kwargs):
        names = list(inspect.signature(function).parameters)
        if len(names) < len(args) + 1:
            raise TypeError(f"{function.__name__} got its batch size as an argument: the decorator passes it. Call "
                            f"{function.__name__}(" + ", ".join(names[1:len(args)]) + ").")
        while True:
            if state["batch_size"] <= 0:
                raise RuntimeError("find_executable_batch_size: no batch size fits in memory (reached 0).")
            release_memory()
            try:
                return function(state["batch_size"], *args, **kwargs)
            except Exception as error:  # noqa: BLE001 (only out-of-memory errors are retried)
                if not is_out_of_memory(error):
                    raise
                state["batch_size"] = int(shrink())

    return run
