"""Lightning's `lightning.pytorch.core.saving` helpers for hyper-parameter files, under the rename rule
(`tasktrain.core.saving`): the core's own (tasktrain/trainer/hparams_files.py, which says how they match
Lightning's)."""
from tasktrain.trainer.hparams_files import (load_hparams_from_tags_csv, load_hparams_from_yaml,
                                             save_hparams_to_tags_csv, save_hparams_to_yaml)

__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml", "load_hparams_from_tags_csv", "save_hparams_to_tags_csv"]
