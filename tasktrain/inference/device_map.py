"""Planning where each part of a model lives: tensor sizes, memory budgets, and `infer_device_map`.

Nothing here moves a tensor. `infer_device_map` is a pure function of the model's tensor sizes and the budgets it
is given: when `max_memory` is passed it never looks at the machine, so a plan for GPUs can be made (and tested)
on a machine without any.

Devices are written as GPU indices (ints), "cpu" and "disk", always in that order of preference.
"""
import math
import os
import re
import warnings

import torch
from torch import nn

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_DEVICE_HELP = "expected a GPU index (0, 1, ...), 'cuda:N', 'cpu' or 'disk'"


# -- budgets ------------------------------------------------------------------------------------------------------
def parse_size(value):
    """Bytes from an int or a string such as "20GiB", "500MB" or "1.5GB" (GiB = 2**30 bytes, GB = 10**9).

    A float is accepted as a byte count; float("inf") means unlimited.
    """
    if isinstance(value, bool):
        raise TypeError(f"Memory size {value!r} is a bool; expected a number of bytes or a string like '20GiB'.")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"Memory size {value} is negative; expected a number of bytes >= 0.")
        return value
    if isinstance(value, float):
        if math.isnan(value) or value < 0:
            raise ValueError(f"Memory size {value} is not a number of bytes >= 0.")
        return value if math.isinf(value) else int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else None
        if unit not in _UNITS:
            raise ValueError(
                f"Cannot read memory size {value!r}: expected a number with an optional unit, like '20GiB', "
                f"'500MB' or '1.5GB' (units: B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers "
                f"of 1024)."
            )
        return int(float(match.group(1)) * _UNITS[unit])
    raise TypeError(f"Memory size {value!r} is a {type(value).__name__}; expected an int or a string like '20GiB'.")


def format_size(num_bytes) -> str:
    if math.isinf(num_bytes):
        return "unlimited"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"


def normalize_device(device, where="the device map"):
    """An int GPU index, "cpu" or "disk" from the spellings users write: 0, "cuda:0", torch.device("cuda", 0), ..."""
    if isinstance(device, torch.device):
        if device.type == "cuda":
            return device.index or 0
        if device.type == "cpu":
            return "cpu"
    elif isinstance(device, int) and not isinstance(device, bool):
        if device >= 0:
            return device
    elif isinstance(device, str):
        text = device.strip().lower()
        if text in ("cpu", "disk"):
            return text
        if text == "cuda":
            return 0
        match = re.fullmatch(r"(?:cuda:)?(\d+)", text)
        if match:
            return int(match.group(1))
    raise ValueError(f"Unknown device {device!r} in {where}: {_DEVICE_HELP}.")


