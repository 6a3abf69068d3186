"""Running a model spread over GPUs, CPU memory and disk: placement, offload, and the hooks that make it work.

Each entry of a device map is a block (a module, or one tensor of a split module). A block on a GPU, or on the CPU
when the CPU is where the model runs, simply lives there. A block on "cpu" while the model runs on a GPU, or on
"disk", is *offloaded*: its weights stay off the execution device while idle and are brought in by a forward
pre-hook just before the block runs, then let go by the forward hook after. Disk weights live in one raw,
memory-mapped file per tensor under `offload_dir`; while idle the module holds "meta" tensors in their place.

Every block also gets its inputs moved to its execution device; outputs stay where they were computed and the next
block moves them. The model's own outputs are moved back to the device its inputs came from.
"""
import ctypes
import json
import mmap
import os
import re
import sys
import warnings

import torch
from torch import nn

from tasktrain.inference.device_map import (
    ModelIndex,
    balanced_max_memory,
    format_size,
    infer_device_map,
    name_prefixes,
    normalize_device,
    resolve_max_memory,
)

_STRATEGIES = ("auto", "balanced", "sequential")
_MOVE_METHODS = ("to", "cuda", "cpu", "half", "float", "double", "bfloat16")


# -- devices ------------------------------------------------------------------------------------------------------
def _visible_gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_device(device) -> torch.device:
    """The torch.device a block on `device` (an int GPU index or "cpu") computes on."""
    return torch.device("cuda", device) if isinstance(device, int) else torch.device("cpu")


def _check_gpus_exist(devices, where):
    count = _visible_gpu_count()
    for device in devices:
        if isinstance(device, int) and device >= count:
            seen = (f"this machine has {count} visible GPU(s), 0..{count - 1}" if count
                    else "this machine has no visible GPU (torch.cuda.is_available() is False)")
            raise ValueError(
                f"{where} uses GPU {device}, but {seen} (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Use an existing GPU index, 'cpu' or 'disk'."
            )


# -- disk offload -------------------------------------------------------------------------------------------------
class OffloadFolder:
    """One raw file per tensor plus index.json ({key: {dtype, shape, file}}), read back through memory maps."""

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.entries = {}
        self._files = set()

    def write(self, key, tensor, dtype=None):
        """Store `tensor` (cast to `dtype` when given) under `key`."""
        dtype = dtype or tensor.dtype
        file = re.sub(r"[^A-Za-z0-9_.-]", "_", key) or "tensor"
        while file + ".dat" in self._files:
            file += "_"
        file += ".dat"
        self._files.add(file)
        path = os.path.join(self.folder, file)
        if os.path.exists(path):
            os.remove(path)  # a stale, longer file from an earlier run would otherwise keep its tail
        if tensor.numel():
            # Writing through a shared map of the destination copies straight from the source (itself possibly a
            # map of the checkpoint) without a full extra copy in RAM, whatever the dtype.
            target = torch.from_file(path, shared=True, size=tensor.numel(), dtype=dtype)
            target.view(tensor.shape).copy_(tensor)
            del target
        else:
            open(path, "wb").close()
        self.entries[key] = {"dtype": str(dtype).removeprefix("torch."), "shape": list(tensor.shape), "file": file}

    def save_index(self):
        with open(os.path.join(self.folder, "index.json"), "w") as f:
            json.dump(self.entries, f, indent=1)

    def read(self, key) -> torch.Tensor:
        """The tensor as a private memory map of its file: pages are read on use and go away with the tensor."""
        entry = self.entries[key]
        dtype = getattr(torch, entry["dtype"])
        shape = entry["shape"]
        numel = 1
        for dim in shape:
            numel *= dim
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        path = os.path.join(self.folder, entry["file"])
        return torch.from_file(path, shared=False, size=numel, dtype=dtype).view(shape)


# -- offloaded tensors and hooks ----------------------------------------------------------------------------------
def _wrap(value, is_parameter, requires_grad):
    if is_parameter and not isinstance(value, nn.Parameter):
        return nn.Parameter(value, requires_grad=requires_grad)
    return value


