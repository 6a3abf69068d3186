"""`lightning.pytorch.utilities.grads`: grad_norm."""
import torch

__all__ = ["grad_norm"]


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
