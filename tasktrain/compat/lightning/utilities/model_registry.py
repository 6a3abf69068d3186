"""`lightning.pytorch.utilities.model_registry`: Lightning's client side of Lightning AI's model registry. A
registry path is "registry", "registry:<name>", "registry:<name>:version:<v>" or "registry:version:<v>" (the
Trainer's `model_registry` name then); a downloaded model lives in `<default_root_dir>/<name>[_<v>]`. Finding the
local file needs nothing else; downloading needs the `litmodels` package, as in Lightning (ImportError without it)."""
import os
import re

from tasktrain.trainer.arguments import litmodels_installed

__all__ = ["download_model_from_registry", "find_model_local_ckpt_path"]


def _is_registry(text):
    """Whether `text` is a registry path: "registry" or "registry:..." in any case (a str only)."""
    return isinstance(text, str) and re.match(r"registry(:|$)", text.lower()) is not None


def _parse_registry_model_version(ckpt_path):
    """(name, version) of a registry path, each "" when not given; ValueError for anything else."""
    if not ckpt_path or not _is_registry(ckpt_path):
        raise ValueError(f"Invalid registry path: {ckpt_path}")
    parts = str(ckpt_path).split(":")
    name = parts[1] if len(parts) >= 2 and parts[1].lower() != "version" else ""
    version = ""
    if len(parts) == 3 and parts[1].lower() == "version":  # registry:version:<v>
        version = parts[2]
    elif len(parts) == 4 and parts[2].lower() == "version":  # registry:<name>:version:<v>
        version = parts[3]
    return name, version


def _determine_model_name(ckpt_path, default_model_registry):
    """"<name>[:<version>]" of a registry path, the name falling back on the Trainer's `model_registry`."""
    name, version = _parse_registry_model_version(ckpt_path)
    name = name or default_model_registry
    if not name:
        raise ValueError(f"Invalid model registry: '{ckpt_path}'")
    return f"{name}:{version}" if version else name


def _determine_model_folder(model_name, default_root_dir):
    """The folder a model is downloaded to: `<default_root_dir>/<model name with "/" and ":" as "_">`."""
    if not model_name:
        raise ValueError(f"Invalid model registry: '{model_name}'")
    return os.path.join(default_root_dir, model_name.replace("/", "_").replace(":", "_"))


def find_model_local_ckpt_path(ckpt_path, default_model_registry, default_root_dir):
    """The first `.ckpt` file (in listing order, as Lightning's) of the model's download folder; RuntimeError when
    the folder holds none."""
    model_name = _determine_model_name(ckpt_path, default_model_registry)
    folder = _determine_model_folder(model_name, default_root_dir)
    files = [name for name in os.listdir(folder) if name.endswith(".ckpt")]
    if not files:
        raise RuntimeError(f"Parsing files from downloaded model: {model_name}")
    return os.path.join(folder, files[0])


def download_model_from_registry(ckpt_path, trainer):
    """Local rank 0 downloads the model through litmodels into its folder (ImportError naming the package where it
    is not installed); then every rank meets at a barrier."""
    if trainer.local_rank == 0:
        if not litmodels_installed():
            raise ImportError("The `litmodels` package is not installed. Please install it with `pip install litmodels`.")
        from litmodels import download_model

        model_name = _determine_model_name(ckpt_path, trainer._model_registry)
        if not download_model(model_name, download_dir=_determine_model_folder(model_name, trainer.default_root_dir)):
            raise RuntimeError(f"Download model failed - {model_name}")
    trainer.strategy.barrier("download_model_from_registry")
