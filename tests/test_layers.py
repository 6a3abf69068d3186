"""The compatibility layers sit on top of the core, read from the source (as tests/test_contract.py reads the
strategies' layering): Accelerate's and Lightning's names, aliases, refusals and layouts live in
tasktrain/compat/<framework>/ and import the core; the core never imports them, not even inside a function. The
public module paths of the rename rule (tasktrain.state, tasktrain.utils, tasktrain.utilities, ...) are those very
modules."""
import ast
import importlib
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasktrain")
# the layers, and the module paths scripts import them by (each names the compat module it is)
LAYERS = ("tasktrain.compat", "tasktrain.state", "tasktrain.utils", "tasktrain.utilities",
          "tasktrain.trainer.accelerate_layout", "tasktrain.core", "tasktrain.accelerator", "tasktrain.data_loader",
          "tasktrain.launchers", "tasktrain.test_utils", "tasktrain.local_sgd", "tasktrain.parallelism_config")
PUBLIC_PATHS = {
    "tasktrain.state": "tasktrain.compat.accelerate.state",
    "tasktrain.accelerator": "tasktrain.compat.accelerate.accelerator",
    "tasktrain.data_loader": "tasktrain.compat.accelerate.data_loader",
    "tasktrain.launchers": "tasktrain.compat.accelerate.launchers",
    "tasktrain.local_sgd": "tasktrain.compat.accelerate.local_sgd",
    "tasktrain.parallelism_config": "tasktrain.compat.accelerate.parallelism_config",
    "tasktrain.test_utils.testing": "tasktrain.compat.accelerate.test_utils.testing",
    "tasktrain.test_utils.training": "tasktrain.compat.accelerate.test_utils.training",
    "tasktrain.utils.imports": "tasktrain.compat.accelerate.utils.imports",
    "tasktrain.utils.random": "tasktrain.compat.accelerate.utils.random",
    "tasktrain.utils.dataclasses": "tasktrain.compat.accelerate.utils.dataclasses",
    "tasktrain.utils.operations": "tasktrain.compat.accelerate.utils.operations",
    "tasktrain.utils.other": "tasktrain.compat.accelerate.utils.other",
    "tasktrain.utils.memory": "tasktrain.compat.accelerate.utils.memory",
    "tasktrain.trainer.accelerate_layout": "tasktrain.compat.accelerate.layout",
    "tasktrain.utilities.rank_zero": "tasktrain.compat.lightning.utilities.rank_zero",
    "tasktrain.utilities.types": "tasktrain.compat.lightning.utilities.types",
    "tasktrain.utilities.exceptions": "tasktrain.compat.lightning.utilities.exceptions",
    "tasktrain.core.module": "tasktrain.compat.lightning.core.module",
    "tasktrain.core.datamodule": "tasktrain.compat.lightning.core.datamodule",
    "tasktrain.core.saving": "tasktrain.compat.lightning.core.saving",
}


def _module_of(path):
    name = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _imports(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:  # `from tasktrain import state`
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


def _in_layer(name):
    return any(name == layer or name.startswith(layer + ".") for layer in LAYERS)


def test_the_core_never_imports_a_compatibility_layer():
    found = []
    for directory, _, files in os.walk(ROOT):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(directory, file)
            module = _module_of(path)
            if _in_layer(module) or module == "tasktrain":  # (tasktrain/__init__ names both lazily, by string)
                continue
            found += [f"{module} imports {name}" for name in _imports(path) if _in_layer(name)]
    assert not found, found


def test_the_accelerate_layer_stands_on_the_core():
    from tasktrain import Accelerator
    from tasktrain.trainer import accelerator as core

    assert issubclass(Accelerator, core.Accelerator) and Accelerator is not core.Accelerator
    assert Accelerator.__module__ == "tasktrain.compat.accelerate.accelerator"
    layer = os.path.join(ROOT, "compat", "accelerate", "accelerator.py")
    assert "tasktrain.trainer.accelerator" in set(_imports(layer))


def test_the_public_paths_of_the_rename_rule_are_the_compat_modules():
    for public, compat in PUBLIC_PATHS.items():
        assert importlib.import_module(public) is importlib.import_module(compat), public
    from tasktrain.utils import DeepSpeedPlugin, ProjectConfiguration, gather
    from tasktrain.compat.accelerate.utils import dataclasses, operations
    from tasktrain.trainer.accelerator import ProjectConfiguration as CoreProjectConfiguration

    assert DeepSpeedPlugin is dataclasses.DeepSpeedPlugin and gather is operations.gather
    assert ProjectConfiguration is CoreProjectConfiguration  # the core's record, under Accelerate's name
    from tasktrain.compat.lightning.utilities import rank_zero
    from tasktrain.core import DataModule, TaskModule
    from tasktrain.utilities import rank_zero_only

    assert rank_zero_only is rank_zero.rank_zero_only and TaskModule.__module__ == "tasktrain.trainer.module"
    assert DataModule.__module__ == "tasktrain.trainer.datamodule"


def test_the_rank_reaches_lightnings_rank_zero_only_through_the_core(monkeypatch):
    from tasktrain.trainer import runtime
    from tasktrain.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 0)
    monkeypatch.setattr(runtime, "_KNOWN_RANK", [])
    runtime.announce_rank(3)  # what a run's start does
    assert rank_zero_only.rank == 3
