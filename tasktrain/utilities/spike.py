"""Lightning's `lightning.fabric.utilities.spike` path of the exception SpikeDetection raises (Lightning defines it
there; its `lightning.pytorch.callbacks.spike` re-exports it): the very class of tasktrain.callbacks.spike, so an
`except TrainingSpikeException` imported from either path catches the callback's stop."""
from tasktrain.callbacks.spike import TrainingSpikeException

__all__ = ["TrainingSpikeException"]
