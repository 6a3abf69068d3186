"""Lightning's module path `lightning.pytorch.profilers.simple`: SimpleProfiler (defined in tasktrain.profilers)."""
from tasktrain.profilers import SimpleProfiler

__all__ = ["SimpleProfiler"]
