"""Checkpoint file I/O, a leaf module (it imports nothing of tasktrain but the version): strategies, callbacks,
the Trainer and the Accelerator all write and read checkpoints through it.

The format, atomic writes, safe loads, hard links and directory swaps, RNG capture and the explicit "last" pointer.

A checkpoint is a dict of tensors and plain containers only (so `torch.load(weights_only=True)` reads it). The
Trainer's file has exactly Lightning 2.6's top-level keys (scripts and tools written for Lightning read it), and
tasktrain's own keys under Lightning's loop-state key, "loops" (the parts of its run state,
tasktrain/trainer/run_state.py, which also lists the Accelerator's layout):

    epoch, global_step  int: trainer.current_epoch and trainer.global_step when it was written
    pytorch-lightning_version  str: LIGHTNING_LAYOUT_VERSION, the Lightning layout the file follows (tasktrain
                        0.1 wrote its own version there)
    state_dict          the module's state dict
    loops               tasktrain's own state (own_state(ckpt) reads it; user code need not), beside Lightning's:
        fit_loop, validate_loop, test_loop, predict_loop  Lightning's loop progress as its checkpoints keep it
                            (trainer.fit_loop.state_dict(), ...: Lightning's Trainer resumes the file from them;
                            tasktrain resumes from train_state)
        format_version      int, CHECKPOINT_FORMAT_VERSION
        tasktrain_version   str;  torch_version: str
        weights_only        bool: True means no training state, the file cannot resume a fit
        world_size          int: the number of processes that wrote it
        train_state         TrainState: epoch, global_step, batches_that_stepped (the loggers' step), batch_in_epoch,
                            samples_in_epoch, global_batch_size, data_seed, epoch_finished, epoch_validated,
                            epoch_started, stage;
                            drawn_order where an epoch's order was drawn as Lightning's RandomSampler draws it (one
                            process) or a loader has a generator of the user's, and the generator state its
                            workers' base seed was drawn from (tasktrain/trainer/data.py);
                            plateau_step_values (only where a metric-watching step scheduler's step is pending)
        optimizer_param_names  per optimizer, per param group, the names of its parameters (state dict keys)
        metrics             the in-epoch accumulators of self.log(on_epoch=True)
        rng_states          list, one per rank: {"python", "numpy", "torch", "cuda"}
        precision           (only in files upgraded from format 2: its precision plugin's state)
        deepspeed           (a DeepSpeed directory's state file) tag, ZeRO stage, world_size, key_prefix[, universal]
        fsdp                (an FSDP directory's state file) world_size, layout "dcp"[, converted_from]
        device_mesh         (ModelParallelStrategy's files) the mesh's sizes by dimension name
    -- unless weights-only:
    callbacks           {callback.state_key: callback.state_dict()} (those with a non-empty state)
    optimizer_states    list of optimizer state dicts
    lr_schedulers       list of scheduler state dicts
    <precision plugin's class __qualname__>   its state (GradScaler), only when non-empty
    -- only when non-empty:
    hyper_parameters    dict (save_hyperparameters); datamodule_hyper_parameters: the DataModule's
    <DataModule's class __qualname__>   its state_dict()

Files of formats 1 and 2 (tasktrain's keys at the top level) are read in this layout: load_checkpoint_file
upgrades them (upgrade_layout), as it moves the engine records (deepspeed, fsdp, device_mesh) that earlier files of
format 3 kept at the top level under "loops".
"""
import abc
import contextlib
import contextvars
import copy
import importlib
import json
import os
import pickle
import random
import re
import shutil
import sys
import threading
import time
import zipfile
from typing import Optional

import numpy as np
import torch

from tasktrain.version import __version__

# 2: the run state (tasktrain/trainer/run_state.py): the Trainer's and the Accelerator's files under one header and
# one versioned schema; files of format 1 still load (run_state.upgrade).
# 3: the Trainer's files in Lightning's top-level layout, tasktrain's own keys (the header included) under "loops"
# (OWN_KEYS); the Accelerator's layout is unchanged. Files of formats 1 and 2 are upgraded on load (upgrade_layout).
CHECKPOINT_FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
OWN_KEY = "loops"
# The Lightning release whose checkpoint layout the Trainer's files follow, written as their "pytorch-lightning_version"
# (the tasktrain version is loops.tasktrain_version): Lightning's loaders run their migrations on a file whose
# version is older than a migration's, and those before 2.0 rewrite the loop progress (a tasktrain version, 0.x,
# there made Lightning's Trainer fail to resume a tasktrain file). Files written with the tasktrain version still load.
LIGHTNING_LAYOUT_VERSION = "2.6.0"
# How an engine wrote a checkpoint (a DeepSpeed or FSDP directory's state file, a model-parallel file's mesh): among
# tasktrain's own keys too, so that the file's top level is Lightning's (files written before were upgraded on load)
ENGINE_KEYS = ("deepspeed", "fsdp", "device_mesh")
OWN_KEYS = ("format_version", "tasktrain_version", "torch_version", "weights_only", "world_size", "train_state",
            "optimizer_param_names", "metrics", "rng_states") + ENGINE_KEYS
# The restart record (restart_checkpoint): written only in a launch torch's elastic agent may restart; a run's
# folders otherwise hold what Lightning's hold (checkpoints, logs). Runs of earlier versions wrote it always (the
# visible name before that); `ckpt_path="last"` still reads it where no last checkpoint is found.
POINTER_NAME = ".last_checkpoint.json"
_OLD_POINTER_NAME = "last_checkpoint.json"


class CheckpointError(RuntimeError):
    pass


