"""Utilities a Lightning user imports from `lightning.pytorch.utilities` (the same names here)."""
import torch

from tasktrain.compat.lightning.utilities.rank_zero import (rank_zero_debug, rank_zero_deprecation, rank_zero_info,
                                                         rank_zero_only, rank_zero_warn)
from tasktrain.compat.lightning.utilities.combined_loader import CombinedLoader
from tasktrain.strategies.base import move_to_device as _move_to_device
from tasktrain.trainer.module import AttributeDict, is_overridden

__all__ = ["AttributeDict", "CombinedLoader", "grad_norm", "is_overridden", "move_data_to_device", "rank_zero_debug",
           "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn"]


def move_data_to_device(batch, device):
    """Tensors in lists, tuples, dicts (and objects with their own .to) moved to `device`."""
    return _move_to_device(batch, torch.device(device))


def grad_norm(module, norm_type, group_separator="/"):
    """The p-norm of each parameter's gradient ("grad_2.0_norm/layer.weight") and of all of them together
    ("grad_2.0_norm_total"), for `self.log_dict(grad_norm(self, 2))` in on_before_optimizer_step."""
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"grad_norm(norm_type={norm_type}): use a positive number or 'inf'.")
    norms = {f"grad_{norm_type}_norm{group_separator}{name}": p.grad.detach().norm(norm_type)
             for name, p in module.named_parameters() if p.grad is not None}
    if norms:
        norms[f"grad_{norm_type}_norm_total"] = torch.stack(list(norms.values())).norm(norm_type)
    return norms
