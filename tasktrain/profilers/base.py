"""Lightning's module path `lightning.pytorch.profilers.base`: PassThroughProfiler (defined in tasktrain.profilers)."""
from tasktrain.profilers import PassThroughProfiler

__all__ = ["PassThroughProfiler"]