def is_remote(path):
    """Whether `path` is a file system URL other than file:// ("s3://...", "memory://..."), which Lightning writes
    and reads through fsspec; http(s) URLs are read-only checkpoints (torch.hub's download)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path):
    """A path as the local file system names it: "file:///x" is "/x" (fsspec's local URL, as Lightning takes it)."""
    path = os.fspath(path)
    return path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path


def atomic_save(obj, path: str):
    """Write to a temporary name, flush, fsync, then rename: a crash never leaves a partial file at `path`. A file
    system URL ("s3://...") is written through fsspec, as Lightning writes it: object stores make an object visible
    whole when its write closes."""
    path = local_path(path)
    if is_remote(path):
        fs, remote = fsspec_filesystem(path, "Checkpoint path")
        fs.makedirs(os.path.dirname(remote.rstrip("/")) or "/", exist_ok=True)
        try:
            with fs.open(remote, "wb") as f:
                torch.save(obj, f)
        except Exception as err:
            raise save_failure(err, obj, path) from err
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory)  # issue 38: the leftovers of writers killed during a save
    check_space(obj, path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        raise save_failure(err, obj, path) from err
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(directory)


def atomic_write_text(text: str, path: str):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# fit(..., weights_only=False) (Lightning's argument): the user vouches for the file, so its resume may unpickle
# any object; everything else loads weights-only.
_TRUSTED = contextvars.ContextVar("tasktrain_trusted_checkpoint", default=False)


@contextlib.contextmanager
def trusted_pickles(trusted=True):
    token = _TRUSTED.set(bool(trusted))
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def _torch_load(path, map_location, mmap):
    weights_only = not _TRUSTED.get()
    if mmap and zipfile.is_zipfile(path):
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=True)
    return torch.load(path, map_location=map_location, weights_only=weights_only)


def load_resumable_file(path, target):
    """A plain checkpoint file that can move to another strategy's layout with its optimizer state: the optimizer
    states and the names of their parameters (`optimizer_param_names`) must be in it. `target` names the fit the
    caller converts for, in the error ("a DeepSpeed fit")."""
    ckpt = load_checkpoint_file(path)
    own = own_state(ckpt)
    if own.get("weights_only") or not ckpt.get("optimizer_states") or not own.get("optimizer_param_names"):
        raise CheckpointError(
            f"{path!r} holds no optimizer state with the names of its parameters (a weights-only file, or one written "
            f"by an older tasktrain): there is nothing to convert for a resume. To start {target} from its weights, "
            "load them into the module before fit.")
    return ckpt


def load_checkpoint_file(path, map_location="cpu", mmap=False) -> dict:
    """torch.load with weights_only=True and errors that name the file and say what to do. mmap=True maps the
    file's tensors instead of reading them: a page is read (and held) only when a tensor is used, so a process that
    ignores the weights (an FSDP rank that gets its shard from rank 0) never holds them. Files in torch's old
    (pre-zip) format cannot be mapped: they are read whole."""
    path = os.fspath(path)
    if isinstance(path, str) and path.startswith(("http://", "https://")):
        return _load_url(path, map_location, mmap)
    path = local_path(path)  # a file:// URL is the local file (Lightning's fsspec)
    if is_remote(path):
        return _load_fsspec(path, map_location)
    if not os.path.exists(path):
        # (Lightning's words first: its TorchCheckpointIO's, what fit/validate/test(ckpt_path=...) raise there)
        raise FileNotFoundError(f"Checkpoint file not found: {path} (no file or directory {path!r} exists).")
    if os.path.isdir(path):
        raise CheckpointError(f"Checkpoint {path!r} is a directory (a DeepSpeed checkpoint?): load it with "
                              "Trainer(strategy='deepspeed...').fit(ckpt_path=...), or convert it into one file: "
                              "`tasktrain convert DIR run.ckpt --to ckpt` (resumable, optimizer state included) or "
                              "`tasktrain convert DIR model.ckpt` (the weights only).")
    ckpt = safe_load(path, "tasktrain", map_location, mmap)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"Checkpoint {path!r} holds a {type(ckpt).__name__}, not a checkpoint dict.")
    version = format_version(ckpt)
    if ("state_dict" in ckpt or "models" in ckpt) and version is not None and version not in READABLE_FORMAT_VERSIONS:
        raise CheckpointError(
            f"Checkpoint {path!r} has format version {version}, but this tasktrain ({__version__}) reads versions "
            f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))}. Load it with the tasktrain version that wrote it "
            f"({own_state(ckpt).get('tasktrain_version', 'unknown')}) and re-save the weights."
        )
    return upgrade_layout(ckpt)


def open_for_writing(path):
    """`path` opened to write bytes: a local file, or a file system URL ("s3://...") through fsspec, as Lightning's
    get_filesystem(path).open(path, "wb") (to_torchscript's file)."""
    path = local_path(path)
    if is_remote(path):
        fs, remote = fsspec_filesystem(path, "File path")
        return fs.open(remote, "wb")
    return open(path, "wb")


def fsspec_filesystem(url, what):
    """fsspec's file system and path for a URL ("s3://bucket/x.ckpt", "memory://x.ckpt"), as Lightning opens one;
    an ImportError naming the packages where fsspec (or the protocol's own package, s3fs for s3://) is missing."""
    try:
        import fsspec
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        raise ImportError(f"{what} {url!r} is a remote file system URL: reading it needs the fsspec package and the "
                          f"one of its protocol (`pip install fsspec`, and s3fs for s3://, gcsfs for gs://, adlfs for "
                          f"az://) ({err}). Install them, or copy the file to a local path.") from None


def _load_fsspec(url, map_location):
    """Lightning's load of a checkpoint at a file system URL (its pl_load opens it through fsspec): the file is
    copied into a temporary folder and read there with the same weights-only checks; errors name the URL."""
    import tempfile

    fs, remote = fsspec_filesystem(url, "Checkpoint")
    if not fs.exists(remote):
        raise FileNotFoundError(f"Checkpoint file not found: {url} (no file or directory {url!r} exists).")
    if fs.isdir(remote):
        raise CheckpointError(f"Checkpoint {url!r} is a directory: a remote checkpoint is read as one file; copy the "
                              "folder to a local path and load it from there.")
    with tempfile.TemporaryDirectory(prefix="tasktrain-remote-ckpt-") as folder:
        local = os.path.join(folder, os.path.basename(remote.rstrip("/")) or "checkpoint.ckpt")
        fs.get_file(remote, local)
        try:
            return load_checkpoint_file(local, map_location)
        except CheckpointError as err:
            raise CheckpointError(str(err).replace(local, url)) from None


