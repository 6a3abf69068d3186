"""Accelerate's collective helpers (`accelerate.utils.gather`, ...) over the process's shared strategy
(tasktrain.state): on one process each returns its input. Tensors may sit in lists, tuples and dicts."""
import torch

from tasktrain.tree import apply_to_leaves


def _strategy():
    from tasktrain.compat.accelerate.state import PartialState

    return PartialState()._strategy


def _tensors(data, fn):
    def leaf(value):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"expected a tensor or a list/tuple/dict of tensors, got {type(value).__name__}")
        return fn(value)

    return apply_to_leaves(data, leaf)


def gather(tensor):
    """Every process's tensor(s), concatenated along the first dimension, process by process (0-d: stacked)."""
    strategy = _strategy()
    if strategy.world_size == 1:
        return tensor

    def one(t):
        gathered = strategy.all_gather(t)
        return gathered if t.dim() == 0 else gathered.reshape(-1, *t.shape[1:])

    return _tensors(tensor, one)


def gather_object(obj):
    """Every process's list of picklable objects, concatenated in process order (a flat list, as Accelerate)."""
    strategy = _strategy()
    if strategy.world_size == 1:
        return obj
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"gather_object gathers lists (one per process, concatenated); got {type(obj).__name__}: "
                        "wrap it, gather_object([obj]).")
    return [item for part in strategy.all_gather_object(list(obj)) for item in part]


def broadcast(tensor, from_process=0):
    """Process `from_process`'s tensor(s), on every process."""
    strategy = _strategy()
    if strategy.world_size == 1:
        return tensor
    return _tensors(tensor, lambda t: strategy.broadcast(t, src=from_process))


def broadcast_object_list(object_list, from_process=0):
    """Fills `object_list` in place with process `from_process`'s entries, and returns it."""
    strategy = _strategy()
    if strategy.world_size > 1:
        object_list[:] = strategy.broadcast(list(object_list), src=from_process)
    return object_list


def reduce(tensor, reduction="mean", scale=1.0):
    """All-reduce over processes: "sum", "mean" (Accelerate's default here) or "none"; then times `scale`."""
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduction={reduction!r}: use 'sum', 'mean' or 'none'.")
    strategy = _strategy()

    def one(t):
        if strategy.world_size > 1 and reduction != "none":
            t = strategy.reduce(t.clone(), reduction)
        return t * scale if scale != 1.0 else t

    return _tensors(tensor, one)


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    """Pad `dim` of each tensor to its largest size over processes (filled with pad_index; at the start with
    pad_first=True), so that the tensors can be gathered."""
    strategy = _strategy()

    def one(t):
        if strategy.world_size == 1 or t.dim() == 0 or dim >= t.dim():
            return t
        size = torch.tensor([t.shape[dim]], device=t.device)
        largest = int(strategy.all_gather(size).max())
        if largest == t.shape[dim]:
            return t
        shape = list(t.shape)
        shape[dim] = largest
        out = t.new_zeros(shape) + pad_index
        index = [slice(None)] * t.dim()
        index[dim] = slice(largest - t.shape[dim], largest) if pad_first else slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    return _tensors(tensor, one)


def send_to_device(data, device, non_blocking=False, skip_keys=None):
    """Every tensor in `data` (lists, tuples, dicts; objects with .to()) moved to `device`; other leaves kept."""
    skip = set([skip_keys] if isinstance(skip_keys, str) else (skip_keys or ()))
    if isinstance(data, dict):
        return type(data)({k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                           for k, v in data.items()})
    if isinstance(data, (list, tuple)) and not hasattr(data, "_fields"):
        return type(data)(send_to_device(v, device, non_blocking, skip_keys) for v in data)
    if isinstance(data, tuple):  # a namedtuple
        return type(data)(*(send_to_device(v, device, non_blocking, skip_keys) for v in data))
    if isinstance(data, torch.Tensor) or hasattr(data, "to"):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:
            return data.to(device)
    return data


def wait_for_everyone():
    _strategy().barrier("wait_for_everyone")
