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
import os
import weakref

import torch

# The process's state: the strategy every PartialState reads, the newest Accelerator, debug mode (None: not read
# from the environment yet), an assigned distributed_type (None: the strategy's), and every Accelerator made in
# this process (destroy_process_group ends them all before the group goes).
_SHARED = {"strategy": None, "accelerator": None, "debug": None, "distributed_type": None,
           "accelerators": weakref.WeakSet()}
_TRUE = ("1", "true", "yes", "on", "y")


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
    """Called by Accelerator(): from now on the process's state is that Accelerator's (an assigned
    distributed_type described the previous one's, and is dropped)."""
    _SHARED["strategy"] = accelerator.strategy
    _SHARED["accelerator"] = accelerator
    _SHARED["distributed_type"] = None
    _SHARED["accelerators"].add(accelerator)


def _is_hf_dataset(value):
    import sys

    datasets = sys.modules.get("datasets")  # only a Dataset of a package already imported can be passed
    return datasets is not None and isinstance(value, datasets.Dataset)


def _debug_from_environment():
    return any(os.environ.get(name, "").strip().lower() in _TRUE
               for name in ("TASKTRAIN_DEBUG_MODE", "ACCELERATE_DEBUG_MODE"))


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
        """Accelerate's DistributedType: NO, MULTI_CPU / MULTI_GPU (DDP on CPUs / GPUs), DEEPSPEED, FSDP.

        Assignable, as in Accelerate (`state.distributed_type = DistributedType.FSDP`): every state of the process
        and the Accelerator then report the assigned value, and what the Accelerator decides from it follows
        (join_uneven_inputs joins only under MULTI_CPU / MULTI_GPU). The strategy itself, which runs the processes,
        does not change; the next Accelerator() reports its own again."""
        from tasktrain.compat.accelerate.utils.dataclasses import DistributedType

        if _SHARED["distributed_type"] is not None:
            return _SHARED["distributed_type"]
        kind = distributed_type_of(self._strategy)
        if kind == "MULTI_GPU" and self.device.type == "cpu":
            kind = "MULTI_CPU"
        return DistributedType(kind)

    @distributed_type.setter
    def distributed_type(self, value):
        from tasktrain.compat.accelerate.utils.dataclasses import DistributedType

        _SHARED["distributed_type"] = DistributedType(getattr(value, "value", value))  # a bad name: ValueError

    @property
    def debug(self) -> bool:
        """Debug mode: the collectives of tasktrain.utils (gather, broadcast, reduce, pad_across_processes) first
        compare every process's tensor shapes and raise DistributedOperationException, naming each process's
        shapes, where they differ (instead of hanging or returning garbage). On with ACCELERATE_DEBUG_MODE=1 or
        TASKTRAIN_DEBUG_MODE=1 in the environment; assignable (`state.debug = True`) for the whole process."""
        if _SHARED["debug"] is None:
            _SHARED["debug"] = _debug_from_environment()
        return _SHARED["debug"]

    @debug.setter
    def debug(self, value):
        _SHARED["debug"] = bool(value)

    @property
    def initialized(self) -> bool:
        return True

    @staticmethod
    def _reset_state():
        """Forget the process's state (as Accelerate's test scripts do between runs): the next PartialState() or
        Accelerator() sets it up again (the process group, which outlives it, is joined again); debug mode and
        an assigned distributed_type go back to their defaults."""
        _SHARED.update(strategy=None, debug=None, distributed_type=None)

    def destroy_process_group(self, group=None):
        """End the processes' connection (torch.distributed.destroy_process_group) now: every Accelerator of this
        process ends its training first (end_training: trackers closed, DDP wrappers released), so that nothing
        still bound to the group outlives it. group=: only that subgroup."""
        import gc

        import torch.distributed as dist

        if group is None:
            for accelerator in list(_SHARED["accelerators"]):
                accelerator.end_training()
            gc.collect()  # the wrappers the ended Accelerators let go of
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)

    def __repr__(self):
        return (f"{type(self).__name__}(distributed_type={self.distributed_type}, num_processes="
                f"{self.num_processes}, process_index={self.process_index}, local_process_index="
                f"{self.local_process_index}, device={self.device})")

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
        """This process's contiguous part of a list, tuple, tensor (first dimension), datasets.Dataset (its rows)
        or dict of them: process i of n gets len // n items, the first len % n processes one more.
        apply_padding=True repeats the last item so that every process gets as many (then gather drops nothing:
        remove the repeats yourself)."""
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
            if _is_hf_dataset(value):  # a Hugging Face datasets.Dataset: its rows, by index
                rows = list(range(start, end))
                if apply_padding and len(rows) < padded and len(value):
                    rows += [len(value) - 1] * (padded - len(rows))
                return value.select(rows)
            if not isinstance(value, (list, tuple, torch.Tensor)):
                raise TypeError(f"split_between_processes splits lists, tuples, tensors, datasets.Dataset and dicts "
                                f"of them, not "
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

    @staticmethod
    def _reset_state(reset_partial_state=False):
        """Forget the Accelerator (as Accelerate's test scripts do before making one with other settings): the
        Accelerator made before can no longer prepare (an AttributeError that says why), AcceleratorState() needs a
        new Accelerator(). reset_partial_state=True: PartialState._reset_state() too."""
        accelerator = _SHARED["accelerator"]
        if accelerator is not None:
            accelerator._state_was_reset = True
        _SHARED["accelerator"] = None
        if reset_partial_state:
            PartialState._reset_state()

    def __repr__(self):
        return (super().__repr__()[:-1] + f", mixed_precision={self.mixed_precision!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")

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


class GradientState:
    """Accelerate's gradient-accumulation bookkeeping (`accelerate.state.GradientState` -> `tasktrain.state`), read
    from the Accelerator: a view, not a copy, so it is always what the Accelerator does.

        accelerator.gradient_state            # the view of that Accelerator
        GradientState()                       # the view of the process's newest Accelerator

    sync_gradients: whether this micro-batch steps (accelerator.sync_gradients); num_steps: the accumulation
    window; adjust_scheduler and sync_with_dataloader: always True here (schedulers step once per optimizer step; a
    window ends with the loader); active_dataloader: the prepared loader being iterated (the innermost), None
    outside any; in_dataloader; end_of_dataloader: whether the active loader yielded its last batch; remainder: the
    real samples of the active loader's last global batch (its length modulo the global batch size; -1 outside a
    loader, or under drop_last). Assigning to them is an error: the Accelerator's loop sets them."""

    def __init__(self, gradient_accumulation_plugin=None):
        if gradient_accumulation_plugin is not None:
            raise TypeError("GradientState(gradient_accumulation_plugin=...): pass the plugin to "
                            "Accelerator(gradient_accumulation_plugin=...); GradientState() reads that Accelerator.")
        self._accelerator = None  # the newest Accelerator, looked up at each read

    @classmethod
    def _of(cls, accelerator):
        view = cls.__new__(cls)
        view._accelerator = accelerator
        return view

    @staticmethod
    def _reset_state():
        """Accelerate's test scripts call it between runs; here every GradientState reads its Accelerator, so there is
        nothing to clear: GradientState() reads the next Accelerator() made."""

    def _source(self):
        return self._accelerator if self._accelerator is not None else _SHARED["accelerator"]

    @property
    def initialized(self) -> bool:
        return self._source() is not None

    @property
    def sync_gradients(self) -> bool:
        accelerator = self._source()
        return True if accelerator is None else accelerator.sync_gradients

    @property
    def num_steps(self) -> int:
        accelerator = self._source()
        return 1 if accelerator is None else accelerator.gradient_accumulation_steps

    @property
    def adjust_scheduler(self) -> bool:
        return True

    @property
    def sync_with_dataloader(self) -> bool:
        return True

    @property
    def sync_each_batch(self) -> bool:
        accelerator = self._source()
        return False if accelerator is None else accelerator._sync_each_batch

    @property
    def plugin_kwargs(self) -> dict:
        return {"num_steps": self.num_steps, "adjust_scheduler": True, "sync_with_dataloader": True,
                "sync_each_batch": self.sync_each_batch}

    @property
    def dataloader_references(self) -> list:
        """None, then the prepared loaders being iterated, outermost first (Accelerate's list)."""
        accelerator = self._source()
        return [None] + ([] if accelerator is None else list(accelerator._active_loaders))

    @property
    def active_dataloader(self):
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return False if loader is None else loader.end_of_dataloader

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return -1 if loader is None else loader.remainder

    def __repr__(self):
        return (f"GradientState(sync_gradients={self.sync_gradients}, num_steps={self.num_steps}, "
                f"in_dataloader={self.in_dataloader}, end_of_dataloader={self.end_of_dataloader}, "
                f"remainder={self.remainder})")
