"""Lightning's `lightning.pytorch.utilities.model_summary` path: the summary of a module (`ModelSummary` here is that
summary, as in Lightning; the callback is tasktrain.callbacks.ModelSummary), `summarize`, the count and size formats,
parse_batch_shape (the "In sizes" column of an input), LayerSummary (one layer's) and DeepSpeedSummary (a ZeRO-3
partitioned module's, with "Params per Device")."""
from tasktrain.callbacks.model_summary import (LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, UNKNOWN_SIZE, DeepSpeedSummary,
                                               LayerSummary, get_formatted_model_size, get_human_readable_count,
                                               summarize)
from tasktrain.callbacks.model_summary import ModuleSummary as ModelSummary
from tasktrain.callbacks.model_summary import _shape


def parse_batch_shape(batch):
    """The shape of an input, as the summary's "In sizes" column shows it (Lightning's parameter name)."""
    return _shape(batch)


__all__ = ["ModelSummary", "LayerSummary", "DeepSpeedSummary", "summarize", "get_human_readable_count",
           "get_formatted_model_size", "parse_batch_shape", "LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "UNKNOWN_SIZE"]
