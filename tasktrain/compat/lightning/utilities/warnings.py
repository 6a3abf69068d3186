"""Lightning's `lightning.pytorch.utilities.warnings`: PossibleUserWarning."""
from tasktrain.exceptions import PossibleUserWarning

__all__ = ["PossibleUserWarning"]
