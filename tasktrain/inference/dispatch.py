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
    """One raw file per tensor plus index.json, read back through memory maps.

    An entry of index.json is {dtype, shape, file} for a tensor written here, or {dtype, shape, safetensors_file,
    weight_name} for one read straight from the checkpoint it was loaded from (no copy: the checkpoint's safetensors
    file already holds it, in the wanted dtype). The second form is the one transformers and Accelerate use.
    """

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

    def reference(self, key, safetensors_file, weight_name, dtype, shape):
        """Record that `key` is tensor `weight_name` of `safetensors_file`, stored as `dtype`: nothing is written."""
        self.entries[key] = {"dtype": str(dtype).removeprefix("torch."), "shape": list(shape),
                             "safetensors_file": os.path.abspath(safetensors_file), "weight_name": weight_name}

    def save_index(self):
        with open(os.path.join(self.folder, "index.json"), "w") as f:
            json.dump(self.entries, f, indent=1)

    def read(self, key) -> torch.Tensor:
        """The tensor as a private memory map of its file: pages are read on use and go away with the tensor."""
        entry = self.entries[key]
        if "safetensors_file" in entry:
            from safetensors import safe_open

            # A view of the file's private memory map; opening per read keeps no mapping alive while idle.
            with safe_open(entry["safetensors_file"], framework="pt") as f:
                return f.get_tensor(entry["weight_name"])
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
def _dispatch(model, index, device_map, main_device, offload_dir, source, order=None):
    """Put every tensor at its place, attach the hooks, and mark the model.

    `source(names, tensor)` gives what to place for a tensor: (load, dtype, copy, done, on_file) where `load()`
    returns the value, `copy` says the value must be copied to be owned by the model, `done` (or None) is called once
    it has been placed, and `on_file` (or None) is (safetensors file, key) holding exactly that tensor in `dtype`, so
    a disk placement can point there instead of writing a copy. `order` lists the tensor ids in the order to place
    them (the checkpoint's, so its shards are read one after the other); the model's order by default.
    """
    if getattr(model, "_tasktrain_dispatched", False):
        raise RuntimeError("This model was already dispatched; hooks would stack. Build a fresh model and dispatch "
                           "it once.")
    owner = _entry_of_each_tensor(device_map, index)
    needs_disk = "disk" in device_map.values()
    if needs_disk and offload_dir is None:
        on_disk = [n for n, d in device_map.items() if d == "disk"]
        raise ValueError(f"The device map offloads {len(on_disk)} block(s) to disk (e.g. {on_disk[:3]}), but no "
                         f"offload_dir was given. Pass offload_dir='some/folder' (offload_folder= to "
                         f"load_checkpoint_and_dispatch; it needs about "
                         f"{format_size(sum(index.size(n) for n in on_disk))} of free space), or give more memory.")
    folder = OffloadFolder(offload_dir) if needs_disk else None
    main = _torch_device(main_device)

    offloaded_by_id = {}
    for tensor_id in (order if order is not None else index.names_of):
        names = index.names_of[tensor_id]
        device = device_map[owner[names[0]]]
        current = index.tensor_of[names[0]]
        refs = [index.refs[n] for n in names]
        requires_grad = current.requires_grad if isinstance(current, nn.Parameter) else False
        load, dtype, copy, done, on_file = source(names, current)
        is_parameter = refs[0][2]
        value = None
        if device == "disk":
            if on_file is not None:
                folder.reference(names[0], on_file[0], on_file[1], dtype, current.shape)
            else:
                value = load()
                folder.write(names[0], value, dtype)
            offloaded = _OffloadedTensor(refs, torch.empty(current.shape, dtype=dtype, device="meta"), requires_grad,
                                         folder, names[0])
            offloaded_by_id[tensor_id] = offloaded
            _set_tensor(refs, offloaded.idle)
        else:
            value = load()
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


