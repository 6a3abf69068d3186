"""Lightning's `lightning.pytorch.utilities.model_summary.model_summary` path (the module its package re-exports),
its names defined in tasktrain.callbacks.model_summary: the summary of a module (`ModelSummary`; the callback is
tasktrain.callbacks.ModelSummary), `summarize`, LayerSummary, the count and size formats, parse_batch_shape, the
table's words and `warning_cache` (the lazy-parameter warning, said once per process; clear() says it again)."""
from tasktrain.callbacks.model_summary import (LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, UNKNOWN_SIZE, LayerSummary,
                                               get_formatted_model_size, get_human_readable_count, summarize)
from tasktrain.callbacks.model_summary import ModuleSummary as ModelSummary
from tasktrain.callbacks.model_summary import _shape, warning_cache


def parse_batch_shape(batch):
    """The shape of an input, as the summary's "In sizes" column shows it (Lightning's parameter name)."""
    return _shape(batch)


__all__ = ["ModelSummary", "LayerSummary", "summarize", "get_human_readable_count", "get_formatted_model_size",
           "parse_batch_shape", "LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "UNKNOWN_SIZE", "warning_cache"]