def _set_tensor(refs, value):
    """Make every module attribute in `refs` (all the names of one, possibly tied, tensor) hold `value`."""
    for module, attr, is_parameter in refs:
        if is_parameter:
            module._parameters[attr] = value
        else:
            module._buffers[attr] = value


class _OffloadedTensor:
    """One tensor that lives off the execution device while idle.

    Counted, because a tied tensor can be needed by two blocks at once (a split module's own weight and a child's):
    it is brought in by the first block that needs it and let go when the last one is done. It holds the module
    attributes to set, not the model index, so nothing keeps the model's original tensors alive.
    """

    def __init__(self, refs, idle, requires_grad, folder=None, key=None):
        self.refs, self.requires_grad = refs, requires_grad
        self.is_parameter = refs[0][2]
        self.idle = _wrap(idle, self.is_parameter, requires_grad)
        self.folder, self.key = folder, key
        self.users = 0

    def acquire(self, device):
        if self.users == 0:
            source = self.folder.read(self.key) if self.folder is not None else self.idle.data
            _set_tensor(self.refs, _wrap(source.to(device), self.is_parameter, self.requires_grad))
        self.users += 1

    def release(self):
        if self.users == 0:
            return  # the pre-hook failed before bringing this one in; the post-hook still runs (always_call)
        self.users -= 1
        if self.users == 0:
            _set_tensor(self.refs, self.idle)


def _move(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_move(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device) for v in value)
    if isinstance(value, dict):
        moved = {k: _move(v, device) for k, v in value.items()}
        if type(value) is dict:
            return moved
        try:
            return type(value)(moved)
        except TypeError:
            return moved
    return value


def _first_device(value):
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _first_device(item)
        if found is not None:
            return found
    return None


class _BlockHooks:
    """The forward pre-hook and hook of one module: bring offloaded weights in, move inputs, let weights go."""

    def __init__(self):
        self.input_device = None      # torch.device to move inputs to, or None (a split module: children move theirs)
        self.offloaded = []           # _OffloadedTensor used by this module's block
        self.offload_device = None    # where offloaded weights are brought to
        self.return_to_caller = False  # the model itself: outputs go back to the device of its inputs
        self._caller_devices = []

    def pre(self, module, args, kwargs):
        if self.return_to_caller:
            self._caller_devices.append(_first_device((args, kwargs)))
        for tensor in self.offloaded:
            tensor.acquire(self.offload_device)
        if self.input_device is not None:
            args, kwargs = _move(args, self.input_device), _move(kwargs, self.input_device)
        return args, kwargs

    def post(self, module, args, kwargs, output):
        # Registered with always_call, so weights are let go even when the forward raised.
        for tensor in self.offloaded:
            tensor.release()
        if self.return_to_caller and self._caller_devices:
            device = self._caller_devices.pop()
            if device is not None and output is not None:
                output = _move(output, device)
        return output


def _refuse_moves(module, summary):
    for method in _MOVE_METHODS:
        def refuse(*args, _method=method, **kwargs):
            raise RuntimeError(
                f"{type(module).__name__}.{_method}() was called on a model dispatched with a device map "
                f"({summary}). Its weights are placed block by block (offloaded ones are brought to the execution "
                f"device only while they run), so moving or casting the whole model would break that placement. "
                f"To run it elsewhere or in another dtype, build it again and call dispatch_model / "
                f"load_checkpoint_and_dispatch with the device_map, max_memory or dtype you want."
            )
        object.__setattr__(module, method, refuse)


# -- checking a device map ----------------------------------------------------------------------------------------
def _normalize_map(device_map, index):
    if not isinstance(device_map, dict) or not device_map:
        raise TypeError(f"device_map must be one of {_STRATEGIES} or a non-empty dict {{name: device}}, "
                        f"got {device_map!r}.")
    normalized = {}
    for name, device in device_map.items():
        if not isinstance(name, str):
            raise TypeError(f"device_map keys are module or tensor names (str), got {name!r}.")
        if not index.exists(name):
            known = [n for n in index.order if n][:10]
            raise ValueError(f"device_map names '{name}', which is neither a module nor a parameter/buffer of "
                             f"the model. Names look like {known}.")
        normalized[name] = normalize_device(device, where=f"device_map['{name}']")
    return normalized


