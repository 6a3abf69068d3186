"""Accelerate's process state (`accelerate.state` -> `tasktrain.state`): who this process is, without an Accelerator.

    state = PartialState()                       # joins the launcher's world, as Accelerator() would
    with state.split_between_processes(prompts) as mine:
        outputs = [generate(p) for p in mine]

The state is shared by the process: every PartialState, and the Accelerator, read the same strategy (the
Accelerator's once one exists; before that, one made by the run's shared set-up, tasktrain/trainer/runtime.py).
The process helpers (split_between_processes, main_process_first, the on_*_process decorators, ...) live here
and the Accelerator hands its own calls to them.
"""
import contextlib
import functools

import torch

_SHARED = {"strategy": None, "accelerator": None}


def _shared_strategy(cpu=False):
    if _SHARED["strategy"] is None:
        from tasktrain.trainer.runtime import ACCELERATOR_NAMES, build_runtime

        runtime = build_runtime(accelerator="cpu" if cpu else "auto", names=ACCELERATOR_NAMES, custom_loop=True,
                                stall_timeout=None)
        runtime.strategy.setup_environment()
        _SHARED["strategy"] = runtime.strategy
    return _SHARED["strategy"]


def distributed_type_of(strategy) -> str:
    """Accelerate's name of what runs a strategy's processes, read from its capabilities: "NO" (one process),
    "DEEPSPEED" (an engine that owns the step), "FSDP" (a sharded engine), else "MULTI_GPU" (DDP; PartialState says
    MULTI_CPU on CPUs). The launcher's names of the registry's strategies (tasktrain/names.py) say the same
    (tests/test_contract.py checks it)."""
    from tasktrain.strategies.base import ClipsInsideStep, MultiProcess, Sharded

    if not isinstance(strategy, MultiProcess):
        return "NO"
    if isinstance(strategy, ClipsInsideStep):
        return "DEEPSPEED"
    if isinstance(strategy, Sharded):
        return "FSDP"
    return "MULTI_GPU"


def _share(accelerator):
    """Called by Accelerator(): from now on the process's state is that Accelerator's."""
    _SHARED["strategy"] = accelerator.strategy
    _SHARED["accelerator"] = accelerator


