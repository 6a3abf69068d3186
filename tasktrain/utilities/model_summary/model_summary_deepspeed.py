"""Lightning's `lightning.pytorch.utilities.model_summary.model_summary_deepspeed` path: DeepSpeedSummary, the
summary of a module whose parameters DeepSpeed ZeRO-3 partitioned (defined in tasktrain.callbacks.model_summary)."""
from tasktrain.callbacks.model_summary import DeepSpeedSummary

__all__ = ["DeepSpeedSummary"]