def _entry_of_each_tensor(device_map, index):
    """tensor name -> the device map entry holding it; every tensor must be held by exactly one entry."""
    owner, uncovered = {}, []
    for name in index.tensor_of:
        holders = [prefix for prefix in name_prefixes(name) if prefix in device_map]
        if len(holders) > 1:
            raise ValueError(f"device_map entries {holders} overlap (both hold '{name}'); keep only one of them.")
        if not holders:
            uncovered.append(name)
        else:
            owner[name] = holders[0]
    if uncovered:
        raise ValueError(f"device_map places no device for {len(uncovered)} tensor(s), e.g. {uncovered[:5]}. "
                         f"Add entries for them (or for a module holding them), or use device_map='auto'.")
    for tensor_id, names in index.names_of.items():
        devices = {device_map[owner[n]] for n in names}
        if len(devices) > 1:
            raise ValueError(f"Tied tensor {names} is shared by modules the device_map puts on different devices "
                             f"({sorted(map(str, devices))}); put those modules on one device.")
    return owner


def _plan(model, index, device_map, max_memory, no_split_module_classes, dtype, main_device):
    """The checked device map and the device offloaded blocks run on."""
    if isinstance(device_map, (str, int, torch.device)) and device_map not in _STRATEGIES:
        try:
            device_map = {"": normalize_device(device_map, where="device_map")}  # "cpu", 0, "cuda:1": all there
        except ValueError:
            raise ValueError(f"device_map={device_map!r} is neither a strategy {_STRATEGIES}, nor a device, nor a "
                             f"dict {{module name: device}}.") from None
    if isinstance(device_map, str):
        budgets = resolve_max_memory(max_memory)
        if max_memory is not None:
            _check_gpus_exist(budgets, "max_memory")
        if device_map in ("auto", "balanced"):
            budgets = balanced_max_memory(model, budgets, no_split_module_classes, dtype)
        device_map = infer_device_map(model, budgets, no_split_module_classes, dtype)
        planned_first = next(iter(budgets))
        if main_device is None and isinstance(planned_first, int):
            main_device = planned_first
    device_map = _normalize_map(device_map, index)
    _check_gpus_exist(device_map.values(), "device_map")
    if main_device is None:
        gpus = [d for d in device_map.values() if isinstance(d, int)]
        main_device = min(gpus) if gpus else "cpu"
    else:
        main_device = normalize_device(main_device, where="main_device")
        if main_device == "disk":
            raise ValueError("main_device='disk' cannot run anything; use a GPU index or 'cpu'.")
        _check_gpus_exist([main_device], "main_device")
    return device_map, main_device


def _is_offloaded(device, main_device):
    return device == "disk" or (device == "cpu" and main_device != "cpu")


def _runs(module) -> bool:
    """Whether calling the module runs a forward: containers (ModuleList, ModuleDict, ParameterList) have none."""
    return type(module).forward is not nn.Module.forward


def _callable_ancestor(index, name):
    """The nearest module at or above `name` that runs a forward (its owner's tensors are used there)."""
    parts = name.split(".")
    for end in range(len(parts), -1, -1):
        candidate = ".".join(parts[:end])
        if candidate in index.modules and _runs(index.modules[candidate]):
            return candidate
    return ""


def _hook_sites(index, entry):
    """Where the hooks of one device map entry go: (module name, ids of tensors it brings in, moves inputs?).

    A block normally hooks its own module, which then brings in every tensor under it, so a forward that reads a
    child's weight directly still finds it. A container that is never called (a ModuleList) hands the job to its
    children, and its own tensors (a ParameterList's) to the nearest module above that is called.
    """
    if entry not in index.modules:
        owner = entry.rpartition(".")[0]
        return [(_callable_ancestor(index, owner), list(index.under[entry]), False)]
    if _runs(index.modules[entry]):
        return [(entry, list(index.under.get(entry, {})), True)]
    sites = []
    for part in index.parts(entry):
        sites.extend(_hook_sites(index, part))
    return sites


