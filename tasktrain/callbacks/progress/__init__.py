"""Progress bars, as Lightning's: `ProgressBar` (the base class a custom bar subclasses: totals, descriptions,
`get_metrics`) and `TQDMProgressBar` (the Trainer's default, on tqdm). `TQDMProgressBar` and `Tqdm` live in
tqdm_progress.py and are imported on first use, so that `import tasktrain` does not import tqdm."""
from tasktrain.callbacks.progress.progress_bar import ProgressBar, get_standard_metrics

__all__ = ["ProgressBar", "TQDMProgressBar", "Tqdm", "get_standard_metrics"]


def __getattr__(name):
    if name in ("TQDMProgressBar", "Tqdm"):
        from tasktrain.callbacks.progress import tqdm_progress

        return getattr(tqdm_progress, name)
    raise AttributeError(f"module 'tasktrain.callbacks.progress' has no attribute {name!r}")
