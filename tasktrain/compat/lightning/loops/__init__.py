"""Lightning's `lightning.pytorch.loops` names (tasktrain.loops): the classes of tasktrain's loop views
(tasktrain/trainer/lightning_loops.py), so that `isinstance(trainer.fit_loop, _FitLoop)` and the imports of scripts
and tests written for Lightning hold. tasktrain has no loop objects: these are read views of the Trainer's state, and
a subclass cannot replace a Trainer's loop (`trainer.fit_loop = MyLoop(...)` raises, saying to use a callback)."""
import abc

from tasktrain.trainer import lightning_loops as _views

_FitLoop = _views.FitLoop
_TrainingEpochLoop = _views.EpochLoop
_EvaluationLoop = _views.EvaluationLoop
_PredictionLoop = _views.PredictionLoop


class _Loop(abc.ABC):
    """Lightning's base of every loop: here the common type of the loop views (isinstance holds for each). A subclass
    holds its `trainer` (Lightning's signature); the Trainer never runs one (`trainer.fit_loop = ...` is refused)."""

    def __init__(self, trainer):
        self.trainer = trainer


for _view in (_FitLoop, _TrainingEpochLoop, _EvaluationLoop, _PredictionLoop):
    _Loop.register(_view)


def __getattr__(name):
    if name in ("_AutomaticOptimization", "_ManualOptimization"):
        raise AttributeError(
            f"tasktrain.loops.{name}: Lightning's optimization loop objects are not in tasktrain (the optimizer step is "
            "one plain function of the fit loop). Their progress is read through "
            "trainer.fit_loop.epoch_loop.automatic_optimization / .manual_optimization (docs/lightning.md).")
    if name in ("fit_loop", "training_epoch_loop", "evaluation_loop", "prediction_loop", "optimization"):
        raise AttributeError(
            f"tasktrain.loops.{name}: Lightning's loop module is not in tasktrain, which runs no loop objects (a patch "
            "of a name there, such as _request_dataloader, would never be seen by the Trainer). The loop views' names "
            "are in tasktrain.loops; where a run's loaders come from: trainer.fit_loop._data_source (docs/lightning.md, "
            "Loop attributes).")
    raise AttributeError(f"module 'tasktrain.loops' has no attribute {name!r}")


__all__ = ["_Loop", "_FitLoop", "_TrainingEpochLoop", "_EvaluationLoop", "_PredictionLoop"]