# -- placing tensors and attaching hooks --------------------------------------------------------------------------
def _dispatch(model, index, device_map, main_device, offload_dir, source):
    """Put every tensor at its place, attach the hooks, and mark the model.

    `source(names, tensor)` gives what to place for a tensor: (value, dtype, copy, done) where `copy` says the value
    must be copied to be owned by the model, and `done` (or None) is called once it has been placed.
    """
    if getattr(model, "_tasktrain_dispatched", False):
        raise RuntimeError("This model was already dispatched; hooks would stack. Build a fresh model and dispatch "
                           "it once.")
    owner = _entry_of_each_tensor(device_map, index)
    needs_disk = "disk" in device_map.values()
    if needs_disk and offload_dir is None:
        on_disk = [n for n, d in device_map.items() if d == "disk"]
        raise ValueError(f"The device map offloads {len(on_disk)} block(s) to disk (e.g. {on_disk[:3]}), but no "
                         f"offload_dir was given. Pass offload_dir='some/folder' (it needs about "
                         f"{format_size(sum(index.size(n) for n in on_disk))} of free space), or give more memory.")
    folder = OffloadFolder(offload_dir) if needs_disk else None
    main = _torch_device(main_device)

    offloaded_by_id = {}
    for tensor_id, names in index.names_of.items():
        device = device_map[owner[names[0]]]
        current = index.tensor_of[names[0]]
        refs = [index.refs[n] for n in names]
        requires_grad = current.requires_grad if isinstance(current, nn.Parameter) else False
        value, dtype, copy, done = source(names, current)
        is_parameter = refs[0][2]
        if device == "disk":
            folder.write(names[0], value, dtype)
            offloaded = _OffloadedTensor(refs, torch.empty(value.shape, dtype=dtype, device="meta"), requires_grad,
                                         folder, names[0])
            offloaded_by_id[tensor_id] = offloaded
            _set_tensor(refs, offloaded.idle)
        else:
            placed = value.to(_torch_device(device), dtype=dtype, copy=copy and device == "cpu")
            if current.is_meta:
                placed = _wrap(placed, is_parameter, requires_grad)
                _set_tensor(refs, placed)
            elif placed is not current:
                current.data = placed  # keeps the Parameter object, so anything holding it (and its ties) stays valid
                placed = current
            if _is_offloaded(device, main_device):
                offloaded_by_id[tensor_id] = _OffloadedTensor(refs, placed, requires_grad)
        del value
        if done is not None:
            done()
    if folder is not None:
        folder.save_index()

    hooks = {}
    for entry, device in device_map.items():
        offloaded = _is_offloaded(device, main_device)
        run_on = main if offloaded else _torch_device(device)
        for module_name, tensor_ids, moves_inputs in _hook_sites(index, entry):
            hook = hooks.setdefault(module_name, _BlockHooks())
            if moves_inputs:
                hook.input_device = run_on
            if offloaded:
                hook.offload_device = main
                for tensor_id in tensor_ids:
                    if offloaded_by_id[tensor_id] not in hook.offloaded:
                        hook.offloaded.append(offloaded_by_id[tensor_id])
    hooks.setdefault("", _BlockHooks()).return_to_caller = True
    for module_name, hook in hooks.items():
        module = index.modules[module_name]
        module.register_forward_pre_hook(hook.pre, with_kwargs=True)
        module.register_forward_hook(hook.post, with_kwargs=True, always_call=True)

    offloaded_entries = [e for e, d in device_map.items() if _is_offloaded(d, main_device)]
    run_devices = {main_device if _is_offloaded(d, main_device) else d for d in device_map.values()}
    if offloaded_entries or len(run_devices) > 1:
        counts = {}
        for device in device_map.values():
            counts[device] = counts.get(device, 0) + 1
        summary = ", ".join(f"{n} block(s) on {d!r}" for d, n in counts.items())
        # The model itself, and every module that holds an offloaded block or is part of one.
        guarded = {""}
        for entry in offloaded_entries:
            guarded.update(name_prefixes(entry))
        offloaded_set = set(offloaded_entries)
        for name, module in index.modules.items():
            if name in guarded or any(p in offloaded_set for p in name_prefixes(name)):
                _refuse_moves(module, summary)

    object.__setattr__(model, "_tasktrain_dispatched", True)
    model.hf_device_map = dict(device_map)
    model.device_map = model.hf_device_map
    return model