def _offload_folder(offload_folder, offload_dir):
    """Accelerate calls it offload_folder when loading and offload_dir when dispatching: both spellings work."""
    if offload_folder is not None and offload_dir is not None and \
            os.path.abspath(os.fspath(offload_folder)) != os.path.abspath(os.fspath(offload_dir)):
        raise ValueError(f"offload_folder={os.fspath(offload_folder)!r} and offload_dir={os.fspath(offload_dir)!r} "
                         f"name two folders for one thing; pass one of them.")
    return offload_folder if offload_folder is not None else offload_dir


def dispatch_model(model: nn.Module, device_map="auto", max_memory=None, offload_dir=None,
                   no_split_module_classes=None, main_device=None, *, offload_folder=None) -> nn.Module:
    """Spread `model` over GPUs, CPU memory and disk, and hook it so that a plain `model(...)` call runs.

    `device_map` is "auto" or "balanced" (spread evenly over the GPUs), "sequential" (fill GPU 0 first, then the
    next), or a dict {module or tensor name: GPU index | "cuda:N" | "cpu" | "disk"}. Offloaded blocks run on
    `main_device` (by default the first GPU of the map, or the CPU when there is none). Disk blocks are written under
    `offload_dir` (`offload_folder` is accepted too). Returns the model, with the map as `model.hf_device_map` (also
    `model.device_map`).
    """
    offload_dir = _offload_folder(offload_folder, offload_dir)
    index = ModelIndex(model)
    on_meta = [n for n, t in index.tensor_of.items() if t.is_meta]
    if on_meta:
        raise ValueError(f"{len(on_meta)} tensor(s) of the model are on the meta device and hold no values "
                         f"(e.g. {on_meta[:3]}). Load weights with "
                         f"load_checkpoint_and_dispatch(model, checkpoint, ...).")
    device_map, main_device = _plan(model, index, device_map, max_memory, no_split_module_classes, None, main_device)

    def as_is(names, tensor):
        return (lambda: tensor), tensor.dtype, False, None, None

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
    every tensor out of the checkpoint would end with the whole file (or shard) resident. torch and safetensors map
    the file privately and nothing writes to it, so MADV_DONTNEED only forgets the pages: reading them again re-reads
    the file. The range is widened to whole pages, which may forget a neighbour's page too; that is harmless for the
    same reason.
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


def _match_names(keys, index, model):
    """{checkpoint key: model tensor name}.

    Keys are taken as they are when any of them names a model tensor. Otherwise, when all share a first component (a
    wrapper such as DDP's "module." or a TaskModule's "model."), that component is dropped, up to three times; and a
    checkpoint of a transformers base model (keys "h.0...") loads into a model with a head ("transformer.h.0...")
    through the model's `base_model_prefix`.
    """
    names = set(index.tensor_of)
    if not keys or any(k in names for k in keys):
        return {k: k for k in keys}
    stripped = list(keys)
    for _ in range(3):
        first = stripped[0].split(".", 1)[0]
        if "." not in stripped[0] or not all(k.startswith(first + ".") for k in stripped):
            break
        stripped = [k[len(first) + 1:] for k in stripped]
        if any(k in names for k in stripped):
            return dict(zip(keys, stripped))
    prefix = getattr(model, "base_model_prefix", None)
    if isinstance(prefix, str) and prefix and any(f"{prefix}.{k}" in names for k in keys):
        return {k: f"{prefix}.{k}" for k in keys}
    return {k: k for k in keys}


def _keeps_fp32(name, patterns) -> bool:
    dotted = f".{name}."
    return any(f".{pattern}." in dotted for pattern in patterns)


def _fp32_patterns(model, dtype, keep_in_fp32_modules):
    """Module names whose floating tensors stay float32 when loading in `dtype`.

    By default transformers' own rule: a model's `_keep_in_fp32_modules` apply when loading in float16, its
    `_keep_in_fp32_modules_strict` in float16 or bfloat16. An explicit list applies to any `dtype`.
    """
    if dtype is None:
        return []
    if keep_in_fp32_modules is not None:
        return list(keep_in_fp32_modules)
    patterns = []
    if dtype == torch.float16:
        patterns += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    if dtype in (torch.float16, torch.bfloat16):
        patterns += list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    return patterns


def _is_persistent(ref) -> bool:
    module, attr, is_parameter = ref
    return is_parameter or attr not in module._non_persistent_buffers_set


