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


def derive_rank_seed(seed: int, global_step: int, rank: int) -> int:
    """A seed for a rank that a checkpoint has no random state for (a resume on more processes than wrote it):
    a function of (seed, global step, rank) only, so that the resumed run is the same each time it is resumed."""
    return int(np.random.SeedSequence([int(seed) % 2**63, int(global_step), int(rank)]).generate_state(1)[0])


def seed_rank_streams(seed: int, global_step: int, rank: int) -> int:
    """Seed python, numpy and torch (all devices) from derive_rank_seed; returns the seed used. Unlike
    seed_everything, the data-order seed is left as it is."""
    derived = derive_rank_seed(seed, global_step, rank)
    random.seed(derived)
    np.random.seed(derived % 2**32)
    torch.manual_seed(derived)
    return derived