def _load_url(url, map_location, mmap):
    """Lightning's load_from_checkpoint / ckpt_path take an http(s) URL: downloaded once into torch.hub's cache
    ($TORCH_HOME/hub/checkpoints/<the URL's file name>, where torch.hub.load_state_dict_from_url keeps it), then read
    as a local file, with the same checks and errors. A failed download, or a downloaded file that cannot be read,
    is an error naming the URL and what to do."""
    import http.client
    import urllib.error
    import urllib.parse

    cache = os.path.join(torch.hub.get_dir(), "checkpoints")
    name = os.path.basename(urllib.parse.urlparse(url).path)
    if not name:
        raise CheckpointError(f"Checkpoint {url!r} names no file (its path ends with '/'): give the URL of the "
                              "checkpoint file itself.")
    cached = os.path.join(cache, name)
    if not os.path.exists(cached):
        os.makedirs(cache, exist_ok=True)
        sys.stdout.write(f'Downloading: "{url}" to {cached}\n')  # (torch.hub's line)
        fix = ("Check the URL (open it in a browser or with curl), or download the file yourself and pass its local "
               "path.")
        try:  # (torch writes to a temporary file and renames it: a failed download leaves nothing in the cache)
            torch.hub.download_url_to_file(url, cached, progress=True)
        # the errors Lightning's download raises (torch.hub's: urllib's HTTPError, URLError), in words that name
        # the URL and the fix
        except urllib.error.HTTPError as err:
            what = "does not exist" if err.code in (404, 410) else "could not be downloaded"
            raise urllib.error.HTTPError(url, err.code, f"{err.reason}: checkpoint {url!r} {what}. {fix}",
                                         err.headers, None) from None
        except urllib.error.URLError as err:  # refused, unreachable
            raise urllib.error.URLError(
                f"checkpoint {url!r} could not be downloaded ({err.reason}). Check the network (and a proxy: "
                f"HTTPS_PROXY / HTTP_PROXY) or {fix[0].lower()}{fix[1:]}") from None
        except (OSError, http.client.HTTPException) as err:  # cut short
            detail = (str(err).splitlines() or [""])[0][:300]
            raise CheckpointError(f"Checkpoint {url!r} could not be downloaded ({type(err).__name__}: {detail}). "
                                  f"Check the network (and a proxy: HTTPS_PROXY / HTTP_PROXY) or {fix[0].lower()}"
                                  f"{fix[1:]}") from None
    try:
        return load_checkpoint_file(cached, map_location, mmap)
    except (CheckpointError, FileNotFoundError) as err:
        # a damaged copy left in the cache would be read again by every later load instead of a new download
        with contextlib.suppress(OSError):
            os.remove(cached)
        raise CheckpointError(
            f"Checkpoint {url!r}, downloaded to {cached!r}, cannot be loaded: {err} The downloaded copy was removed "
            "from torch.hub's cache, so the next load downloads it again: if the file at the URL is itself damaged, "
            "upload it again or use another checkpoint.") from None


# -- safe loading: what each layout may hold ------------------------------------------------------------------------
# Nothing in a checkpoint is code. Every file of every layout tasktrain reads is unpickled by torch's weights_only
# unpickler (tensors, numbers, strings, containers) with, beyond that, exactly the globals its layout needs, listed
# here and nowhere else; DCP's .metadata (a plain pickle) by an unpickler restricted to DCP's own metadata classes.
# Files an engine reads itself (DeepSpeed's load_checkpoint, its zero_to_fp32, DCP's reader) are checked here first.
ALLOWED_GLOBALS = {
    # Trainer checkpoints, our state files, accelerator_state.pt, 16-bit exports, HF .bin: plain data only
    "tasktrain": (),
    # DeepSpeed 0.19.8's engine files (ZeRO optim_states, universal checkpoints): its loss scaler object, its ZeRO
    # stage enum and the fragment addresses of the flat partitions
    "deepspeed": ("deepspeed.runtime.fp16.loss_scaler.LossScaler",
                  "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                  "deepspeed.runtime.zero.config.ZeroStageEnum",
                  "deepspeed.utils.tensor_fragment.fragment_address"),
    # Accelerate's random_states_N.pkl: numpy's generator state, an array of uint32
    "numpy": ("numpy.ndarray", "numpy.dtype", "numpy._core.multiarray._reconstruct",
              "numpy.core.multiarray._reconstruct", "numpy.dtypes.UInt32DType", "numpy.dtypes.Int64DType",
              "numpy.dtypes.Float64DType", "numpy.dtypes.Float32DType", "numpy.dtypes.Int32DType"),
}
# DCP's .metadata: torch.distributed.checkpoint's metadata records, the sizes, dtypes and layouts they hold, and the
# checkpoint_id path DCP stores in them
DCP_METADATA_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
})
_UNSUPPORTED = re.compile(r"GLOBAL ([\w.]+)")


def allowed_globals(layout):
    """The objects of ALLOWED_GLOBALS[layout] (importing their modules: deepspeed only for its own files). A name this
    installation lacks (numpy 1 vs 2 paths) is skipped."""
    found = []
    for qualified in ALLOWED_GLOBALS[layout]:
        module, _, name = qualified.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return found


