"""Lightning's layer (see tasktrain/compat/__init__.py): utilities/ (`lightning.pytorch.utilities`: rank_zero_*,
types, grad_norm, ...) and core/ (`lightning.pytorch.core`: TaskModule, DataModule under Lightning's module path)."""

# `lightning.pytorch.LIGHTNING_LOGO`: a banner a script prints at its start (tasktrain's own text, not Lightning's
# drawing of its brand).
LIGHTNING_LOGO = """
  _            _    _             _
 | |_ __ _ ___| | _| |_ _ __ __ _(_)_ __
 | __/ _` / __| |/ / __| '__/ _` | | '_ \\
 | || (_| \\__ \\   <| |_| | | (_| | | | | |
  \\__\\__,_|___/_|\\_\\\\__|_|  \\__,_|_|_| |_|
"""