class PartialState:
    """This process's place in the run: device, ranks, and the helpers that need only that."""

    def __init__(self, cpu=False, **kwargs):
        if kwargs:
            raise TypeError(f"PartialState got {sorted(kwargs)}: it takes only cpu=. The process group's options "
                            "come from the launcher and from Accelerator(kwargs_handlers=[InitProcessGroupKwargs])).")
        self._strategy = _shared_strategy(cpu)

    @classmethod
    def _of(cls, strategy, accelerator=None):
        """The state of one Accelerator (its own strategy, even when a newer Accelerator exists)."""
        state = cls.__new__(cls)
        state._strategy, state._accelerator = strategy, accelerator
        return state

    # -- who am I ----------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._strategy.root_device

    @property
    def process_index(self) -> int:
        return self._strategy.global_rank

    @property
    def local_process_index(self) -> int:
        return self._strategy.local_rank

    @property
    def num_processes(self) -> int:
        return self._strategy.world_size

    @property
    def is_main_process(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def is_local_main_process(self) -> bool:
        return self._strategy.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self._strategy.global_rank == self._strategy.world_size - 1

    @property
    def use_distributed(self) -> bool:
        return self._strategy.world_size > 1

    @property
    def distributed_type(self):
        """Accelerate's DistributedType: NO, MULTI_CPU / MULTI_GPU (DDP on CPUs / GPUs), DEEPSPEED, FSDP."""
        from tasktrain.compat.accelerate.utils.dataclasses import DistributedType

        kind = distributed_type_of(self._strategy)
        if kind == "MULTI_GPU" and self.device.type == "cpu":
            kind = "MULTI_CPU"
        return DistributedType(kind)

    @property
    def initialized(self) -> bool:
        return True

    def print(self, *args, **kwargs):
        if self.is_main_process:
            print(*args, **kwargs)

    # -- together ----------------------------------------------------------------------------------------------------
    def wait_for_everyone(self):
        self._strategy.barrier("wait_for_everyone")

    @contextlib.contextmanager
    def _first(self, goes_first):
        if not goes_first:
            self.wait_for_everyone()
        yield
        if goes_first:
            self.wait_for_everyone()

    def main_process_first(self):
        """`with state.main_process_first():` the main process runs the block, then the others."""
        return self._first(self.is_main_process)

    def local_main_process_first(self):
        """`with state.local_main_process_first():` each machine's first process runs the block, then the others."""
        return self._first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs, apply_padding=False):
        """This process's contiguous part of a list, tuple, tensor (first dimension) or dict of them: process i
        of n gets len // n items, the first len % n processes one more. apply_padding=True repeats the last
        item so that every process gets as many (then gather drops nothing: remove the repeats yourself)."""
        n, index = self.num_processes, self.process_index
        if n == 1:
            yield inputs
            return
        length = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
        if isinstance(inputs, dict):
            lengths = {key: len(value) for key, value in inputs.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"split_between_processes: the dict's values have different lengths {lengths}.")
        per, extras = divmod(length, n)
        start = index * per + min(index, extras)
        end = start + per + (1 if index < extras else 0)
        padded = per + (1 if extras else 0)

        def split(value):
            if isinstance(value, dict):
                return {key: split(v) for key, v in value.items()}
            if not isinstance(value, (list, tuple, torch.Tensor)):
                raise TypeError(f"split_between_processes splits lists, tuples, tensors and dicts of them, not "
                                f"{type(value).__name__}.")
            part = value[start:end]
            if apply_padding and len(part) < padded and len(value):
                missing = padded - len(part)
                if isinstance(value, torch.Tensor):
                    part = torch.cat([part, value[-1:].expand(missing, *value.shape[1:])])
                else:
                    part = type(value)(list(part) + [value[-1]] * missing)
            return part

        yield split(inputs)

    # -- who runs this -----------------------------------------------------------------------------------------------
    def on_main_process(self, function):
        """Decorator: the function runs on the main process only (elsewhere the call returns None)."""
        return self._only(function, lambda: self.is_main_process)

    def on_local_main_process(self, function):
        return self._only(function, lambda: self.is_local_main_process)

    def on_last_process(self, function):
        return self._only(function, lambda: self.is_last_process)

    def on_process(self, function=None, process_index=None):
        """`@state.on_process(process_index=1)`: the function runs on that process only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        if process_index is None:
            raise ValueError("on_process needs process_index=: the global index of the process to run on.")
        return self._only(function, lambda: self.process_index == process_index)

    def on_local_process(self, function=None, local_process_index=None):
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index=.")
        return self._only(function, lambda: self.local_process_index == local_process_index)

    @staticmethod
    def _only(function, here):
        @functools.wraps(function)
        def run(*args, **kwargs):
            if here():
                return function(*args, **kwargs)
            return None

        return run


class AcceleratorState(PartialState):
    """PartialState plus the Accelerator's choices (mixed_precision, the DeepSpeed plugin's options): it needs an
    Accelerator made before it in this process."""

    def __init__(self, **kwargs):
        if _SHARED["accelerator"] is None:
            raise RuntimeError("AcceleratorState() reads the Accelerator's settings: create Accelerator(...) first "
                               "(or use PartialState() for the process's place alone).")
        super().__init__(**kwargs)
        self._accelerator = _SHARED["accelerator"]

    @property
    def mixed_precision(self) -> str:
        return self._accelerator.mixed_precision

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._accelerator.gradient_accumulation_steps

    @property
    def deepspeed_plugin(self):
        """The DeepSpeed strategy (its resolved config is `.config` once a model is prepared); None otherwise."""
        return self._strategy if distributed_type_of(self._strategy) == "DEEPSPEED" else None

    @property
    def fsdp_plugin(self):
        return None