def safe_load(path, layout="tasktrain", map_location="cpu", mmap=False):
    """torch.load(path, weights_only=True) with exactly the globals `layout` needs (ALLOWED_GLOBALS). A file that
    holds anything else, or that cannot be read (truncated, corrupted, not a torch file), raises CheckpointError
    naming the file (and the type it held) before anything in it runs. mmap=True maps the tensors instead of reading
    them (zip files; older ones are read whole): a check of a large file costs its pickle only."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint file {path!r} does not exist.")
    try:
        with torch.serialization.safe_globals(allowed_globals(layout)):
            return _torch_load(path, map_location, mmap)
    except pickle.UnpicklingError as err:
        found = _UNSUPPORTED.search(str(err))  # "Unsupported global: GLOBAL io.open was not an allowed global"
        if found:
            held = found.group(1)
            raise CheckpointError(
                f"Refusing to load checkpoint {path!r}: it holds a pickled {held}, which is not plain data (tensors, "
                "numbers, strings, lists, dicts) nor one of the types this kind of file holds, and unpickling it "
                "could run arbitrary code. Nothing of it was run. Only load files you trust: re-save the weights as "
                "a plain state dict, or resume with fit(..., weights_only=False).") from None
        raise _unreadable(path, err) from None
    except Exception as err:  # truncated or corrupted: zip, pickle and storage errors of every kind
        raise _unreadable(path, err) from None


def _unreadable(path, err):
    detail = (str(err).splitlines() or [""])[0][:300]
    return CheckpointError(f"Checkpoint {path!r} is truncated or corrupted and cannot be read ({type(err).__name__}: "
                           f"{detail}). Use an earlier checkpoint; tasktrain writes atomically, so the previous file of "
                           "a run is intact.")


def check_files(paths, layout):
    """A weights_only pass (tensors mapped, not read) over each file an engine's own loader will unpickle, before it
    does: a file that holds code, or cannot be read, is a CheckpointError naming it."""
    for path in paths:
        safe_load(path, layout, mmap=True)


class _DCPMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in DCP_METADATA_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def read_dcp_metadata(path):
    """DCP's .metadata, unpickled with DCP's metadata classes only (torch's own reader unpickles anything)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            metadata = _DCPMetadataUnpickler(f).load()
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        found = _UNSUPPORTED.search(str(err))
        if found:
            raise CheckpointError(
                f"Refusing to load {path!r}: it holds a pickled {found.group(1)}, which is not one of DCP's metadata "
                "records, and unpickling it could run arbitrary code. Nothing of it was run. Only load checkpoints "
                "you trust.") from None
        raise _unreadable(path, err) from None
    except Exception as err:
        raise _unreadable(path, err) from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path!r} holds a {type(metadata).__name__}, not DCP's Metadata: not a DCP checkpoint.")
    return metadata


