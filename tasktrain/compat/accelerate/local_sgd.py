"""Accelerate's `accelerate.local_sgd` path under the rename rule (`from tasktrain.local_sgd import LocalSGD`): the
core's LocalSGD (tasktrain/trainer/local_sgd.py), which takes Accelerate's arguments as they are."""
from tasktrain.trainer.local_sgd import LocalSGD  # noqa: F401
