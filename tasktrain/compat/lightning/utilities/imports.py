"""`lightning.pytorch.utilities.imports`: the availability flags Lightning scripts and tests read (what is installed
beside torch), computed without importing those packages, and the checks Lightning takes from lightning_utilities
(RequirementCache, compare_version, package_available, module_available), with their rules and messages."""
import functools
import importlib
import importlib.util
from typing import Optional


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
_TORCH_GREATER_EQUAL_2_8 = _version_at_least("torch", (2, 8, 0))


@functools.lru_cache
def package_available(package_name):
    """Whether the top-level package can be imported (found on the path; not imported to check)."""
    try:
        return importlib.util.find_spec(package_name) is not None
    except ModuleNotFoundError:  # (a dotted name whose parent is missing)
        return False


@functools.lru_cache
def module_available(module_path):
    """Whether `module_path` ("package.module") imports: its package is found, then the module is imported."""
    if not package_available(module_path.split(".")[0]):
        return False
    try:
        importlib.import_module(module_path)
    except ImportError:
        return False
    return True


def compare_version(package, op, version, use_base_version=False):
    """op(the installed version of `package`, Version(version)), e.g. compare_version("torch", operator.ge, "2.6");
    False when the package does not import. The version is the package's __version__, else its distribution's; a
    package that has neither counts as True (as lightning_utilities, for documentation builds that mock it).
    use_base_version: compare without pre-release, post-release and local parts."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    from packaging.version import Version

    try:
        module = importlib.import_module(package)
    except (ImportError, RuntimeError):
        return False
    try:
        installed = Version(module.__version__) if hasattr(module, "__version__") else \
            Version(distribution_version(package))
    except (TypeError, PackageNotFoundError):
        return True
    if use_base_version:
        installed = Version(installed.base_version)
    return op(installed, Version(version))


class RequirementCache:
    """True when a requirement ("torch>=2.6", "rich", "package[extra]>=1") is installed, and/or, with `module`, when
    that module imports; checked once, on first use (bool(), str()). str() says why: "Requirement 'torch>=2.6' met",
    or what is missing with a `pip install -U` hint. A requirement without a version that no distribution provides
    counts as met when a module of that name imports."""

    def __init__(self, requirement: Optional[str] = None, module: Optional[str] = None):
        if not (requirement or module):
            raise ValueError("At least one arguments need to be set.")
        self.requirement = requirement
        self.module = module

    def _check_requirement(self):
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as distribution_version

        from packaging.requirements import Requirement
        from packaging.version import InvalidVersion, Version

        try:
            req = Requirement(self.requirement)
            installed = Version(distribution_version(req.name))
            self.available = req.specifier.contains(installed, prereleases=True) and _extras_installed(req)
        except (PackageNotFoundError, InvalidVersion):
            self.available = False
        if self.available:
            self.message = f"Requirement {self.requirement!r} met"
            return
        if not any(c in self.requirement for c in "=<>") or self.module is not None:
            # (a distribution's metadata may be missing where its module imports)
            self.available = module_available(self.requirement if self.module is None else self.module)
        # (lightning_utilities says "not met" here even when the module imported: its message, kept)
        self.message = f"Requirement {self.requirement!r} not met. HINT: Try running `pip install -U {self.requirement!r}`"

    def _check_module(self):
        self.available = module_available(self.module)
        self.message = f"Module {self.module!r} available" if self.available else \
            f"Module not found: {self.module!r}. HINT: Try running `pip install -U {self.module}`"

    def _check_available(self):
        if hasattr(self, "available"):
            return
        if self.requirement:
            self._check_requirement()
        if getattr(self, "available", True) and self.module:
            self._check_module()

    def __bool__(self):
        self._check_available()
        return self.available

    def __str__(self):
        self._check_available()
        return self.message

    __repr__ = __str__


def _extras_installed(req):
    """Each requirement an extra of `req` ("package[extra]") adds is installed at a version it accepts. As
    lightning_utilities: the package's Requires-Dist lines that contain an extra's name anywhere (a substring, not
    the line's `extra ==` marker: "yaml" also takes "ruamel.yaml>=0.18; extra == 'ruamel'"), markers not evaluated;
    False when no line does."""
    if not req.extras:
        return True
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.version import Version

    needed = [Requirement(line) for line in distribution(req.name).metadata.get_all("Requires-Dist") or []
              if any(extra in line for extra in req.extras)]
    if not needed:
        return False
    for one in needed:
        try:
            installed = Version(distribution(one.name).version)
        except PackageNotFoundError:
            return False
        if one.specifier and not one.specifier.contains(installed, prereleases=True):
            return False
    return True