def dcp_reader(directory):
    """A torch.distributed.checkpoint storage reader for `directory` that reads .metadata with read_dcp_metadata and
    checks each non-tensor item with safe_load's rules before DCP's planner unpickles it (DCP's own load_bytes uses
    weights_only=False); tensors DCP reads with weights_only=True itself. For dcp.load(..., storage_reader=) and
    _load_state_dict_from_keys: load_dcp / read_dcp below."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(self._get_metadata_path(kwargs.get("rank")))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            return super().read_data(plan, _CheckedBytes(planner, self))

    return SafeReader(directory)


class _CheckedBytes:
    """A DCP load planner whose load_bytes first checks the item the weights_only way (in memory: what is checked is
    what the planner then reads)."""

    def __init__(self, planner, reader):
        self._planner, self._reader = planner, reader

    def __getattr__(self, name):
        return getattr(self._planner, name)

    def load_bytes(self, read_item, value):
        where = os.path.join(str(self._reader.path), self._reader.storage_data[read_item.storage_index].relative_path)
        what = f"{where} (item {read_item.dest_index.fqn!r})"
        try:
            torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            found = _UNSUPPORTED.search(str(err))
            if found:
                raise CheckpointError(
                    f"Refusing to load {what}: it holds a pickled {found.group(1)}, which is not plain data, and "
                    "unpickling it could run arbitrary code. Nothing of it was run.") from None
            raise _unreadable(what, err) from None
        except Exception as err:
            raise _unreadable(what, err) from None
        value.seek(0)
        self._planner.load_bytes(read_item, value)


def _dcp_error(directory, err):
    """The CheckpointError of a failed DCP load: ours, from whichever rank raised it, or one naming the directory."""
    failures = getattr(err, "failures", None) or {}
    for failure in failures.values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    if failures:
        inner = next(iter(failures.values()))
        err = inner[0] if isinstance(inner, tuple) else inner
    return CheckpointError(f"The DCP checkpoint {os.fspath(directory)!r} is truncated or corrupted and cannot be read "
                           f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}). Use an earlier "
                           "checkpoint; the previous one of a run is intact.")


def load_dcp(state_dict, directory, **kwargs):
    """dcp.load(state_dict, checkpoint_id=directory, storage_reader=dcp_reader(directory), **kwargs), every failure a
    CheckpointError (DCP gathers every rank's failure, so every rank raises it)."""
    import torch.distributed.checkpoint as dcp

    # checked first: DCP falls back to other metadata files when .metadata fails, and wraps the error in its own
    read_dcp_metadata(os.path.join(directory, ".metadata"))
    try:
        dcp.load(state_dict, checkpoint_id=directory, storage_reader=dcp_reader(directory), **kwargs)
    except CheckpointError:
        raise
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise _dcp_error(directory, err) from None


def read_dcp(directory, keys=None):
    """The entries `keys` of a DCP checkpoint, whole, in this process (no process group needed), read safely."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    read_dcp_metadata(os.path.join(directory, ".metadata"))  # first: as in load_dcp
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            return _load_state_dict_from_keys(keys, storage_reader=dcp_reader(directory))
    except CheckpointError:
        raise
    except BaseException as err:
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise _dcp_error(directory, err) from None


# -- failed saves and leftovers -------------------------------------------------------------------------------------
# A save that cannot complete says why (no space: how much it needed and how much was free) and leaves the previous
# files as they were; the temporary file of a writer that died (`<name>.tmp-<pid>`, its pid no longer running on
# this machine, and not written to for STALE_AFTER seconds: a writer on another machine of a shared file system keeps
# writing its file) is removed by the next save into the same folder, a live writer's (a background save) never.
_TEMPORARY = re.compile(r"\.tmp-(\d+)$")
STALE_AFTER = 60.0


def free_bytes(directory):
    """The disk-usage probe: bytes free to this user in `directory`'s file system."""
    return shutil.disk_usage(directory).free


def state_bytes(obj, _seen=None):
    """The bytes of the tensor storages in `obj`, each storage once (what a torch.save of it writes, less a small
    pickle)."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "meta":
            return 0
        storage = obj.untyped_storage()
        key = (obj.device, storage.data_ptr(), storage.nbytes())
        if key in seen:  # tied weights, views: written once
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(state_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v, seen) for v in obj)
    return 0


def _megabytes(n):
    return f"{n / 2**20:.1f} MiB"


def check_space(obj, path):
    """Refuse, before writing anything, a save whose tensors alone do not fit in the free space of `path`'s disk."""
    directory = os.path.dirname(os.path.abspath(path))
    needed, free = state_bytes(obj), free_bytes(directory)
    if needed > free:
        raise CheckpointError(f"Not enough disk space to save {path!r}: it needs at least {_megabytes(needed)} and "
                              f"{directory} has {_megabytes(free)} free. Nothing was written; the previous "
                              "checkpoints are as they were. Free space there (or save elsewhere) and save again.")


def save_failure(err, obj, path):
    """The error to raise for a write of `obj` to `path` that failed with `err`: a full disk said in its own words
    (torch's own says `unexpected pos ...`, the cause only in the chain), anything else as it was."""
    import errno

    full = (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(err, RuntimeError) and ("unexpected pos" in str(err) or "No space left" in str(err)))
    if not full:
        return err
    directory = os.path.dirname(os.path.abspath(path))
    try:
        free = _megabytes(free_bytes(directory))
    except OSError:
        free = "unknown"
    return CheckpointError(f"No space left on the disk of {path!r}: the checkpoint needs at least "
                           f"{_megabytes(state_bytes(obj))} and {directory} has {free} free. The partial file was "
                           "removed; the previous checkpoints are as they were. Free space there (or save elsewhere) "
                           "and save again.")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_temporaries(directory):
    """Remove the `*.tmp-<pid>` files (or folders) that writers which no longer run (killed during a save) left in
    `directory`; this process's own, those of live processes (a background write in flight) and those written to in
    the last STALE_AFTER seconds stay. Returns what was removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        found = _TEMPORARY.search(name)
        if found is None:
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(directory, name)
        try:
            if time.time() - os.lstat(path).st_mtime < STALE_AFTER:
                continue
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


# -- names under torch.compile ------------------------------------------------------------------------------------
# `torch.compile(submodule)` returns a wrapper that holds the submodule as its child "_orig_mod", so a module that
# keeps a compiled submodule (`self.model = torch.compile(GPT())`) has state-dict keys like "model._orig_mod.wte.weight".
# Checkpoints store the plain names ("model.wte.weight"): the same file then loads into the model compiled or not.
COMPILED_NAME = "_orig_mod"


def plain_state_dict(state_dict):
    """The state dict with every "_orig_mod." segment of its keys removed (the dict itself when there is none)."""
    if not any(COMPILED_NAME in key for key in state_dict):
        return state_dict
    return _renamed(state_dict, plain_name)


def load_plain_state_dict(module, state_dict, strict=True):
    """module.load_state_dict for a state dict with plain names, into a module that may hold compiled submodules."""
    return module.load_state_dict(compiled_state_dict(module, state_dict), strict=strict)


def compiled_state_dict(module, state_dict):
    """The state dict with plain names renamed to `module`'s own (with "_orig_mod." where it holds compiled
    submodules), for loaders other than module.load_state_dict (FSDP's set_model_state_dict)."""
    names = {plain_name(name): name for name, _ in module.named_modules() if COMPILED_NAME in name}
    if names:
        # "model.wte.weight" -> "model._orig_mod.wte.weight": the longest compiled module name that is a prefix.
        def compiled_name(key):
            parts = key.split(".")
            for cut in range(len(parts), 0, -1):
                owner = ".".join(parts[:cut])
                if owner in names:
                    return ".".join([names[owner], *parts[cut:]])
            return key

        state_dict = _renamed(state_dict, compiled_name)
    return state_dict


def plain_name(key):
    return ".".join(part for part in key.split(".") if part != COMPILED_NAME)


def _renamed(state_dict, rename):
    out = type(state_dict)((rename(key), value) for key, value in state_dict.items())
    metadata = getattr(state_dict, "_metadata", None)  # per-module versions, keyed by module name
    if metadata is not None:
        out._metadata = type(metadata)((rename(key), value) for key, value in metadata.items())
    return out


# -- RNG ----------------------------------------------------------------------------------------------------------
def collect_rng_states() -> dict:
    np_state = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict):
    random.setstate(_as_tuple(states["python"]))
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


# -- the restart record ---------------------------------------------------------------------------------------------
def write_last_pointer(root_dir: str, checkpoint_path: str, global_step: int, epoch: int):
    """Record `checkpoint_path` (complete, resumable) as the newest of this root dir and launch."""
    pointer = os.path.join(root_dir, POINTER_NAME)
    record = {"path": os.path.abspath(checkpoint_path), "global_step": global_step, "epoch": epoch,
              "run_id": launch_run_id()}
    atomic_write_text(json.dumps(record), pointer)


def record_for_restarts(root_dir: str, checkpoint_path: str, global_step: int, epoch: int):
    """write_last_pointer in a launch that torch's elastic agent may restart (restart_checkpoint reads it there);
    elsewhere nothing: no file beside the user's checkpoints that Lightning would not write."""
    if restarts_possible():
        write_last_pointer(root_dir, checkpoint_path, global_step, epoch)


def read_last_record(root_dir: str):
    """The pointer's record ({"path", "global_step", "epoch", "run_id"}), or None when there is none or its
    checkpoint is gone."""
    for name in (POINTER_NAME, _OLD_POINTER_NAME):  # a run of an earlier version wrote the visible name
        pointer = os.path.join(root_dir, name)
        if os.path.exists(pointer):
            try:
                with open(pointer) as f:
                    record = json.load(f)
                found = os.path.exists(record["path"])
            except (ValueError, TypeError, KeyError) as err:  # (bad JSON or bytes, not a {"path": ...} record)
                raise CheckpointError(
                    f"{pointer} is not a readable last-checkpoint record ({type(err).__name__}: {err}). It only "
                    "records which checkpoint an earlier tasktrain run saved last (no checkpoint is lost without "
                    f"it): delete {pointer}, and pass the checkpoint to resume from as ckpt_path=<its file>."
                ) from err
            return record if found else None
    return None


