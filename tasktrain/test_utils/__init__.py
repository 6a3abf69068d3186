"""Accelerate's `accelerate.test_utils` path under the rename rule: the names of tasktrain/compat/accelerate/test_utils;
tasktrain.test_utils.testing and .training are that package's very modules (so each class exists once)."""
from tasktrain.compat.accelerate import test_utils as _test_utils
from tasktrain.compat.accelerate.test_utils import *  # noqa: F401,F403
from tasktrain.compat.accelerate.test_utils import testing, training  # noqa: F401

__all__ = [name for name in dir(_test_utils) if not name.startswith("_") and name not in ("testing", "training")]
