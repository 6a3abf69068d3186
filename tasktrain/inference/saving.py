"""Writing a model in the Hugging Face layout: `model.safetensors`, or shards plus `model.safetensors.index.json`.

    save_model(model, "export")                          # model.safetensors, or model-0000i-of-0000N.safetensors
    save_model(model, "export", max_shard_size="1GB")    #   + model.safetensors.index.json when it needs several
    save_model(model, "export", safe_serialization=False)  # pytorch_model.bin (or shards + pytorch_model.bin.index.json)

The index is {"metadata": {"total_size": bytes}, "weight_map": {key: shard file}}, as transformers writes it, so
`load_checkpoint_and_dispatch`, `from_pretrained` and the safetensors tools read the result.
"""
import json
import os
import re

import torch
from torch import nn

from tasktrain.inference.checkpoint_files import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from tasktrain.inference.device_map import format_size, parse_size


def _state_dict_of(model) -> dict:
    if isinstance(model, nn.Module):
        partitioned = [n for n, p in model.named_parameters() if hasattr(p, "ds_id")]
        if partitioned:
            raise ValueError(
                f"{type(model).__name__} has DeepSpeed ZeRO-3 partitioned parameters (e.g. {partitioned[:3]}): each "
                f"process holds only a slice. Save the gathered weights instead: Accelerator.save_model(model, ...) "
                f"on every process, or trainer.save_checkpoint(path, weights_only=True) then "
                f"`tasktrain convert path folder --format safetensors`."
            )
        state = model.state_dict()
    elif isinstance(model, dict):
        state = model
    else:
        raise TypeError(f"save_model takes an nn.Module or a state dict {{name: tensor}}, got {type(model).__name__}.")
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"State dict entry '{name}' is a {type(value).__name__}, not a tensor; save_model writes "
                            f"tensors only.")
        if value.is_meta:
            raise ValueError(
                f"'{name}' is on the meta device and has no values: the model was built with init_empty_weights (or on "
                f"meta) and never loaded, or it was dispatched with that part offloaded to disk. Save the model "
                f"before dispatching it, or copy the checkpoint it was loaded from."
            )
        if type(value).__name__ == "DTensor":
            raise ValueError(f"'{name}' is a sharded DTensor: gather the full state dict first "
                             f"(torch.distributed.checkpoint's get_model_state_dict with full_state_dict=True).")
    return state


def _storage_key(tensor):
    return (tensor.device, tensor.untyped_storage().data_ptr())


def _units(state, safe_serialization):
    """[(names, tensor, bytes)]: one unit per distinct tensor, in state dict order.

    Names that are the same tensor (tied weights) form one unit, written once. safetensors refuses two keys over one
    storage, so there only the first name is kept, as transformers does (the loader re-ties the others); torch files
    keep every name, pointing at one stored tensor. A tensor that shares its storage without being the same tensor
    (a slice of a larger one) is copied out, so a file never holds bytes that are not its own.
    """
    units, by_alias, per_storage = [], {}, {}
    for name, tensor in state.items():
        tensor = tensor.detach()
        if tensor.numel() == 0:
            units.append(([name], tensor))
            continue
        alias = (_storage_key(tensor), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                 tensor.dtype)
        if alias in by_alias:
            by_alias[alias][0].append(name)
            continue
        unit = ([name], tensor)
        by_alias[alias] = unit
        units.append(unit)
        per_storage[_storage_key(tensor)] = per_storage.get(_storage_key(tensor), 0) + 1
    found = []
    for names, tensor in units:
        owns_storage = tensor.numel() == 0 or (
            per_storage[_storage_key(tensor)] == 1 and tensor.is_contiguous()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())
        if not owns_storage:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        if safe_serialization:
            names = names[:1]
        found.append((names, tensor, tensor.numel() * tensor.element_size()))
    return found


