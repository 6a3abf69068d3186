"""Accelerate's collective helpers (`accelerate.utils.gather`, ...) over the process's shared strategy
(tasktrain.state): on one process each returns its input. Tensors may sit in lists, tuples and dicts."""
import torch

from tasktrain.tree import apply_to_leaves


class DistributedOperationException(Exception):
    """A collective that cannot run as called: the processes passed tensors of different shapes (or on another
    device than the process's). Raised by the debug-mode checks (ACCELERATE_DEBUG_MODE=1 or
    TASKTRAIN_DEBUG_MODE=1 in the environment, or `PartialState().debug = True`), before the collective runs, on
    every process alike, instead of a hang or a garbled result."""


def _strategy():
    from tasktrain.compat.accelerate.state import PartialState

    return PartialState()._strategy


def _debug():
    from tasktrain.compat.accelerate.state import PartialState

    return PartialState().debug


def _leaves(data):
    found = []
    apply_to_leaves(data, found.append)
    return found


def _check_across_processes(operation, data, strategy, compare=None):
    """Debug mode: every process's tensors have the same shapes (compare: which part of each shape must agree)
    and sit on this process's device type; else DistributedOperationException on every process, naming each
    process's shapes. Costs an all_gather_object per call: only under debug mode."""
    if strategy.world_size == 1 or not _debug():
        return
    device_type = strategy.root_device.type
    leaves = _leaves(data)
    # each tensor's shape, in the order of the structure (a non-tensor leaf: its type's name)
    shapes = [tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else type(leaf).__name__ for leaf in leaves]
    misplaced = [leaf.device.type for leaf in leaves
                 if isinstance(leaf, torch.Tensor) and leaf.device.type != device_type]
    seen = strategy.all_gather_object((shapes, misplaced))  # every process learns every process's answer
    if any(wrong for _, wrong in seen):
        where = ", ".join(f"process {rank}: {sorted(set(wrong))}" for rank, (_, wrong) in enumerate(seen) if wrong)
        raise DistributedOperationException(
            f"{operation}: tensors on another device than the processes' {device_type} ({where}). Move them to "
            "accelerator.device (send_to_device) first.")
    keys = [[compare(shape) if compare is not None and isinstance(shape, tuple) else shape for shape in s]
            for s, _ in seen]
    if any(key != keys[0] for key in keys[1:]):
        listed = "\n".join(f"  - process {rank}: {s}" for rank, (s, _) in enumerate(seen))
        raise DistributedOperationException(
            f"{operation} cannot run: the processes' tensors differ in "
            f"{'their number of dimensions' if compare is not None else 'shape'}:\n{listed}\n"
            "Make every process pass the same shapes (pad_across_processes pads one dimension to the largest).")


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
    _check_across_processes("gather", tensor, strategy)

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
    _check_across_processes("broadcast", tensor, strategy)
    return _tensors(tensor, lambda t: strategy.broadcast(t, src=from_process))


def broadcast_object_list(object_list, from_process=0):
    """Fills `object_list` in place with process `from_process`'s entries, and returns it."""
    strategy = _strategy()
    if strategy.world_size > 1:
        object_list[:] = strategy.broadcast(list(object_list), src=from_process)
    return object_list


def reduce(tensor, reduction="mean", scale=1.0):
    """All-reduce over processes, element by element: "sum", "mean" (Accelerate's default here), "max", "min" or
    "none"; then times `scale`."""
    if reduction not in ("sum", "mean", "max", "min", "none"):
        raise ValueError(f"reduction={reduction!r}: use 'sum', 'mean', 'max', 'min' or 'none'.")
    strategy = _strategy()
    if reduction != "none":
        _check_across_processes("reduce", tensor, strategy)

    def one(t):
        if strategy.world_size > 1 and reduction != "none":
            t = strategy.reduce(t.clone(), op=reduction)
        return t * scale if scale != 1.0 else t

    return _tensors(tensor, one)


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    """Pad `dim` of each tensor to its largest size over processes (filled with pad_index; at the start with
    pad_first=True), so that the tensors can be gathered."""
    strategy = _strategy()
    # the sizes of `dim` are gathered: every process's tensors need as many dimensions
    _check_across_processes("pad_across_processes", tensor, strategy, compare=len)

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


def copy_tensor_to_devices(tensor=None):
    """The tensor that one process holds (the others pass None), on every process's device: unlike broadcast, the
    receivers need not know its shape or dtype."""
    strategy = _strategy()
    if strategy.world_size == 1:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices: no process passed a tensor (this one passed None).")
        return tensor
    holders = [rank for rank, held in enumerate(strategy.all_gather_object(tensor is not None)) if held]
    if len(holders) != 1:
        raise ValueError(f"copy_tensor_to_devices: exactly one process passes the tensor and the others None; "
                         f"{'none' if not holders else 'processes ' + str(holders)} passed one.")
    sent = strategy.broadcast(None if tensor is None else tensor.detach().cpu(), src=holders[0])
    return sent.to(strategy.root_device)


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
