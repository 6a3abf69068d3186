"""Lightning's `lightning.pytorch.utilities.model_summary` package: the summary of a module (`ModelSummary` here is
that summary, as in Lightning; the callback is tasktrain.callbacks.ModelSummary), `summarize`, the count and size
formats, parse_batch_shape (the "In sizes" column of an input), LayerSummary (one layer's) and DeepSpeedSummary (a
ZeRO-3 partitioned module's, with "Params per Device"); its modules under Lightning's names, `model_summary` and
`model_summary_deepspeed`."""
from tasktrain.utilities.model_summary.model_summary import (LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, UNKNOWN_SIZE,
                                                             LayerSummary, ModelSummary, get_formatted_model_size,
                                                             get_human_readable_count, parse_batch_shape, summarize)
from tasktrain.utilities.model_summary.model_summary_deepspeed import DeepSpeedSummary

__all__ = ["ModelSummary", "LayerSummary", "DeepSpeedSummary", "summarize", "get_human_readable_count",
           "get_formatted_model_size", "parse_batch_shape", "LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "UNKNOWN_SIZE"]
