"""Lightning's `lightning.pytorch.utilities.warnings`: PossibleUserWarning, and disable_possible_user_warnings
(Lightning's, from lightning.fabric.utilities.warnings; also `tasktrain.disable_possible_user_warnings`)."""
import warnings

from tasktrain.exceptions import PossibleUserWarning

__all__ = ["PossibleUserWarning", "disable_possible_user_warnings"]


def disable_possible_user_warnings(module=""):
    """Ignore the PossibleUserWarnings (warnings that may be false alarms), from every module or from those whose
    name matches `module` (a regular expression, as warnings.filterwarnings takes it)."""
    warnings.filterwarnings("ignore", module=module, category=PossibleUserWarning)
