"""Lightning's module path `lightning.pytorch.profilers.profiler`: Profiler (defined in tasktrain.profilers)."""
from tasktrain.profilers import Profiler

__all__ = ["Profiler"]
