"""Helpers the logger back-ends share: optional imports, hyper-parameter clean-up, metric prefixes, hparams.yaml,
and the scan of a ModelCheckpoint's files for the loggers that upload checkpoints (log_model)."""
import importlib
import os
from argparse import Namespace


def import_optional(module, extra, user):
    """Import an optional integration, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"{user} needs the `{module}` package, which tasktrain does not install by default. Install it with "
            f"`pip install 'tasktrain[{extra}]'` (or `pip install {module}`). ({err})"
        ) from err


def convert_params(params):
    """A dict from what users pass as hyper-parameters: a dict, an argparse Namespace, or None."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return dict(vars(params))
    return dict(params)


def hyperparameters_to_log(module, datamodule):
    """Lightning's choice of what the loggers get at a run's start: the hyper-parameters of the module and of the
    DataModule that called save_hyperparameters(logger=True), merged (a key in both with different values is
    Lightning's RuntimeError); None when neither did. The CLI's `_class_path` is left out; its `_instantiator` is
    logged, as Lightning 2.6's _log_hyperparams does (it filters `_class_path` alone)."""
    import torch

    own = getattr(module, "_log_hyperparams", False)
    data = datamodule is not None and getattr(datamodule, "_log_hyperparams", False)
    if own and data:  # (the values as saved: later changes to self.hparams are not logged, Lightning's rule)
        ours, theirs = dict(module.hparams_initial), dict(datamodule.hparams_initial)
        different = [key for key in ours.keys() & theirs.keys() if key != "_class_path" and (
            type(ours[key]) is not type(theirs[key])
            or (isinstance(ours[key], torch.Tensor) and ours[key] is not theirs[key]) or ours[key] != theirs[key])]
        if different:
            raise RuntimeError(f"Error while merging hparams: the keys {different} are present in both the "
                               "LightningModule's and LightningDataModule's hparams but have different values.")
        hparams = {**ours, **theirs}
    elif own:
        hparams = dict(module.hparams_initial)
    elif data:
        hparams = dict(datamodule.hparams_initial)
    else:
        return None
    return {k: v for k, v in hparams.items() if k != "_class_path"}


def flatten_dict(params, separator="/", prefix=""):
    """{"opt": {"lr": 0.1}} -> {"opt/lr": 0.1}: what the flat parameter stores (MLflow, TensorBoard) take."""
    flat = {}
    for key, value in params.items():
        name = f"{prefix}{separator}{key}" if prefix else str(key)
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, dict) and value:
            flat.update(flatten_dict(value, separator, name))
        else:
            flat[name] = value
    return flat


def sanitize_callables(params):
    """A callable hyper-parameter (a class, a function) is shown by its name, not its repr with an address."""
    clean = {}
    for key, value in params.items():
        if isinstance(value, dict):
            clean[key] = sanitize_callables(value)
        elif callable(value):
            clean[key] = getattr(value, "__name__", None) or repr(value)
        else:
            clean[key] = value
    return clean


def add_prefix(metrics, prefix, separator):
    if not prefix:
        return metrics
    return {f"{prefix}{separator}{key}": value for key, value in metrics.items()}


def scalar(value):
    """A metric value as a Python number when it holds one: tensors and numpy values of one element are read
    out; anything else (a longer tensor, which wandb shows as a histogram) is returned as it is."""
    if isinstance(value, (int, float, str)) or not hasattr(value, "item"):
        return value
    size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", None)
    return value.item() if size == 1 else value


# -- a log folder that may be a file system URL ("s3://...", "memory://..."): Lightning's file loggers write there
# through fsspec; a local path keeps the os calls (and needs no fsspec)
def remote_fs(path):
    """fsspec's file system for a file system URL (ImportError naming fsspec where it is missing), None for a local
    path."""
    from tasktrain.checkpoint_io import fsspec_filesystem, is_remote

    return fsspec_filesystem(path, "Log folder")[0] if is_remote(os.fspath(path)) else None


def isdir(path):
    fs = remote_fs(path)
    return fs.isdir(path) if fs else os.path.isdir(path)


def isfile(path):
    fs = remote_fs(path)
    return fs.isfile(path) if fs else os.path.isfile(path)


def listdir(path):
    """The names in a folder."""
    fs = remote_fs(path)
    if fs is None:
        return os.listdir(path)
    return [os.path.basename(entry.rstrip("/")) for entry in fs.ls(path, detail=False)]


def makedirs(path):
    fs = remote_fs(path)
    fs.makedirs(path, exist_ok=True) if fs else os.makedirs(path, exist_ok=True)


def remove(path):
    fs = remote_fs(path)
    fs.rm(path) if fs else os.remove(path)


def open_file(path, mode="r", **kwargs):
    fs = remote_fs(path)
    return fs.open(path, mode, **kwargs) if fs else open(path, mode, **kwargs)


def write_hparams_yaml(params, path):
    makedirs(os.path.dirname(path))
    if not params:
        with open_file(path, "w") as f:  # the common case needs no yaml import (~30 ms before the first step)
            f.write("{}\n")
        return
    import yaml

    with open_file(path, "w") as f:
        yaml.safe_dump(plain(dict(params)), f)


def plain(value):
    """What yaml.safe_dump takes: plain containers and scalars; anything else as its repr."""
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return repr(value)


def check_log_model(log_model, user):
    if log_model not in (True, False, "all"):
        raise ValueError(f"{user}(log_model={log_model!r}): use False (no upload), True (the checkpoints kept by "
                         "ModelCheckpoint, at the end of a successful fit) or 'all' (each checkpoint when saved).")


def checkpoints_to_log(checkpoint_callback, logged):
    """The checkpoints of a ModelCheckpoint that are not uploaded yet (or changed since): a list of
    (mtime, path, score, is_best), oldest first. `logged` maps path -> mtime of what was uploaded.

    Top-k files with their score, `last` (no score) and the best one; a path that no longer exists (evicted
    from the top k) is left out. Checkpoints that are folders (DeepSpeed) are included."""
    scores = dict(getattr(checkpoint_callback, "best_k_models", {}) or {})
    if getattr(checkpoint_callback, "monitor", None) is None:
        scores = {path: None for path in scores}  # without a monitor the "score" is the step: not a score
    last = getattr(checkpoint_callback, "last_model_path", "")
    if last:
        scores.setdefault(last, None)
    best = getattr(checkpoint_callback, "best_model_path", "")
    if best:  # without a monitor, the newest file (best_k_models stays empty, as in Lightning)
        scores.setdefault(best, None)
    found = []
    for path, score in scores.items():
        if not os.path.exists(path):
            continue
        mtime = os.path.getmtime(path)
        if path in logged and logged[path] >= mtime:
            continue
        found.append((mtime, path, score, path == best))
    return sorted(found)


def checkpoint_metadata(checkpoint_callback, path, score, section, keys=()):
    """An uploaded checkpoint's metadata, as Lightning's loggers write it: the score as a Python number (an int
    tensor's as an int), the file's name, and the callback's settings under `section` (W&B: the callback's class
    name; MLflow: "Checkpoint"), by Lightning's attribute names (`_every_n_train_steps`, and `keys` besides)."""
    settings = ("monitor", "mode", "save_last", "save_top_k", "save_weights_only", "_every_n_train_steps", *keys)
    return {
        "score": score.item() if hasattr(score, "item") else score,
        "original_filename": os.path.basename(path),
        section: {key: getattr(checkpoint_callback, key) for key in settings if hasattr(checkpoint_callback, key)},
    }
