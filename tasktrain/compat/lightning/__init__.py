"""Lightning's layer (see tasktrain/compat/__init__.py): utilities/ (`lightning.pytorch.utilities`: rank_zero_*,
types, grad_norm, ...) and core/ (`lightning.pytorch.core`: TaskModule, DataModule under Lightning's module path)."""