def dispatch_model(model: nn.Module, device_map="auto", max_memory=None, offload_dir=None,
                   no_split_module_classes=None, main_device=None) -> nn.Module:
    """Spread `model` over GPUs, CPU memory and disk, and hook it so that a plain `model(...)` call runs.

    `device_map` is "auto" or "balanced" (spread evenly over the GPUs), "sequential" (fill GPU 0 first, then the
    next), or a dict {module or tensor name: GPU index | "cuda:N" | "cpu" | "disk"}. Offloaded blocks run on
    `main_device` (by default the first GPU of the map, or the CPU when there is none). Returns the model, with
    the map as `model.hf_device_map` (also `model.device_map`).
    """
    index = ModelIndex(model)
    on_meta = [n for n, t in index.tensor_of.items() if t.is_meta]
    if on_meta:
        raise ValueError(f"{len(on_meta)} tensor(s) of the model are on the meta device and hold no values "
                         f"(e.g. {on_meta[:3]}). Load weights with "
                         f"load_checkpoint_and_dispatch(model, checkpoint, ...).")
    device_map, main_device = _plan(model, index, device_map, max_memory, no_split_module_classes, None, main_device)
    def as_is(names, tensor):
        return tensor, tensor.dtype, False, None

    return _dispatch(model, index, device_map, main_device, offload_dir, as_is)


# -- loading a checkpoint straight to its place -------------------------------------------------------------------
def _find_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_madvise = _find_madvise()
_MADV_DONTNEED = 4


def _page_forgetter(tensor):
    """A callable that drops the pages of a memory-mapped checkpoint tensor from this process's resident memory.

    Pages read from a mapped file stay counted in the process's memory for as long as the mapping lives, so copying
    every tensor out of the checkpoint would end with the whole file resident. torch maps the file privately and
    nothing writes to it, so MADV_DONTNEED only forgets the pages: reading them again re-reads the file. The range is
    widened to whole pages, which may forget a neighbour's page too; that is harmless for the same reason.
    """
    if _madvise is None:
        return None
    storage = tensor.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    if end <= start:
        return None
    page = mmap.PAGESIZE
    start -= start % page
    end += -end % page
    return lambda: _madvise(start, end - start, _MADV_DONTNEED)


def _open_checkpoint(checkpoint):
    """(state dict, memory-mapped?) from a plain state dict file or a Trainer checkpoint ({"state_dict": ...})."""
    path = os.fspath(checkpoint)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint {path!r} is not a file. Pass the path of a file written by torch.save "
                                f"(a state dict) or by the Trainer.")
    try:
        loaded, mapped = torch.load(path, map_location="cpu", mmap=True, weights_only=True), True
    except RuntimeError as err:
        if "zip" not in str(err).lower():
            raise
        # Files in torch's legacy (pre-1.6) format cannot be mapped; they are read whole.
        loaded, mapped = torch.load(path, map_location="cpu", weights_only=True), False
    if isinstance(loaded, dict):
        for key in ("state_dict", "module"):
            if isinstance(loaded.get(key), dict):
                return loaded[key], mapped
        if all(isinstance(v, torch.Tensor) for v in loaded.values()):
            return loaded, mapped
    raise ValueError(f"Checkpoint {path!r} holds a {type(loaded).__name__} that is neither a state dict "
                     f"({{name: tensor}}) nor a checkpoint dict with a 'state_dict' or 'module' entry.")


