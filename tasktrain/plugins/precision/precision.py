"""Lightning's module path of its base precision plugin (lightning.pytorch.plugins.precision.precision): Precision,
the one of tasktrain.plugins.precision."""
from tasktrain.plugins.precision import Precision

__all__ = ["Precision"]
