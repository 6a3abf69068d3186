class MisconfigurationException(ValueError):
    """A configuration that cannot work (Lightning's name for it). A ValueError, so that code catching ValueError
    for a bad argument keeps catching it."""
