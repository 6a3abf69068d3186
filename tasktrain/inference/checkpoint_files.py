"""The checkpoints `load_checkpoint_and_dispatch` reads, seen as shards: which file holds each key, and a reader that
keeps one shard open at a time.

A checkpoint is one of
- a file: `model.safetensors` (any name ending in .safetensors), or a torch file: a state dict, a Hugging Face
  `pytorch_model.bin`, or a Trainer checkpoint ({"state_dict": ...});
- a sharded index, `model.safetensors.index.json` or `pytorch_model.bin.index.json` ({"weight_map": {key: file}});
- a folder holding one of those names (safetensors preferred over .bin when both are there, as transformers does).

Nothing here reads tensor data up front: safetensors headers give dtypes and shapes, torch files are memory-mapped.
safetensors is imported only when a safetensors file is met.
"""
import json
import os

import torch

from tasktrain.checkpoint_io import CheckpointError, safe_load


class CheckpointIndexError(CheckpointError, ValueError):
    """A sharded index that is not one (a ValueError as before, and a CheckpointError as every unreadable file)."""

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
# In the order transformers looks for them in a folder.
FOLDER_NAMES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"),
                     ("U32", "uint32"), ("U64", "uint64"), ("C64", "complex64")):
    if hasattr(torch, _attr):
        _SAFETENSORS_DTYPES[_name] = getattr(torch, _attr)


def _safetensors():
    try:
        import safetensors
    except ImportError:
        raise ImportError("Reading .safetensors checkpoints needs the safetensors package: pip install safetensors "
                          "(it is a dependency of tasktrain; the environment seems to lack it).") from None
    return safetensors


def is_safetensors(path) -> bool:
    return os.fspath(path).endswith(".safetensors")


class Entry:
    """Where one checkpoint tensor is stored, and as what."""

    __slots__ = ("shard", "position", "dtype", "shape")

    def __init__(self, shard, position, dtype, shape):
        self.shard, self.position, self.dtype, self.shape = shard, position, dtype, tuple(shape)


def _torch_state_dict(path):
    """(state dict, memory-mapped?) of a torch file: a plain state dict or a Trainer checkpoint ({"state_dict": ...})."""
    # mapped unless the file is in torch's legacy (pre-1.6) format, which is read whole; a file holding code, or one
    # that cannot be read, is a CheckpointError naming it (issue 38)
    import zipfile

    loaded, mapped = safe_load(path, mmap=True), zipfile.is_zipfile(path)
    if isinstance(loaded, dict):
        for key in ("state_dict", "module"):
            if isinstance(loaded.get(key), dict):
                return loaded[key], mapped
        if all(isinstance(v, torch.Tensor) for v in loaded.values()):
            return loaded, mapped
    raise ValueError(f"Checkpoint {path!r} holds a {type(loaded).__name__} that is neither a state dict "
                     f"({{name: tensor}}) nor a checkpoint dict with a 'state_dict' or 'module' entry.")