def read_last_pointer(root_dir: str):
    record = read_last_record(root_dir)
    return None if record is None else record["path"]


# -- links and directories ----------------------------------------------------------------------------------------
def atomic_link(src: str, dst: str):
    """Make `dst` hold `src`'s bytes (a hard link, a copy where links fail), replacing `dst` in one rename."""
    src, dst = local_path(src), local_path(dst)
    if is_remote(src) or is_remote(dst):  # a file system URL: fsspec's copy (Lightning's save writes it again)
        fs, remote_dst = fsspec_filesystem(dst, "Checkpoint path")
        fs.copy(fsspec_filesystem(src, "Checkpoint path")[1], remote_dst)
        return
    tmp = f"{dst}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def link_or_copy(src: str, dst: str):
    """copytree's copy_function: a hard link where the file system allows, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_tree(src: str, dst: str):
    """Make directory `dst` a tree of hard links to `src`'s files, replacing `dst` in one rename."""
    tmp = f"{dst}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=link_or_copy)
    replace_dir(tmp, dst)


def replace_dir(src: str, dst: str):
    """Rename directory `src` to `dst`, replacing what is there (the old one is removed once the new is in place)."""
    old = None
    if os.path.lexists(dst):
        old = f"{dst}.old-{os.getpid()}"
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)


def remove_path(path: str):
    """Remove a checkpoint, a file or a directory, if it is there."""
    path = local_path(path)
    if is_remote(path):
        fs, remote = fsspec_filesystem(path, "Checkpoint path")
        if fs.exists(remote):
            fs.rm(remote, recursive=True)
        return
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def format_header() -> dict:
    """The keys that say which format a file has, written by which tasktrain and torch: under "loops" in the
    Trainer's files, at the top level in the Accelerator's."""
    return {"format_version": CHECKPOINT_FORMAT_VERSION, "tasktrain_version": __version__,
            "torch_version": str(torch.__version__)}


def own_state(ckpt: dict) -> dict:
    """tasktrain's own keys of a checkpoint dict (OWN_KEYS): ckpt["loops"] in a Trainer file of format 3, the dict
    itself in the Accelerator's layout (and in a Trainer file of format 1 or 2 not upgraded yet)."""
    loops = ckpt.get(OWN_KEY)
    return loops if isinstance(loops, dict) and "format_version" in loops else ckpt


def format_version(ckpt: dict):
    """The file's format version (None: none recorded: format 1, or not a tasktrain file)."""
    return own_state(ckpt).get("format_version")


def upgrade_layout(ckpt: dict) -> dict:
    """A Trainer checkpoint of format 1 or 2 (tasktrain's keys at the top level) in format 3's layout: Lightning's
    top-level keys, tasktrain's under "loops" (a format 2 file's precision state there as "precision": the plugin
    class that wrote it is not recorded). Any other dict (a current file, the Accelerator's, a Lightning or plain
    state-dict file, which has no train state) is returned as it is."""
    if OWN_KEY in ckpt:
        return _engine_keys_under_loops(ckpt)
    if "state_dict" not in ckpt or not isinstance(ckpt.get("train_state"), dict):
        return ckpt  # (a train_state that is not a dict: not a Trainer file; the resume refuses it by name)
    out = {"epoch": ckpt.get("epoch", ckpt["train_state"].get("epoch", 0)),
           "global_step": ckpt.get("global_step", ckpt["train_state"].get("global_step", 0)),
           "pytorch-lightning_version": ckpt.get("tasktrain_version", "unknown")}
    loops = {"format_version": ckpt.get("format_version", 1)}
    for key, value in ckpt.items():
        if key in OWN_KEYS:
            loops[key] = value
        elif key == "precision":
            if value:
                loops["precision"] = value
        elif key not in ("hyper_parameters", "datamodule_hyper_parameters") or value:
            out[key] = value
    out[OWN_KEY] = loops
    return out


def _engine_keys_under_loops(ckpt: dict) -> dict:
    """A format 3 Trainer file written before the engine records moved under "loops" (ENGINE_KEYS at its top level):
    in today's layout. Anything else is returned as it is."""
    loops = ckpt.get(OWN_KEY)
    moved = [key for key in ENGINE_KEYS if key in ckpt]
    if not moved or not isinstance(loops, dict) or "format_version" not in loops:
        return ckpt
    out = {key: value for key, value in ckpt.items() if key not in moved}
    out[OWN_KEY] = {**loops, **{key: ckpt[key] for key in moved}}
    return out


def with_own(ckpt: dict, **entries) -> dict:
    """`ckpt` with `entries` among tasktrain's own keys (own_state): under "loops" in a Trainer file, at the top level
    of the Accelerator's layout. A shallow copy: the caller's dict is left as it is."""
    loops = ckpt.get(OWN_KEY)
    if isinstance(loops, dict) and "format_version" in loops:
        return dict(ckpt, **{OWN_KEY: dict(loops, **entries)})
    return dict(ckpt, **entries)


def without_own(ckpt: dict, *keys) -> dict:
    """`ckpt` without tasktrain's own `keys` (wherever the layout keeps them): a shallow copy."""
    out = {key: value for key, value in ckpt.items() if key not in keys}
    loops = out.get(OWN_KEY)
    if isinstance(loops, dict) and "format_version" in loops:
        out[OWN_KEY] = {key: value for key, value in loops.items() if key not in keys}
    return out


