"""Accelerate's `accelerate.state` path under the rename rule: tasktrain/compat/accelerate/state.py (this name is that
very module, so its process-wide state is one)."""
import sys

from tasktrain.compat.accelerate import state as _state

sys.modules[__name__] = _state