def _build(model_factory_or_empty_model):
    if isinstance(model_factory_or_empty_model, nn.Module):
        return model_factory_or_empty_model
    if callable(model_factory_or_empty_model):
        with torch.device("meta"):
            model = model_factory_or_empty_model()
        if not isinstance(model, nn.Module):
            raise TypeError(f"The model factory returned a {type(model).__name__}, not an nn.Module.")
        return model
    raise TypeError("load_checkpoint_and_dispatch needs an nn.Module (built with init_empty_weights, or on meta) or a "
                    f"callable that builds one, got {type(model_factory_or_empty_model).__name__}.")


def _listed(names, limit=8):
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def load_checkpoint_and_dispatch(model_factory_or_empty_model, checkpoint, device_map="auto", max_memory=None,
                                 no_split_module_classes=None, offload_folder=None, *, dtype=None, strict=False,
                                 main_device=None, offload_dir=None, keep_in_fp32_modules=None,
                                 output_loading_info=False):
    """Build a model without allocating its weights, load each tensor of `checkpoint` straight to its place, and
    dispatch it.

    `model_factory_or_empty_model` is a model whose parameters are on meta (built under `init_empty_weights()`), or a
    callable returning the model (called under `torch.device("meta")`). `checkpoint` is a .safetensors file, a torch
    file (a state dict or a Trainer checkpoint), a sharded index (`model.safetensors.index.json`,
    `pytorch_model.bin.index.json`), or a folder holding one of these (safetensors preferred). Shards are read one at
    a time through memory maps, and each tensor's pages are dropped once it is placed, so peak memory stays near what
    the device map keeps in CPU memory plus one tensor, not the size of the model or of a shard.

    `dtype` converts floating tensors of the checkpoint (integer ones keep theirs); without it they take the dtype of
    the model's tensors, as `load_state_dict` would. Modules in `keep_in_fp32_modules` (default: a transformers
    model's `_keep_in_fp32_modules` for float16, `_keep_in_fp32_modules_strict` for float16 and bfloat16) stay
    float32. Tensors the checkpoint does not hold (buffers registered with `persistent=False`) keep the value and
    dtype the model built them with. A disk-offloaded tensor already stored in a .safetensors file in the wanted dtype
    is read from that file when needed instead of being copied under `offload_folder` (`offload_dir` is accepted too).

    If the model has a `tie_weights()` method (transformers models do), it is called first, so tied weights stored
    once (GPT-2's lm_head and wte) share one tensor, one value and one device.

    Keys are checked before anything is read: a checkpoint key the model does not have is *unexpected*, a model tensor
    (parameter or persistent buffer) with no key is *missing*. With `strict=True` either raises, naming them. With
    `strict=False` (the default, as in Accelerate) they are reported in a warning, and a missing tensor keeps the
    value the model already has; one on meta has none, which is always an error. `output_loading_info=True` returns
    (model, {"missing_keys": [...], "unexpected_keys": [...]}) as transformers' from_pretrained does.
    Other arguments are those of `dispatch_model`. Returns the model, with `model.hf_device_map`.
    """
    from tasktrain.inference.checkpoint_files import CheckpointFiles, ShardReader, is_safetensors

    offload_dir = _offload_folder(offload_folder, offload_dir)
    model = _build(model_factory_or_empty_model)
    if getattr(model, "_tasktrain_dispatched", False):
        raise RuntimeError("This model was already dispatched; hooks would stack. Build a fresh model (under "
                           "init_empty_weights()) and load it once.")
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()
    index = ModelIndex(model)
    files = CheckpointFiles(checkpoint)
    where = files.path
    name_of = _match_names(files.keys(), index, model)
    key_of = {name: key for key, name in name_of.items()}

    used, missing, meta_missing = set(), [], []
    entry_of = {}  # tensor id -> the checkpoint entry holding it
    for tensor_id, names in index.names_of.items():
        name = next((n for n in names if n in key_of), None)
        current = index.tensor_of[names[0]]
        if name is None:
            expected = [n for n in names if _is_persistent(index.refs[n])]
            missing.extend(expected[:1])
            if current.is_meta:
                meta_missing.append((expected or names)[0])
            continue
        key = key_of[name]
        entry = files.entries[key]
        if entry.shape != tuple(current.shape):
            raise ValueError(f"Checkpoint tensor '{key}' has shape {entry.shape} but the model's '{name}' has "
                             f"{tuple(current.shape)}: the checkpoint was written by a different model "
                             f"configuration.")
        used.add(key)
        entry_of[tensor_id] = (key, entry)
    # A key naming a tied tensor that another key already gave a value to is not unexpected: the model has that name.
    unexpected = [k for k, name in name_of.items() if name not in index.tensor_of]
    if meta_missing:
        hint = ""
        if not used:
            hint = (f" None of the checkpoint's keys (e.g. {_listed(files.keys(), 3)}) names a tensor of the model "
                    f"(e.g. {_listed([n for n in index.order if n in index.tensor_of], 3)}): check that it was saved "
                    f"from this model class.")
        elif not all(index.refs[n][2] for n in meta_missing):
            hint = (" Buffers registered with persistent=False are not saved in checkpoints: build the model with "
                    "`with init_empty_weights(): model = ...` (buffers keep their values there) and pass the model "
                    "instead of a factory.")
        raise ValueError(f"Checkpoint {where!r} has no value for {len(meta_missing)} tensor(s) of the model, "
                         f"{_listed(meta_missing)}, and the model holds none either (they are on meta). Check that "
                         f"it was saved from this model class and configuration.{hint}")
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing key(s) {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) {_listed(unexpected)}")
        raise ValueError(f"Checkpoint {where!r} does not match the model (strict=True): {'; '.join(parts)}. Load "
                         f"the checkpoint saved from this model class and configuration, or pass strict=False to "
                         f"keep the model's own values for missing keys and ignore unexpected ones.")
    if missing:
        warnings.warn(f"Checkpoint {where!r} has no value for {len(missing)} tensor(s) of the model: "
                      f"{_listed(missing)}; they keep the values the model was built with.", stacklevel=2)
    if unexpected:
        warnings.warn(f"Checkpoint {where!r} has {len(unexpected)} entries the model does not use, "
                      f"{_listed(unexpected)}; they are ignored.", stacklevel=2)

    fp32 = _fp32_patterns(model, dtype, keep_in_fp32_modules)
    targets = {}  # tensor id -> dtype it is loaded in
    for tensor_id, (key, entry) in entry_of.items():
        names = index.names_of[tensor_id]
        current = index.tensor_of[names[0]]
        target = current.dtype
        if dtype is not None and entry.dtype.is_floating_point and current.is_floating_point():
            target = torch.float32 if any(_keeps_fp32(n, fp32) for n in names) else dtype
        targets[tensor_id] = target

    def planned_dtype(name, tensor):
        return targets.get(id(tensor), tensor.dtype)

    device_map, main_device = _plan(model, index, device_map, max_memory, no_split_module_classes, planned_dtype,
                                    main_device)

    reader = ShardReader(files)

    def from_checkpoint(names, current):
        found = entry_of.get(id(current))
        if found is None:
            return (lambda: current), current.dtype, False, None, None
        key, entry = found
        target = targets[id(current)]
        on_file = (entry.shard, key) if is_safetensors(entry.shard) and entry.dtype == target else None
        value = []

        def load():
            value.append(reader.get(key))
            return value[0]

        def done():
            if value and reader.mapped:
                forget = _page_forgetter(value[0])
                value.clear()
                if forget is not None:
                    forget()

        return load, target, True, done, on_file

    # The checkpoint's order: each shard is opened once, read through, and closed before the next.
    shard_rank = {shard: i for i, shard in enumerate(files.shards)}
    order = sorted(index.names_of, key=lambda tid: (shard_rank[entry_of[tid][1].shard], entry_of[tid][1].position)
                   if tid in entry_of else (len(shard_rank), 0))
    try:
        _dispatch(model, index, device_map, main_device, offload_dir, from_checkpoint, order)
    finally:
        reader.close()
    if output_loading_info:
        return model, {"missing_keys": missing, "unexpected_keys": unexpected}
    return model
