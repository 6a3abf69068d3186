"""Lightning's `lightning.pytorch.overrides` path under the rename rule: tasktrain/compat/lightning/overrides (this
package is that one, its submodules under their Lightning names)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tasktrain.compat.lightning.overrides")
# (its submodule too: imported under this name it would load a second copy, whose classes fail isinstance)
sys.modules[__name__ + ".distributed"] = importlib.import_module("tasktrain.compat.lightning.overrides.distributed")
