"""tasktrain.tuner: Tuner(trainer).lr_find(...) and Tuner(trainer).scale_batch_size(...), as Lightning's."""
from tasktrain.tuner.tuning import Tuner

__all__ = ["Tuner"]