def available_cpu_memory() -> int:
    """Bytes of RAM that can be used now: MemAvailable from /proc/meminfo, or free pages where that is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        raise RuntimeError(
            "Cannot tell how much CPU memory is free on this system (no /proc/meminfo, no sysconf). "
            "Pass max_memory={'cpu': '16GiB', ...} explicitly."
        ) from None


def resolve_max_memory(max_memory=None) -> dict:
    """Budgets in bytes, ordered GPUs (by index), "cpu", "disk".

    With `max_memory=None` they are the free memory of every visible GPU and of the CPU, measured now. Otherwise only
    the devices named are used (nothing is queried). "disk" is always available last, unlimited unless given a budget.
    """
    budgets = {}
    if max_memory is None:
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                budgets[index] = torch.cuda.mem_get_info(index)[0]
        budgets["cpu"] = available_cpu_memory()
    else:
        if not isinstance(max_memory, dict):
            raise TypeError(f"max_memory must be a dict like {{0: '20GiB', 'cpu': '64GiB'}}, "
                            f"got {type(max_memory).__name__}.")
        for key, value in max_memory.items():
            device = normalize_device(key, where="max_memory")
            if device in budgets:
                raise ValueError(f"max_memory names device {device!r} twice (as {key!r} and another spelling); "
                                 f"keep one.")
            budgets[device] = parse_size(value)
    budgets.setdefault("disk", math.inf)
    gpus = sorted(d for d in budgets if isinstance(d, int))
    ordered = {d: budgets[d] for d in gpus}
    for name in ("cpu", "disk"):
        if name in budgets:
            ordered[name] = budgets[name]
    if len(ordered) == 1:
        raise ValueError("max_memory names no device to run on, only 'disk'; add 'cpu' (and GPUs) with a budget.")
    return ordered


# -- the model's tensors -------------------------------------------------------------------------------------------
def name_prefixes(name):
    """"" and every dotted prefix of `name`, ending with `name` itself."""
    parts = name.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def is_under(name, prefix) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


class ModelIndex:
    """Every module and tensor of a model by name, with sizes and ties, computed once.

    Names follow `named_modules` / `named_parameters` with duplicates kept, so a Parameter used by two modules
    (tied weights) has two names and one id. `dtype` sizes floating tensors as that dtype; it may also be a function
    (name, tensor) -> dtype or None (None: as the tensor is), for loads that keep some tensors in their dtype.
    """

    def __init__(self, model: nn.Module, dtype=None):
        self.model = model
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.direct = {}      # module name -> names of its own parameters and buffers
        self.refs = {}        # tensor name -> (module, attribute, is_parameter)
        self.tensor_of = {}   # tensor name -> tensor
        self.names_of = {}    # id(tensor) -> all names of that tensor, in definition order
        self.order = {}       # every module and tensor name -> position in definition order
        self.nbytes = {}      # id(tensor) -> bytes (at `dtype` for floating tensors when given)
        for module_name, module in self.modules.items():
            self.order[module_name] = len(self.order)
            own = []
            for is_param, items in ((True, module.named_parameters(recurse=False, remove_duplicate=False)),
                                    (False, module.named_buffers(recurse=False, remove_duplicate=False))):
                for attr, tensor in items:
                    name = f"{module_name}.{attr}" if module_name else attr
                    own.append(name)
                    self.order[name] = len(self.order)
                    self.refs[name] = (module, attr, is_param)
                    self.tensor_of[name] = tensor
                    self.names_of.setdefault(id(tensor), []).append(name)
                    target = dtype(name, tensor) if callable(dtype) else dtype
                    cast = target is not None and tensor.is_floating_point()
                    itemsize = target.itemsize if cast else tensor.element_size()
                    self.nbytes[id(tensor)] = tensor.numel() * itemsize
            self.direct[module_name] = own
        # prefix -> {id: bytes} of the distinct tensors under it; a tied tensor counts once per prefix
        self.under = {}
        for name, tensor in self.tensor_of.items():
            for prefix in name_prefixes(name):
                self.under.setdefault(prefix, {})[id(tensor)] = self.nbytes[id(tensor)]
        self._children = {
            name: [f"{name}.{child}" if name else child for child, _ in module.named_children()]
            for name, module in self.modules.items()
        }

    def exists(self, name) -> bool:
        return name in self.modules or name in self.tensor_of

    def size(self, name) -> int:
        return sum(self.under.get(name, {}).values())

    def unique_bytes(self, names) -> int:
        ids = {}
        for name in names:
            ids.update(self.under.get(name, {}))
        return sum(ids.values())

    def parts(self, name):
        """What a module is split into: its own tensors, then its children."""
        return self.direct[name] + self._children[name]

    def can_split(self, name, no_split) -> bool:
        module = self.modules.get(name)
        return module is not None and bool(self._children[name]) and not no_split(module)

    def tied_outside(self, name):
        """Names of tensors outside `name` that share a tensor with something inside it."""
        found = []
        for tensor_id in self.under.get(name, {}):
            for other in self.names_of[tensor_id]:
                if not is_under(other, name):
                    found.append(other)
        return found

    def atoms(self, no_split):
        """The smallest blocks the planner may produce: no-split modules, leaf modules, and tensors of split modules."""
        found, stack = [], [""]
        while stack:
            name = stack.pop()
            if self.can_split(name, no_split):
                stack.extend(self.parts(name))
            else:
                found.append(name)
        return found


def module_sizes(model: nn.Module, dtype=None) -> dict:
    """Bytes under every module and tensor name ("" is the whole model); tied tensors count once."""
    index = ModelIndex(model, dtype)
    return {name: index.size(name) for name in index.order}


def _no_split_matcher(no_split_module_classes, index):
    wanted = list(no_split_module_classes or [])
    names = {c for c in wanted if isinstance(c, str)}
    classes = tuple(c for c in wanted if isinstance(c, type))
    if len(names) + len(classes) != len(wanted):
        raise TypeError(f"no_split_module_classes must list class names or classes, got {wanted!r}.")
    present = {type(m).__name__ for m in index.modules.values()}
    missing = sorted(names - present)
    if missing:
        warnings.warn(
            f"no_split_module_classes names {missing}, but the model has no module of that class "
            f"(its classes include {sorted(present)[:12]}). Check the spelling.",
            stacklevel=3,
        )
    return lambda module: type(module).__name__ in names or (bool(classes) and isinstance(module, classes))


# -- planning -----------------------------------------------------------------------------------------------------
def _offload_devices(devices):
    """Devices whose blocks are brought to the execution device to run: cpu when there are GPUs, and disk."""
    return {"cpu", "disk"} if any(isinstance(d, int) for d in devices) else {"disk"}


def _bundle(name, queue, index):
    """`name` plus the queued items holding tensors tied to it (and to those, and so on)."""
    bundle = [name]
    pending = [name]
    while pending:
        for other in index.tied_outside(pending.pop()):
            if any(is_under(other, member) for member in bundle):
                continue
            holder = next((item for item in queue if is_under(other, item)), None)
            if holder is not None and holder not in bundle:
                bundle.append(holder)
                pending.append(holder)
    return bundle


def _place(index, budgets, no_split, reserve):
    """One sequential pass: fill each device in order, splitting what does not fit.

    `reserve` bytes are kept free on the first device (where offloaded blocks run), and no block bigger than
    `reserve` is put on an offload device if it can be split.
    """
    devices = list(budgets)
    offload = _offload_devices(devices)
    placement = {}
    queue = [""]
    position, used = 0, 0
    while queue:
        if position == len(devices):
            total = format_size(index.size(""))
            raise ValueError(
                f"The model ({total}) does not fit in max_memory {_describe(budgets)}: '{queue[0] or '(whole model)'}' "
                f"and what follows have no device left. Raise the budgets, or allow disk offload by removing the "
                f"'disk' budget (and pass offload_dir)."
            )
        device = devices[position]
        capacity = budgets[device] - (reserve if position == 0 else 0)
        name = queue[0]
        bundle = _bundle(name, queue[1:], index)
        size = index.unique_bytes(bundle)
        fits = used + size <= capacity
        too_big_to_offload = device in offload and any(index.size(n) > reserve for n in bundle)
        if fits and not too_big_to_offload:
            _assign(bundle, device, placement, queue)
            used += size
            continue
        splittable = [n for n in bundle if index.can_split(n, no_split)]
        if splittable:
            where = queue.index(splittable[0])
            queue[where:where + 1] = index.parts(splittable[0])
            continue
        if fits:
            # Bigger than the current reserve but cannot be split: place it; the caller raises the reserve and replans.
            _assign(bundle, device, placement, queue)
            used += size
            continue
        position, used = position + 1, 0
    return placement


def _assign(bundle, device, placement, queue):
    for member in bundle:
        placement[member] = device
        queue.remove(member)


def _merge(placement, index, offload, reserve):
    """Name a split module again when all its parts ended on one device (offloaded ones only within the reserve)."""
    for name in reversed(list(index.modules)):
        if name in placement or not index.parts(name):
            continue
        parts = index.parts(name)
        if not all(p in placement for p in parts):
            continue
        devices = {placement[p] for p in parts}
        if len(devices) != 1:
            continue
        device = devices.pop()
        if device in offload and index.size(name) > reserve:
            continue
        for p in parts:
            del placement[p]
        placement[name] = device


def _describe(budgets):
    return "{" + ", ".join(f"{d!r}: {format_size(b)}" for d, b in budgets.items()) + "}"


def infer_device_map(model: nn.Module, max_memory=None, no_split_module_classes=None, dtype=None) -> dict:
    """Plan where each part of `model` goes: {module or tensor name: GPU index | "cpu" | "disk"}.

    Devices are filled in order (GPUs by index, then "cpu", then "disk"); a module is named whole when it fits in
    what is left of the current device, and split into its tensors and children only when it does not and is not in
    `no_split_module_classes`. Tied tensors (one Parameter used by several modules) are kept on one device.
    Offloaded blocks ("cpu" and "disk" when there are GPUs, "disk" otherwise) run on the first device, so room for
    the largest of them is kept free there. `dtype` sizes floating tensors as if cast to it.

    A model that fits whole on the first device gives {"": device}. Nothing is queried when `max_memory` is given.
    """
    budgets = resolve_max_memory(max_memory)
    index = ModelIndex(model, dtype)
    no_split = _no_split_matcher(no_split_module_classes, index)
    devices = list(budgets)
    offload = _offload_devices(devices)

    # The room to keep on the first device depends on which blocks end up offloaded, which depends on that room:
    # start from none and grow it to the largest offloaded block until the plan agrees with itself.
    reserve = 0
    while True:
        placement = _place(index, budgets, no_split, reserve)
        offloaded = [n for n, d in placement.items() if d in offload]
        largest = max(offloaded, key=index.size, default=None)
        if largest is None or index.size(largest) <= reserve:
            break
        reserve = index.size(largest)

    first = devices[0]
    if reserve > budgets[first]:
        module = index.modules.get(largest)
        kind = f" ({type(module).__name__})" if module is not None else ""
        hint = ""
        if module is not None and no_split(module) and index.can_split(largest, lambda m: False):
            hint = f", or remove '{type(module).__name__}' from no_split_module_classes so it can be split"
        raise ValueError(
            f"The budget for device {first!r} ({format_size(budgets[first])}) is too small: offloaded blocks run on "
            f"{first!r}, and the largest block that must be offloaded, '{largest}'{kind}, needs "
            f"{format_size(index.size(largest))}. Raise max_memory[{first!r}] to at least "
            f"{format_size(index.size(largest))}{hint}."
        )
    _merge(placement, index, offload, reserve)
    return {name: placement[name] for name in sorted(placement, key=index.order.__getitem__)}


def balanced_max_memory(model: nn.Module, max_memory=None, no_split_module_classes=None, dtype=None) -> dict:
    """Budgets that spread the model evenly over the GPUs instead of filling the first ones.

    Every GPU but the last is capped at its share of the model plus one largest block (so the granularity of the
    split does not push the tail onto the CPU). With fewer than two GPUs the budgets are returned unchanged.
    """
    budgets = resolve_max_memory(max_memory)
    gpus = [d for d in budgets if isinstance(d, int)]
    if len(gpus) < 2:
        return budgets
    index = ModelIndex(model, dtype)
    no_split = _no_split_matcher(no_split_module_classes, index)
    largest_block = max((index.size(n) for n in index.atoms(no_split)), default=0)
    share = math.ceil(index.size("") / len(gpus)) + largest_block
    for gpu in gpus[:-1]:
        budgets[gpu] = min(budgets[gpu], share)
    return budgets
