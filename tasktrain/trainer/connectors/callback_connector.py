"""`_RICH_AVAILABLE`, at Lightning's path: the switch the Trainer reads when it picks its default progress bar and model
summary (RichProgressBar and RichModelSummary when true, else TQDMProgressBar and ModelSummary; trainer/arguments.py,
`default_callbacks`). Lightning's tests and scripts pin the tqdm branch with
`mock.patch("lightning.pytorch.trainer.connectors.callback_connector._RICH_AVAILABLE", False)`; renamed, that works
here the same. Only the flag: tasktrain has no callback connector.

Unpatched, the flag asks `tasktrain.callbacks.progress.rich_available()` each time it is read (as Lightning's
RequirementCache is truthy when rich >= 10.2.2 is installed), so patching that function, tasktrain's own probe of the
rule, keeps working too."""
from tasktrain.callbacks import progress


class _RichInstalled:
    """Truthy when rich >= 10.2.2 is installed (read at each use, not at import)."""

    def __bool__(self):
        return bool(progress.rich_available())

    def __repr__(self):
        return f"_RICH_AVAILABLE({bool(self)})"


_RICH_AVAILABLE = _RichInstalled()
