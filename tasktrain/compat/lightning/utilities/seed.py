"""Lightning's `lightning.pytorch.utilities.seed`: isolate_rng, and the seeding functions a Lightning script imports
from `lightning.fabric.utilities.seed` (seed_everything, reset_seed)."""
import os

from tasktrain.trainer.seed import _SEED_VAR, _WORKERS_VAR, isolate_rng, seed_everything, worker_init_function

__all__ = ["isolate_rng", "pl_worker_init_function", "reset_seed", "seed_everything"]

pl_worker_init_function = worker_init_function  # what seed_everything(workers=True) gives the Trainer's loaders


def reset_seed():
    """Seed again with what seed_everything last set (nothing when it was never called)."""
    seed = os.environ.get(_SEED_VAR)
    if seed is not None:
        seed_everything(int(seed), workers=os.environ.get(_WORKERS_VAR) == "1", verbose=False)