def _split(units, limit):
    """Consecutive units in shards of at most `limit` bytes; a unit bigger than that gets a shard of its own."""
    shards, current, size = [], [], 0
    for unit in units:
        if current and size + unit[2] > limit:
            shards.append(current)
            current, size = [], 0
        current.append(unit)
        size += unit[2]
    if current or not shards:
        shards.append(current)
    return shards


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_model(model, folder, max_shard_size="2GB", safe_serialization=True) -> list:
    """Write the weights of `model` (an nn.Module or a state dict) to `folder` in the Hugging Face layout.

    Shards hold at most `max_shard_size` (bytes, or a string such as "2GB" = 2*10**9 bytes, "500MiB"); a tensor
    larger than that gets a shard of its own. One shard is written as `model.safetensors` (`pytorch_model.bin` with
    `safe_serialization=False`); several as `model-00001-of-0000N.safetensors` ... plus `model.safetensors.index.json`.
    Tied weights are written once. Every file is written under a temporary name and flushed before any existing file
    is replaced; weight files of the same format left by an earlier save and not part of this one are removed, other
    files in the folder (config.json, tokenizer files) are kept. Returns the paths written, index last.
    """
    state = _state_dict_of(model)
    limit = parse_size(max_shard_size)
    if limit <= 0:
        raise ValueError(f"max_shard_size={max_shard_size!r} is not a positive size; use e.g. '2GB' or '500MB'.")
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise NotADirectoryError(f"save_model writes a folder, but {folder!r} is a file.")
    os.makedirs(folder, exist_ok=True)
    units = _units(state, safe_serialization)
    shards = _split(units, limit)
    if safe_serialization:
        single, index_name, stem, suffix = SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, "model", ".safetensors"
        from safetensors.torch import save_file
    else:
        single, index_name, stem, suffix = WEIGHTS_NAME, WEIGHTS_INDEX_NAME, "pytorch_model", ".bin"
    count = len(shards)
    names = [single] if count == 1 else [f"{stem}-{i:05d}-of-{count:05d}{suffix}" for i in range(1, count + 1)]

    temporary = []
    try:
        for shard, name in zip(shards, names):
            tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
            temporary.append(tmp)
            tensors = {n: tensor for names_of_unit, tensor, _ in shard for n in names_of_unit}
            if safe_serialization:
                save_file(tensors, tmp, metadata={"format": "pt"})  # transformers checks "format"
            else:
                torch.save(tensors, tmp)
            _fsync(tmp)
        index_tmp = None
        if count > 1:
            weight_map = {n: name for shard, name in zip(shards, names) for names_of_unit, _, _ in shard
                          for n in names_of_unit}
            index = {"metadata": {"total_size": sum(u[2] for u in units)},
                     "weight_map": dict(sorted(weight_map.items()))}
            index_tmp = os.path.join(folder, f".{index_name}.tmp-{os.getpid()}")
            temporary.append(index_tmp)
            with open(index_tmp, "w") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
        written = []
        for tmp, name in zip(temporary, names):
            os.replace(tmp, os.path.join(folder, name))
            written.append(os.path.join(folder, name))
        if index_tmp is not None:
            os.replace(index_tmp, os.path.join(folder, index_name))
            written.append(os.path.join(folder, index_name))
    finally:
        for tmp in temporary:
            if os.path.exists(tmp):
                os.remove(tmp)
    # What an earlier save of this format left and this one does not use would confuse a reader of the folder.
    ours = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?{re.escape(suffix)}$")
    keep = set(names) | ({index_name} if count > 1 else set())
    for name in os.listdir(folder):
        if name not in keep and (ours.match(name) or name == index_name):
            os.remove(os.path.join(folder, name))
    try:
        directory = os.open(folder, os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)
    except OSError:
        pass
    return written


def describe_saved(paths) -> str:
    """A one-line summary of what save_model wrote, for the command line."""
    sizes = sum(os.path.getsize(p) for p in paths)
    shards = [p for p in paths if not p.endswith(".json")]
    return f"{len(shards)} file(s), {format_size(sizes)}"
