"""Lightning's `lightning.pytorch.callbacks.callback` path (where its Callback lives): this name is
tasktrain.callbacks.base itself."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.callbacks.base")
