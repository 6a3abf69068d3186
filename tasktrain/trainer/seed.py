import os
import random

import numpy as np
import torch

_SEED_VAR = "TASKTRAIN_GLOBAL_SEED"


def seed_everything(seed: int = 0) -> int:
    """Seed python, numpy and torch (all devices), and remember the seed for the data order."""
    seed = int(seed)
    os.environ[_SEED_VAR] = str(seed)  # inherited by self-launched workers
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


def get_seed() -> int:
    """The seed of the data order: seed_everything's, or one drawn from torch's generator (saved in checkpoints)."""
    if os.environ.get(_SEED_VAR):
        return int(os.environ[_SEED_VAR])
    return int(torch.initial_seed() % 2**31)
