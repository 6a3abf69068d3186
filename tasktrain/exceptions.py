class MisconfigurationException(ValueError):
    """A configuration that cannot work (Lightning's name for it). A ValueError, so that code catching ValueError
    for a bad argument keeps catching it."""


class PossibleUserWarning(UserWarning):
    """A warning about a setting that may be a mistake (Lightning's class, `lightning.pytorch.utilities.warnings`):
    filter it with warnings.filterwarnings("ignore", category=PossibleUserWarning) where it is not."""
