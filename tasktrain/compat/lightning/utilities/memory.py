"""`lightning.pytorch.utilities.memory`: out-of-memory tests on an exception, garbage_collection_cuda,
recursive_detach."""
import gc

import torch

from tasktrain.tree import apply_to_leaves
from tasktrain.tuner.batch_size_scaling import is_oom_error  # the core's test (the batch-size finder uses it)

__all__ = ["garbage_collection_cuda", "is_cuda_out_of_memory", "is_cudnn_snafu", "is_oom_error",
           "is_out_of_cpu_memory", "recursive_detach"]


def _message(exception):
    """The single-string message of a RuntimeError (what torch raises for these), else None."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return exception.args[0]
    return None


def is_cuda_out_of_memory(exception):
    text = _message(exception)
    return text is not None and "CUDA" in text and "out of memory" in text


def is_cudnn_snafu(exception):
    text = _message(exception)  # (pytorch issue 4107: cuDNN refuses where memory is short)
    return text is not None and "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in text


def is_out_of_cpu_memory(exception):
    text = _message(exception)
    return text is not None and "DefaultCPUAllocator: can't allocate memory" in text


def garbage_collection_cuda():
    """Collect Python's garbage and give the CUDA cache back; an out-of-memory error while emptying it is swallowed
    (the point is to free memory), any other error is raised."""
    gc.collect()
    try:
        torch.cuda.empty_cache()
    except RuntimeError as error:
        if not is_oom_error(error):
            raise


def recursive_detach(in_dict, to_cpu=False):
    """The same containers with every tensor detached (and moved to the CPU with to_cpu=True); other leaves as
    they are."""
    def detach(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        leaf = leaf.detach()
        return leaf.cpu() if to_cpu else leaf

    return apply_to_leaves(in_dict, detach)
