"""`lightning.pytorch.utilities.exceptions`: the core's MisconfigurationException under Lightning's path, and
SIGTERMException."""
from tasktrain.exceptions import MisconfigurationException

__all__ = ["MisconfigurationException", "SIGTERMException"]


class SIGTERMException(SystemExit):
    """Lightning's loops raise it after a SIGTERM so that Callback.on_exception can save a checkpoint. tasktrain's
    loop does not raise it: on SIGTERM the Trainer itself finishes the step, agrees the stop with every rank, saves
    <checkpoint dir>/preempted-epoch=E-step=S.ckpt and exits with a non-zero status saying how to resume
    (docs/checkpointing.md, Preemption). The class is here for scripts that name it."""
