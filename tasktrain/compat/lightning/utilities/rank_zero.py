"""Run or print on global rank 0 only (Lightning's `lightning.pytorch.utilities.rank_zero`).

`rank_zero_only.rank` is this process's global rank: read from the launcher's variables when this module is
imported (RANK, then LOCAL_RANK, SLURM_PROCID), and set by the Trainer when a run starts, so a function decorated
at import time of a user's script knows its rank in every process the launcher or the Trainer started.
"""
import functools
import logging
import warnings

from tasktrain.exceptions import LightningDeprecationWarning  # noqa: F401 - Lightning's name here
from tasktrain.strategies.environment import launcher_rank
from tasktrain.trainer.runtime import on_rank_known

log = logging.getLogger("tasktrain")


def rank_zero_only(fn=None, default=None):
    """`@rank_zero_only` on a function: it runs on global rank 0 and returns `default` (None) elsewhere."""
    if fn is None:
        return functools.partial(rank_zero_only, default=default)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if rank_zero_only.rank == 0:
            return fn(*args, **kwargs)
        return default

    return wrapped


rank_zero_only.rank = launcher_rank()
# set by every run's start (the Trainer tells the core, which tells its listeners)
on_rank_known(lambda rank: setattr(rank_zero_only, "rank", rank))


# Lightning's signatures and stack levels: a stacklevel names the same frame as under Lightning, whose functions
# reach logging / warnings through one more call (lightning_utilities' _info, _warn, rank_zero_warn) than these
@rank_zero_only
def rank_zero_info(*args, stacklevel=4, **kwargs):
    """logging.info on rank 0 (the "tasktrain" logger)."""
    log.info(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_debug(*args, stacklevel=4, **kwargs):
    log.debug(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_warn(message, stacklevel=4, **kwargs):
    """warnings.warn on rank 0: a warning every rank would print once per rank is printed once. category= in
    kwargs (UserWarning by default), as Lightning's."""
    kwargs.setdefault("category", UserWarning)
    warnings.warn(message, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_deprecation(message, stacklevel=5, **kwargs):
    kwargs.setdefault("category", LightningDeprecationWarning)  # (a DeprecationWarning, as Lightning's)
    warnings.warn(message, stacklevel=stacklevel - 2, **kwargs)
