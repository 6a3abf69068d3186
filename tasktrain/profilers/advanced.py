"""Lightning's module path `lightning.pytorch.profilers.advanced`: AdvancedProfiler (defined in tasktrain.profilers)."""
from tasktrain.profilers import AdvancedProfiler

__all__ = ["AdvancedProfiler"]
