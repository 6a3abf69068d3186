"""Lightning's `lightning.pytorch.callbacks.model_checkpoint` path (where its ModelCheckpoint lives): this name is
tasktrain.callbacks.checkpoint itself."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.callbacks.checkpoint")
