"""`lightning.pytorch.utilities.exceptions`: the core's MisconfigurationException under Lightning's path."""
from tasktrain.exceptions import MisconfigurationException

__all__ = ["MisconfigurationException"]
