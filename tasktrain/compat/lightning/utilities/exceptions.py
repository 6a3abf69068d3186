"""`lightning.pytorch.utilities.exceptions`: the core's MisconfigurationException and SIGTERMException under
Lightning's path."""
from tasktrain.exceptions import MisconfigurationException, SIGTERMException

__all__ = ["MisconfigurationException", "SIGTERMException"]
