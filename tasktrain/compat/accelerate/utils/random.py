"""Accelerate's random-state helpers (`accelerate.utils.random` -> `tasktrain.utils.random`, and `tasktrain.utils`):
every process continues from process 0's generator. set_seed lives in other.py and is re-exported here."""
from tasktrain.compat.accelerate.utils.other import set_seed  # noqa: F401 (accelerate.utils.random.set_seed)

# the device generators a process may hold, besides the CPU's ("torch")
_DEVICE_TYPES = ("cuda", "xpu", "npu", "mlu", "musa", "hpu", "sdaa")


def _name(rng_type):
    return str(getattr(rng_type, "value", rng_type))  # an RNGType or its string


def synchronize_rng_state(rng_type=None, generator=None):
    """Give this process process 0's state of one generator: "torch" (the CPU's default generator), "cuda" (this
    process's current CUDA device; likewise "xpu", "npu", ... where torch sees such a device) or "generator" (the
    torch.Generator passed). A collective: every process calls it with the same rng_type."""
    import torch

    from tasktrain.compat.accelerate.state import PartialState

    name = _name(rng_type)
    strategy = PartialState()._strategy
    if name == "torch":
        state, restore = torch.get_rng_state(), torch.set_rng_state
    elif name == "generator":
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs generator=: the torch.Generator to align.")
        state, restore = generator.get_state(), generator.set_state
    elif name in _DEVICE_TYPES:
        device = getattr(torch, name, None)
        if device is None or not device.is_available():
            raise ValueError(f"synchronize_rng_state({name!r}): this process has no {name} device. Drop {name!r} "
                             "from rng_types (\"torch\" aligns the CPU's generator).")
        state, restore = device.get_rng_state(), device.set_rng_state
    else:
        raise ValueError(f"synchronize_rng_state({name!r}): use 'torch', 'generator' or a device type this process "
                         f"has ({', '.join(_DEVICE_TYPES)}); tasktrain does not run on XLA.")
    if strategy.world_size == 1:
        return
    restore(strategy.broadcast(state.cpu(), src=0).cpu())


def synchronize_rng_states(rng_types, generator=None):
    """synchronize_rng_state for each name of `rng_types` (e.g. ["torch", "cuda"]); `generator` for "generator"."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
