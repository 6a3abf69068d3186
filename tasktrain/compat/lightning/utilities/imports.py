"""`lightning.pytorch.utilities.imports`: the availability flags Lightning scripts and tests read (what is installed
beside torch), computed without importing those packages."""
import importlib.util


def _version_at_least(package, minimum):
    if importlib.util.find_spec(package) is None:
        return False
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = version(package).split("+")[0].split(".")
    except PackageNotFoundError:
        return False
    numbers = tuple(int(p) if p.isdigit() else 0 for p in parts[:3])
    return numbers >= minimum


_RICH_AVAILABLE = importlib.util.find_spec("rich") is not None
_OMEGACONF_AVAILABLE = importlib.util.find_spec("omegaconf") is not None
_TORCHMETRICS_GREATER_EQUAL_0_8_0 = _version_at_least("torchmetrics", (0, 8, 0))
_TORCHMETRICS_GREATER_EQUAL_0_9_1 = _version_at_least("torchmetrics", (0, 9, 1))
_TORCHMETRICS_GREATER_EQUAL_0_11 = _version_at_least("torchmetrics", (0, 11, 0))
_TORCHMETRICS_GREATER_EQUAL_1_0_0 = _version_at_least("torchmetrics", (1, 0, 0))


def package_available(package_name):
    """Whether the top-level package can be imported (found on the path; not imported to check)."""
    return importlib.util.find_spec(package_name) is not None
