"""Lightning's `lightning.pytorch.utilities.model_summary` path: the summary of a module (`ModelSummary` here is that
summary, as in Lightning; the callback is tasktrain.callbacks.ModelSummary), `summarize` and the count format."""
from tasktrain.callbacks.model_summary import LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, get_human_readable_count, summarize
from tasktrain.callbacks.model_summary import Summary as ModelSummary

__all__ = ["ModelSummary", "summarize", "get_human_readable_count", "LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE"]