class CheckpointFiles:
    """A checkpoint resolved to its shard files, with every key's shard, dtype and shape (no tensor data read)."""

    def __init__(self, checkpoint):
        self.path = os.fspath(checkpoint)
        self.shards = self._resolve(self.path)
        self.entries = {}   # key -> Entry, in shard order then file order
        for shard in self.shards:
            for position, (key, dtype, shape) in enumerate(self._describe(shard)):
                if key in self.entries:
                    raise ValueError(f"Checkpoint {self.path!r}: key '{key}' is stored twice, in "
                                     f"{self.entries[key].shard!r} and {shard!r}.")
                self.entries[key] = Entry(shard, position, dtype, shape)
        if self.index is not None:
            for key, shard in self.index.items():
                if key not in self.entries or self.entries[key].shard != shard:
                    raise ValueError(f"The index {self.path!r} says '{key}' is in {os.path.basename(shard)!r}, but "
                                     f"that file does not hold it: the index and its shards do not belong together.")

    def _resolve(self, path):
        """The shard files, in order; sets self.index ({key: shard path}) for an index file."""
        self.index = None
        if os.path.isdir(path):
            present = [name for name in FOLDER_NAMES if os.path.isfile(os.path.join(path, name))]
            if not present:
                others = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".bin", ".pt", ".ckpt",
                                                                             ".pth", ".index.json")))
                hint = (f" It holds {others[:6]}: pass the file you mean." if others else "")
                raise FileNotFoundError(f"Folder {path!r} holds no checkpoint: looked for {', '.join(FOLDER_NAMES)}."
                                        f"{hint}")
            path = os.path.join(path, present[0])
            self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Checkpoint {path!r} does not exist. Pass a .safetensors file, a torch file (a "
                                    f"state dict or a Trainer checkpoint), a sharded index (*.index.json), or a folder "
                                    f"holding {SAFE_WEIGHTS_NAME} or {WEIGHTS_NAME} (or their index).")
        if not path.endswith(".json"):
            return [path]
        try:
            with open(path) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise CheckpointIndexError(f"{path!r} is not a sharded checkpoint index: expected JSON with a 'weight_map' "
                                       f"{{key: shard file}}, as transformers writes.") from None
        folder = os.path.dirname(path)
        shards = []
        for name in weight_map.values():
            shard = os.path.join(folder, name)
            if shard not in shards:
                shards.append(shard)
        missing = [os.path.basename(s) for s in shards if not os.path.isfile(s)]
        if missing:
            raise FileNotFoundError(f"The index {path!r} names shard(s) {missing} that are not in {folder!r}: the "
                                    f"download or copy is incomplete.")
        self.index = {key: os.path.join(folder, name) for key, name in weight_map.items()}
        return shards

    def _describe(self, shard):
        """(key, dtype, shape) of every tensor of one shard, in the order the file lists them."""
        if is_safetensors(shard):
            with _safe_open(shard) as f:
                found = []
                for key in f.keys():
                    view = f.get_slice(key)
                    name = view.get_dtype()
                    if name not in _SAFETENSORS_DTYPES:
                        raise ValueError(f"{shard!r}: tensor '{key}' has dtype {name}, which this torch cannot hold.")
                    found.append((key, _SAFETENSORS_DTYPES[name], view.get_shape()))
                return found
        state_dict, _ = _torch_state_dict(shard)
        return [(key, t.dtype, t.shape) for key, t in state_dict.items()]

    def keys(self):
        return list(self.entries)


class ShardReader:
    """Tensors of a checkpoint, one shard open at a time: asking for a key of another shard closes the current one.

    A safetensors tensor is a view of the memory-mapped file; a torch file's are views of its mapping too (except in
    torch's legacy format, read whole). Either way nothing is resident until it is read.
    """

    def __init__(self, files: CheckpointFiles):
        self.files = files
        self.current = None
        self._handle = None
        self.mapped = True

    def get(self, key) -> torch.Tensor:
        shard = self.files.entries[key].shard
        if shard != self.current:
            self.close()
            if is_safetensors(shard):
                self._handle = _safe_open(shard)
                self.mapped = True
            else:
                self._handle, self.mapped = _torch_state_dict(shard)
            self.current = shard
        if is_safetensors(shard):
            return _unreadable_as_error(shard, self._handle.get_tensor, key)
        return self._handle[key]

    def close(self):
        self._handle, self.current = None, None


def read_state_dict(path) -> dict:
    """The state dict of one checkpoint file (safetensors, or torch: a state dict or a Trainer checkpoint), mapped
    from the file rather than read into memory where the format allows."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint {path!r} is not a file.")
    if is_safetensors(path):
        with _safe_open(path) as f:
            return {key: _unreadable_as_error(path, f.get_tensor, key) for key in f.keys()}
    return _torch_state_dict(path)[0]


def _safe_open(path):
    """safetensors' safe_open (a safe format: a JSON header and raw bytes), a damaged file a CheckpointError."""
    return _unreadable_as_error(path, _safetensors().safe_open, path, framework="pt")


def _unreadable_as_error(path, function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors' SafetensorError, OSError of a truncated map, ...
        raise CheckpointError(f"Checkpoint {os.fspath(path)!r} is truncated or corrupted and cannot be read "
                              f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}).") from None
