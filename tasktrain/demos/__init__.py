"""Small models and datasets for examples, bug reports and tests, under Lightning's names
(`lightning.pytorch.demos.boring_classes` -> `tasktrain.demos.boring_classes`); BoringModel, BoringDataModule and
DemoModel are here too, as `lightning.pytorch.demos` has them (`--model=tasktrain.demos.BoringModel`)."""
from tasktrain.demos.boring_classes import BoringDataModule, BoringModel, DemoModel

__all__ = ["BoringDataModule", "BoringModel", "DemoModel"]
