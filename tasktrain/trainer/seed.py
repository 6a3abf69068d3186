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
        from tasktrain.strategies.environment import launcher_rank

        rank = launcher_rank(default=None)
        log.info(f"[rank: {rank}] Seed set to {seed}" if rank is not None else f"Seed set to {seed}")
    os.environ[_SEED_VAR] = str(seed)  # inherited by self-launched workers
    os.environ[_WORKERS_VAR] = str(int(bool(workers)))
    # and Lightning's names, which a Lightning script (or a library beside it) reads back
    os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"] = os.environ[_SEED_VAR], os.environ[_WORKERS_VAR]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def reset_seed() -> None:
    """Seed again with what seed_everything last set (nothing when it was never called): Lightning's reset_seed,
    which its distributed strategies call as each run sets up its processes (the Trainer's start of a stage)."""
    seed = os.environ.get(_SEED_VAR)
    if seed is not None:
        seed_everything(int(seed), workers=os.environ.get(_WORKERS_VAR) == "1", verbose=False)


def worker_init_function(worker_id: int, rank: int = None) -> None:
    """A DataLoader worker's seeds after seed_everything(workers=True), Lightning's pl_worker_init_function: torch,
    python and numpy each get a seed mixed from (the loader's base seed, worker id, rank), so no two workers of any
    rank draw alike and each draws what it draws under Lightning. rank None: this process's global rank."""
    if rank is None:
        rank = _process_rank()
    base = torch.initial_seed() - worker_id  # torch seeded this worker with base seed + worker id
    torch_seed, python_high, python_low = _mixed_seeds(base, worker_id, rank, 3)
    torch.manual_seed(torch_seed)
    random.seed((python_high << 32) | python_low)
    np.random.seed(np.random.SeedSequence([base, worker_id, rank]).generate_state(4))


def _mixed_seeds(base: int, worker_id: int, rank: int, count: int) -> list:
    """64-bit seeds from (base, worker, rank), as Lightning derives them (so the numbers match its workers'): the
    three packed into one word, spread by MurmurHash3's 64-bit finaliser, then stepped by Knuth's MMIX LCG."""
    mask = (1 << 64) - 1
    word = (base << 32) | (worker_id << 16) | rank
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        word ^= word >> 33
        word = (word * multiplier) & mask
    word ^= word >> 33
    seeds = []
    for _ in range(count):
        word = (word * 6364136223846793005 + 1) & mask
        seeds.append(word)
    return seeds


def _process_rank() -> int:
    """The global rank a launcher gave this process (Lightning's rank_zero_only.rank), 0 without one."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def add_worker_init_fn(loader, rank: int) -> None:
    """seed_everything(workers=True): give a loader without a worker_init_fn worker_init_function for this global
    rank (Lightning's rule, on every loader the Trainer is given, with workers or not)."""
    if os.environ.get(_WORKERS_VAR) == "1" and getattr(loader, "worker_init_fn", 0) is None:
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
    not change the training's random draws. Where the block raises, the states are left as the block left them, as
    Lightning's isolate_rng leaves them (it puts them back after its `yield` only, not in a `finally`): after a fit
    whose sanity check raised, a caller that catches the error draws from where the check left the generators."""
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda = torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else None
    yield
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
