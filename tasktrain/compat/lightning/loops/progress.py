"""Lightning's `lightning.pytorch.loops.progress` names: the progress views of tasktrain/trainer/lightning_loops.py
(`trainer.fit_loop.epoch_progress`, `.epoch_loop.batch_progress`, ... and their `current` / `total` trackers). They
read the Trainer's counters; they are not built or loaded by a script. (Lightning's tracker classes are left out:
its trackers subclass one another the other way round, _ProcessedTracker being the widest.)"""
import abc

from tasktrain.trainer import lightning_loops as _views

_Progress = _views.Progress
_BatchProgress = _views.BatchProgress


class _BaseProgress(abc.ABC):
    """Lightning's base of every progress object: here the common type of the progress views."""


for _view in (_views.Tracker, _views.Progress):  # (their subclasses follow)
    _BaseProgress.register(_view)