def weights_file(ckpt: dict, state_dict: dict, **own) -> dict:
    """A weights-only checkpoint (format 3's layout) of the module `state_dict`, with the counters, train state and
    hyper-parameters of `ckpt` (a Trainer checkpoint: {} where there is none); `own`: more of tasktrain's keys."""
    loops = own_state(ckpt)
    train_state = loops.get("train_state", {})
    out = {"epoch": ckpt.get("epoch", train_state.get("epoch", 0)),
           "global_step": ckpt.get("global_step", train_state.get("global_step", 0)),
           "pytorch-lightning_version": LIGHTNING_LAYOUT_VERSION, "state_dict": state_dict,
           OWN_KEY: {**format_header(), "weights_only": True, "train_state": train_state, **own}}
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        if ckpt.get(key):
            out[key] = ckpt[key]
    return out


# -- restarts (torch.distributed.run --max-restarts) ------------------------------------------------------------------
def launch_run_id():
    """The id of the launch this process belongs to: torchrun's rendezvous id (TORCHELASTIC_RUN_ID, the same for
    every restart of one launch), or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return run_id if run_id and run_id != "none" else None


def restarts_possible() -> bool:
    """True in a worker of a launch that torch's elastic agent restarts after a failure (--max_restarts > 0)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0


def restart_count() -> int:
    """How many times torch's elastic agent has restarted this launch's workers (0: the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restart_checkpoint(root_dir: str, ckpt_path):
    """What `fit(ckpt_path=...)` resumes from in a worker that torch's elastic agent restarted after a failure
    (TORCHELASTIC_RESTART_COUNT > 0): the newest complete checkpoint this launch recorded under root_dir (the
    "last" pointer, written only once every rank's files are complete), whatever ckpt_path says; when this launch
    has recorded none yet, ckpt_path as given (None: from scratch, as the first start did). On the first start the
    rule does nothing: ckpt_path as given. A pointer left by another launch (another run id) is not this run's."""
    if restart_count() == 0:
        return ckpt_path
    record = read_last_record(root_dir)
    if record is None or record.get("run_id") != launch_run_id():
        return ckpt_path
    return record["path"]


# -- asynchronous saves --------------------------------------------------------------------------------------------
# The training step waits only while the state is copied off the training tensors (staged into CPU memory); a
# background thread writes the copy, and the checkpoint becomes "last" only once every rank's files are complete.
# One write at a time per process: a save that finds one in flight waits for it first, so at most one staged copy of
# the state exists per rank.
DONE_MARK = ".done-rank{}"
MARK_TIMEOUT = 1800.0  # seconds rank 0 waits for the other ranks' parts of one checkpoint


def stage_to_cpu(obj, reuse=None):
    """A copy of `obj` that shares no tensor with it: every tensor copied into CPU memory, containers rebuilt, plain
    values (numbers, strings) kept. What training does next cannot change it.

    reuse: the copy a previous call returned (its write complete): tensors of the same shape and dtype at the same
    place are copied into, not allocated again, so that a run holds one staging copy of its state and a save does
    not pay for fresh memory (first-touch page faults cost as much as the copy itself here)."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        if (isinstance(reuse, torch.Tensor) and reuse.shape == tensor.shape and reuse.dtype == tensor.dtype
                and reuse.device.type == "cpu" and reuse.layout == tensor.layout == torch.strided
                and reuse.is_contiguous() and type(tensor) is torch.Tensor):
            return reuse.copy_(tensor)
        if tensor.device.type == "cpu":
            return tensor.clone()
        return tensor.to("cpu", copy=True)
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        try:
            out = type(obj)((k, stage_to_cpu(v, old.get(k))) for k, v in obj.items())
        except TypeError:  # a dict subclass that cannot be built from pairs (defaultdict): a plain dict
            out = {k: stage_to_cpu(v, old.get(k)) for k, v in obj.items()}
        metadata = getattr(obj, "_metadata", None)  # a state dict's per-module versions
        if metadata is not None:
            out._metadata = type(metadata)(metadata)
        return out
    if isinstance(obj, (list, tuple)):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else [None] * len(obj)
        values = [stage_to_cpu(v, r) for v, r in zip(obj, old)]
        if isinstance(obj, list):
            return values
        if all(a is b for a, b in zip(values, obj)):
            return obj  # nothing mutable inside (torch.Size, a tuple of numbers): the same object
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, torch.dtype, torch.device)):
        return obj
    return copy.deepcopy(obj)  # another object (an engine's loss scaler): a copy that training cannot change


def fsync_save(obj, path):
    """torch.save to `path`, flushed to the disk (no rename: for files inside a directory renamed later)."""
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except Exception as err:
        raise save_failure(err, obj, path) from err


def mark_done(directory, rank):
    """Say that this rank's files in `directory` are complete and flushed (rank 0 commits once all say so)."""
    _fsync_dir(directory)
    atomic_write_text("", os.path.join(directory, DONE_MARK.format(rank)))


def wait_for_marks(directory, world_size, timeout=MARK_TIMEOUT):
    """Rank 0: wait until every rank has marked its part of `directory` done, then remove the marks.

    In a CheckpointWriter's thread, once this process has received a SIGTERM since the write started (a launcher
    stopping the survivors of a rank that died, or a pre-emption), the wait goes on only while the
    checkpoint's files still change: once nothing in `directory` has changed for GIVE_UP_QUIET seconds, a missing
    part will not come (its rank is dead) and the write ends with an error; the checkpoint is not made 'last'. A live
    rank still writing its part keeps the wait going."""
    deadline = time.monotonic() + timeout
    marks = [os.path.join(directory, DONE_MARK.format(rank)) for rank in range(world_size)]
    signals_at_start = getattr(threading.current_thread(), "sigterms_at_start", None)
    seen, quiet_since = None, None
    while not all(os.path.exists(m) for m in marks):
        missing = [r for r, m in enumerate(marks) if not os.path.exists(m)]
        if signals_at_start is not None and _sigterms[0] != signals_at_start:
            now = _tree_state(directory)
            if now != seen:
                seen, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since > GIVE_UP_QUIET:
                raise CheckpointError(f"{directory}: given up waiting for ranks {missing} to write their part (a "
                                      f"SIGTERM came, and nothing was written for {GIVE_UP_QUIET:.0f} s); the "
                                      "checkpoint is not complete and was not made 'last'.")
        if time.monotonic() > deadline:
            raise CheckpointError(f"{directory}: ranks {missing} did not finish writing their part within "
                                  f"{timeout:.0f} s; the checkpoint is not complete and was not made 'last'.")
        time.sleep(0.02)
    for m in marks:
        os.remove(m)


GIVE_UP_QUIET = 5.0  # seconds without a change in a checkpoint's files after which a told-to-give-up wait ends


def _tree_state(directory):
    """(path, size, mtime) of every file under `directory`: what changes while some rank still writes its part."""
    state = []
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:  # renamed or removed meanwhile: it changed
                continue
            state.append((root, name, st.st_size, st.st_mtime_ns))
    return sorted(state)


# SIGTERMs this process received (the Trainer's handler counts them: note_sigterm). A background write that sees one
# arrive gives up on parts that stopped coming (wait_for_marks).
_sigterms = [0]


def note_sigterm():
    _sigterms[0] += 1


class CheckpointWriter:
    """One background checkpoint write at a time, in a thread of this process.

    start(write, what) runs write() in the thread (after waiting for the previous one); wait() blocks until the
    write in flight is done and raises its error, if it had one, in the caller. The thread is not a daemon: a
    script that ends while a write is in flight still ends with the file complete."""

    def __init__(self):
        self._thread = None
        self._error = None
        self._what = None
        self.completed = 0  # writes finished without error (for tests and benchmarks)
        # the staging copies of the previous save, by file (stage_to_cpu(..., reuse=)): one copy of the state, kept
        self.staged = {}

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, write, what):
        self.wait()
        self._what, self._error = what, None
        self._thread = threading.Thread(target=self._run, args=(write,), name="tasktrain-checkpoint-writer")
        self._thread.sigterms_at_start = _sigterms[0]  # (wait_for_marks)
        self._thread.start()

    def _run(self, write):
        try:
            write()
            self.completed += 1
        except BaseException as err:  # raised again in the training thread, at wait()
            self._error = err
            print(f"[tasktrain] the background write of {self._what} failed: {type(err).__name__}: {err}",
                  file=sys.stderr, flush=True)

    def wait(self):
        """Block until the write in flight is done; raise its error. (The join wakes up every 50 ms so that a
        SIGTERM's handler runs in this thread while it waits: the write then gives up on parts of dead ranks.)"""
        thread, self._thread = self._thread, None
        if thread is not None:
            while thread.is_alive():
                thread.join(timeout=0.05)
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f"The background write of {self._what} failed ({type(error).__name__}: {error}); "
                                  "it was not made 'last', the previous checkpoint is. Check the disk (space, "
                                  "permissions) and the error above.") from error


