"""Lightning's module path `lightning.pytorch.profilers.simple`: SimpleProfiler (defined in tasktrain.profilers)."""
import math  # noqa: F401  (Lightning's module has it: a patch of `...profilers.simple.math.fsum` reaches the sums)

from tasktrain.profilers import SimpleProfiler

__all__ = ["SimpleProfiler"]
