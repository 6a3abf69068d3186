"""Lightning's `lightning.pytorch.utilities.seed`: isolate_rng, and the seeding functions a Lightning script imports
from `lightning.fabric.utilities.seed` (seed_everything, reset_seed, pl_worker_init_function)."""
from tasktrain.trainer.seed import isolate_rng, reset_seed, seed_everything, worker_init_function

__all__ = ["isolate_rng", "pl_worker_init_function", "reset_seed", "seed_everything"]

pl_worker_init_function = worker_init_function  # what seed_everything(workers=True) gives the Trainer's loaders

