"""Lightning's `lightning.pytorch.utilities.combined_loader`: CombinedLoader and its modes (tasktrain/trainer/combined.py)."""
from tasktrain.trainer.combined import CombinedLoader

__all__ = ["CombinedLoader"]
