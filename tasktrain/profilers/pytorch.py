"""Lightning's module path `lightning.pytorch.profilers.pytorch`: PyTorchProfiler and RegisterRecordFunction (defined in
tasktrain.profilers), `_KINETO_AVAILABLE` (whether torch's profiler has its Kineto back end) and `warning_cache`, the
PyTorch profiler's warnings said so far (each once per process; clear() says them again): Lightning's one,
"The PyTorch Profiler default schedule will be overridden as there is not enough steps ...", given where a run
without a `schedule` has fewer than 5 steps of a kind (docs/profiling.md)."""
import torch

from tasktrain.profilers import PyTorchProfiler, RegisterRecordFunction, profiler_warnings as warning_cache

_KINETO_AVAILABLE = torch.profiler.kineto_available()

__all__ = ["PyTorchProfiler", "RegisterRecordFunction"]
