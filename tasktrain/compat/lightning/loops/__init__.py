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
    """Lightning's base of every loop: here the common type of the loop views (isinstance holds for each)."""


for _view in (_FitLoop, _TrainingEpochLoop, _EvaluationLoop, _PredictionLoop):
    _Loop.register(_view)


def __getattr__(name):
    if name in ("_AutomaticOptimization", "_ManualOptimization"):
        raise AttributeError(
            f"tasktrain.loops.{name}: Lightning's optimization loop objects are not in tasktrain (the optimizer step is "
            "one plain function of the fit loop). Their progress is read through "
            "trainer.fit_loop.epoch_loop.automatic_optimization / .manual_optimization (docs/lightning.md).")
    raise AttributeError(f"module 'tasktrain.loops' has no attribute {name!r}")


__all__ = ["_Loop", "_FitLoop", "_TrainingEpochLoop", "_EvaluationLoop", "_PredictionLoop"]