def _match_names(state_dict, index):
    """Checkpoint keys as model names: when no key names a model tensor but all share a first component (a wrapper
    such as DDP's "module." or a TaskModule's "model."), that component is dropped, up to three times."""
    model_names = set(index.tensor_of)
    keys = list(state_dict)
    for _ in range(4):
        if any(k in model_names for k in keys):
            return dict(zip(keys, state_dict.values()))
        first = keys[0].split(".", 1)[0] if keys else ""
        if not first or not all(k.startswith(first + ".") for k in keys):
            break
        keys = [k[len(first) + 1:] for k in keys]
    return state_dict


def load_checkpoint_and_dispatch(model_factory_or_empty_model, checkpoint, device_map="auto", max_memory=None,
                                 offload_dir=None, no_split_module_classes=None, dtype=None,
                                 main_device=None) -> nn.Module:
    """Build a model without allocating its weights, load each tensor of `checkpoint` straight to its place, and
    dispatch it.

    `model_factory_or_empty_model` is a callable returning the model (called under `torch.device("meta")`) or a
    model whose tensors are on meta. The checkpoint is memory-mapped and tensors are copied one at a time to their
    GPU, to CPU memory, or to `offload_dir`, so peak memory stays near the CPU budget plus one block rather than the
    whole model. `dtype` casts floating tensors. Other arguments are those of `dispatch_model`.
    """
    if isinstance(model_factory_or_empty_model, nn.Module):
        model = model_factory_or_empty_model
    elif callable(model_factory_or_empty_model):
        with torch.device("meta"):
            model = model_factory_or_empty_model()
        if not isinstance(model, nn.Module):
            raise TypeError(f"The model factory returned a {type(model).__name__}, not an nn.Module.")
    else:
        raise TypeError("load_checkpoint_and_dispatch needs an nn.Module (on meta) or a callable that builds one, "
                        f"got {type(model_factory_or_empty_model).__name__}.")
    index = ModelIndex(model)
    state_dict, mapped = _open_checkpoint(checkpoint)
    state_dict = _match_names(state_dict, index)

    source, missing = {}, []
    for tensor_id, names in index.names_of.items():
        key = next((n for n in names if n in state_dict), None)
        current = index.tensor_of[names[0]]
        if key is None:
            if current.is_meta:
                missing.extend(names[:1])
            continue
        if tuple(state_dict[key].shape) != tuple(current.shape):
            raise ValueError(f"Checkpoint tensor '{key}' has shape {tuple(state_dict[key].shape)} but the model's is "
                             f"{tuple(current.shape)}: the checkpoint was written by a different model configuration.")
        source[tensor_id] = state_dict[key]
    if missing:
        hint = ("" if all(index.refs[n][2] for n in missing) else
                " Buffers registered with persistent=False are not saved in checkpoints: build the model on meta "
                "yourself, give those buffers their values (module.register_buffer(name, value, persistent=False)), "
                "and pass the model instead of a factory.")
        raise ValueError(f"Checkpoint {os.fspath(checkpoint)!r} has no value for {len(missing)} tensor(s) of the "
                         f"model, e.g. {missing[:5]}. Check that it was saved from this model class and "
                         f"configuration.{hint}")
    unexpected = [k for k in state_dict if k not in index.tensor_of]
    if unexpected:
        warnings.warn(f"Checkpoint {os.fspath(checkpoint)!r} has {len(unexpected)} entries the model does not use, "
                      f"e.g. {unexpected[:5]}; they are ignored.", stacklevel=2)

    device_map, main_device = _plan(model, index, device_map, max_memory, no_split_module_classes, dtype, main_device)

    def from_checkpoint(names, current):
        value = source.get(id(current))
        if value is None:
            return current, current.dtype, False, None
        target = dtype if dtype is not None and value.is_floating_point() else current.dtype
        return value, target, True, _page_forgetter(value) if mapped else None

    return _dispatch(model, index, device_map, main_device, offload_dir, from_checkpoint)