# -- CheckpointIO: Lightning's plugin interface for writing, reading and removing one checkpoint file ---------------
class CheckpointIO(abc.ABC):
    """How a strategy that writes one file per checkpoint (single device, DDP) saves, loads and removes it
    (`strategy.checkpoint_io`, Lightning's plugin interface; `Trainer(plugins=[MyIO()])`). Subclass it and implement
    the three methods; rank 0 calls save_checkpoint(checkpoint, path, storage_options=...) and
    remove_checkpoint(path), every rank calls load_checkpoint(path, weights_only=...). Strategies whose engines write
    sharded directories (DeepSpeed, FSDP) refuse a CheckpointIO of the user's."""

    @abc.abstractmethod
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        raise NotImplementedError(f"{type(self).__name__}.save_checkpoint(checkpoint, path, storage_options=None)")

    @abc.abstractmethod
    def load_checkpoint(self, path, map_location=None, weights_only=None):
        raise NotImplementedError(f"{type(self).__name__}.load_checkpoint(path, map_location=None, weights_only=None)")

    @abc.abstractmethod
    def remove_checkpoint(self, path):
        raise NotImplementedError(f"{type(self).__name__}.remove_checkpoint(path)")

    def teardown(self):
        """The end of a run (strategy.teardown): release what the plugin holds. Default: nothing."""


class TorchCheckpointIO(CheckpointIO):
    """tasktrain's own file I/O as a CheckpointIO (every strategy's default): atomic writes, weights_only loads,
    the format checks of load_checkpoint_file."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if storage_options is not None:  # (Lightning's words)
            raise TypeError("`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is not "
                            f"supported for `{type(self).__name__}`. Please implement your custom `CheckpointIO` to "
                            "define how you'd like to use `storage_options`.")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        # A tasktrain checkpoint never needs unpickling code: None / True read tensors and plain data only (or what
        # the run trusts: fit's weights_only=False); weights_only=False, Lightning's, trusts this file's pickles
        trusted = trusted_pickles() if weights_only is False else contextlib.nullcontext()
        with trusted:
            return load_checkpoint_file(path, map_location="cpu" if map_location is None else map_location)

    def remove_checkpoint(self, path):
        remove_path(os.fspath(path))


class AsyncCheckpointIO(CheckpointIO):
    """Lightning's AsyncCheckpointIO: save_checkpoint returns once the checkpoint is copied into CPU memory; the
    wrapped CheckpointIO (default TorchCheckpointIO) writes it in a background thread, one write at a time
    (CheckpointWriter). A write's error is raised at the next save, load, removal or at teardown. Loads and removals
    wait for the write in flight first, so they never see a file half written."""

    def __init__(self, checkpoint_io: Optional["CheckpointIO"] = None):
        self.checkpoint_io = checkpoint_io
        self._writer = CheckpointWriter()

    @property
    def _io(self):
        return self.checkpoint_io if self.checkpoint_io is not None else TorchCheckpointIO()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        io = self._io
        staged = stage_to_cpu(checkpoint)  # training may change the tensors as soon as this returns
        self._writer.start(lambda: io.save_checkpoint(staged, path, storage_options=storage_options), path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        self._writer.wait()
        return self._io.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path):
        self._writer.wait()
        self._io.remove_checkpoint(path)

    def teardown(self):
        self._writer.wait()
        self._io.teardown()
