"""`lightning.pytorch.utilities.model_registry`: Lightning's client side of Lightning AI's model registry (through
the `litmodels` package). tasktrain has none: each function raises the error Trainer(model_registry=...) raises."""
from tasktrain.trainer.arguments import no_model_registry

__all__ = ["download_model_from_registry", "find_model_local_ckpt_path"]


def find_model_local_ckpt_path(ckpt_path, default_model_registry, default_root_dir):
    raise no_model_registry(f"find_model_local_ckpt_path({ckpt_path!r})")


def download_model_from_registry(ckpt_path, trainer):
    raise no_model_registry(f"download_model_from_registry({ckpt_path!r})")
