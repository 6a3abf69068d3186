"""Lightning's `lightning.pytorch.overrides` (tasktrain.overrides): distributed.py's samplers."""
