"""Progress bars, as Lightning's: `ProgressBar` (the base class a custom bar subclasses: totals, descriptions,
`get_metrics`), `RichProgressBar` (on rich) and `TQDMProgressBar` (on tqdm). The Trainer's default is Lightning's
rule: RichProgressBar when rich is installed, else TQDMProgressBar (the Trainer reads Lightning's switch,
tasktrain.trainer.connectors.callback_connector._RICH_AVAILABLE, which asks `rich_available()` while unpatched; it also
picks RichModelSummary over ModelSummary). The bars live in rich_progress.py / tqdm_progress.py and are imported on first
use, so that `import tasktrain` imports neither rich nor tqdm."""
import importlib.metadata

from tasktrain.callbacks.progress.progress_bar import ProgressBar, get_standard_metrics

__all__ = ["ProgressBar", "RichProgressBar", "RichProgressBarTheme", "TQDMProgressBar", "Tqdm",
           "get_standard_metrics", "rich_available", "default_progress_bar"]

_LAZY = {"TQDMProgressBar": "tqdm_progress", "Tqdm": "tqdm_progress",
         "RichProgressBar": "rich_progress", "RichProgressBarTheme": "rich_progress"}


def rich_available():
    """Lightning's `_RICH_AVAILABLE`: rich >= 10.2.2 is installed (looked up, not imported). Tests monkeypatch this
    one function to pin either branch of the defaults."""
    try:
        version = importlib.metadata.version("rich")
    except importlib.metadata.PackageNotFoundError:
        return False
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers) >= (10, 2, 2)


def default_progress_bar(rich=None):
    """The Trainer's bar when the user gives none (Lightning's rule). `rich`: the Trainer passes its switch
    (tasktrain.trainer.connectors.callback_connector._RICH_AVAILABLE); None asks `rich_available()`."""
    if rich_available() if rich is None else rich:
        from tasktrain.callbacks.progress.rich_progress import RichProgressBar

        return RichProgressBar()
    from tasktrain.callbacks.progress.tqdm_progress import TQDMProgressBar

    return TQDMProgressBar()


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"tasktrain.callbacks.progress.{_LAZY[name]}")
        return getattr(module, name)
    if name in ("rich_progress", "tqdm_progress", "rich_columns"):  # the modules, as attributes (Lightning's)
        return importlib.import_module(f"tasktrain.callbacks.progress.{name}")
    raise AttributeError(f"module 'tasktrain.callbacks.progress' has no attribute {name!r}")
