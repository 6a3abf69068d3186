"""Lightning's module path `lightning.pytorch.profilers.pytorch`: PyTorchProfiler (defined in tasktrain.profilers)."""
from tasktrain.profilers import PyTorchProfiler

__all__ = ["PyTorchProfiler"]
