import contextlib
import functools
import logging
import os
import random
import warnings

import numpy as np
import torch

_SEED_VAR = "TASKTRAIN_GLOBAL_SEED"
_WORKERS_VAR = "TASKTRAIN_SEED_WORKERS"
_MAX_SEED = 2**32 - 1  # numpy's bound
log = logging.getLogger("tasktrain")


def seed_everything(seed=None, workers: bool = False, verbose: bool = True) -> int:
    """Seed python, numpy and torch (all devices), and remember the seed for the data order (Lightning's
    signature). seed=None: the seed a launcher passed on (TASKTRAIN_GLOBAL_SEED, or Lightning's PL_GLOBAL_SEED),
    else 0 with a warning. workers=True: the Trainer's loaders whose worker_init_fn is None get one that seeds
    each worker's torch, numpy and python from (the loader's base seed, worker id, rank), so no two workers of any
    rank draw alike. verbose: logs "Seed set to N" (prefixed with the rank under a launcher)."""
    if seed is None:
        name = _SEED_VAR if os.environ.get(_SEED_VAR) else "PL_GLOBAL_SEED"
        value = os.environ.get(name)
        if value is None:
            seed = 0
            if verbose:
                warnings.warn(f"No seed found, seed set to {seed}", stacklevel=2)
        else:
            try:
                seed = int(value)
            except ValueError:
                raise ValueError(f"Invalid seed specified via {name}: {value!r}") from None
    elif not isinstance(seed, int):
        seed = int(seed)
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"{seed} is not in bounds, numpy accepts from 0 to {_MAX_SEED}")
    if verbose:
        rank = next((os.environ[key] for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID") if key in os.environ), None)
        log.info(f"[rank: {rank}] Seed set to {seed}" if rank is not None else f"Seed set to {seed}")
    os.environ[_SEED_VAR] = str(seed)  # inherited by self-launched workers
    os.environ[_WORKERS_VAR] = str(int(bool(workers)))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def worker_init_function(worker_id: int, rank: int = 0) -> None:
    """A DataLoader worker's seeds after seed_everything(workers=True): torch gives each worker base seed +
    worker id; numpy and python get seeds derived from (base seed, worker id, rank), which torch leaves alone
    (so by default every worker's numpy draws alike)."""
    base = torch.initial_seed() - worker_id
    torch_seed, python_seed, numpy_seed = np.random.SeedSequence([base, worker_id, rank]).generate_state(3, np.uint64)
    torch.manual_seed(int(torch_seed))
    random.seed(int(python_seed))
    np.random.seed(int(numpy_seed) & 0xFFFFFFFF)


def add_worker_init_fn(loader, rank: int) -> None:
    """seed_everything(workers=True): give a loader with workers and no worker_init_fn worker_init_function."""
    if os.environ.get(_WORKERS_VAR) == "1" and getattr(loader, "num_workers", 0) > 0 and \
            getattr(loader, "worker_init_fn", 0) is None:
        loader.worker_init_fn = functools.partial(worker_init_function, rank=rank)


def get_seed() -> int:
    """The seed of the data order: seed_everything's, or one drawn from torch's generator (saved in checkpoints)."""
    if os.environ.get(_SEED_VAR):
        return int(os.environ[_SEED_VAR])
    return int(torch.initial_seed() % 2**31)


def sampler_seed() -> int:
    """The seed of the Trainer's data order, Lightning's (the seed its DistributedSampler gets): seed_everything's
    (TASKTRAIN_GLOBAL_SEED, or Lightning's PL_GLOBAL_SEED where a Lightning launcher set it), else 0, not a draw:
    a DDP run without seed_everything shuffles as Lightning's, the same order at every run."""
    value = os.environ.get(_SEED_VAR) or os.environ.get("PL_GLOBAL_SEED")
    return int(value) if value else 0


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


@contextlib.contextmanager
def isolate_rng(include_cuda: bool = True):
    """Put torch's, numpy's and python's global random states (CUDA's too, where include_cuda and CUDA is up)
    back as they were on entry when the block ends: what runs inside draws without moving what follows. The
    Trainer runs its sanity check so, as Lightning's: the validation loader built there and the steps run there do
    not change the training's random draws."""
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda = torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
