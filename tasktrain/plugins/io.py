"""Lightning's checkpoint I/O plugins under their names (`from tasktrain.plugins.io import CheckpointIO`): one
checkpoint file's save, load and removal, tasktrain/checkpoint_io.py's. Trainer(plugins=[io]) sets
`trainer.strategy.checkpoint_io` (strategies that write sharded directories refuse one of the user's)."""
from tasktrain.checkpoint_io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "XLACheckpointIO"]


class XLACheckpointIO(TorchCheckpointIO):
    def __init__(self, *args, **kwargs):
        raise ValueError("XLACheckpointIO: tasktrain runs on CPUs and CUDA GPUs, not TPUs (XLA); leave it out "
                         "(TorchCheckpointIO is the default).")
