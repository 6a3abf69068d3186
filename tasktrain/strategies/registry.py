"""Strategy names and the "auto" choice.

Explicit arguments win; then what `tasktrain launch` passed (TASKTRAIN_* variables); then torchrun / SLURM
variables; then the hardware. The names themselves are in the table of tasktrain/names.py.
"""
import os

import torch

from tasktrain.exceptions import MisconfigurationException
from tasktrain.names import AUTO_STRATEGY, STRATEGIES
from tasktrain.strategies.environment import detect_environment


# Lightning 2.6's other registered names: those tasktrain runs, as (its name, the arguments they add), and those it
# does not, with what to write instead (refused by name, rather than "unknown").
LIGHTNING_NAMES = {
    "ddp_find_unused_parameters_false": ("ddp", {"find_unused_parameters": False}),
    "ddp_spawn_find_unused_parameters_false": ("ddp_spawn", {"find_unused_parameters": False}),
    "ddp_spawn_find_unused_parameters_true": ("ddp_spawn", {"find_unused_parameters": True}),
}
_FORK = ("forks the processes from the running interpreter, which tasktrain's Trainer does not (forked children hang "
         "once the parent ran multi-threaded ops): use strategy='ddp' in a script (the command is re-run for the other "
         "ranks) or 'ddp_spawn' (module and loaders picklable); in a notebook, define the fit in a function and run "
         "it with tasktrain's notebook_launcher(fn, num_processes=N) (docs/accelerator.md)")
_FORK_NAMES = tuple(f"ddp_{kind}{unused}" for kind in ("fork", "notebook")
                    for unused in ("", "_find_unused_parameters_false", "_find_unused_parameters_true"))
LIGHTNING_REFUSED = {
    **{name: _FORK for name in _FORK_NAMES},
    **{name: "runs on TPUs through torch_xla, which tasktrain does not support: use accelerator='cpu' or 'gpu' with "
             "strategy='ddp', 'fsdp' or 'deepspeed'" for name in ("xla", "xla_debug", "single_xla", "single_tpu")},
}


class _StrategyRegistry(dict):
    """Lightning's StrategyRegistry (`from tasktrain.strategies import StrategyRegistry`): strategy names, each mapped
    to {"strategy": a class (or callable), "init_params": its arguments, "description": ..., "strategy_name": name}.
    Trainer(strategy=name) builds what the name's entry says, so a strategy of one's own registered by name
    (`StrategyRegistry.register("mine", MyStrategy, description="...", arg=1)`, or a class's
    `register_strategies(strategy_registry)` classmethod called with it) is chosen by that name. It holds tasktrain's
    names from the start (tasktrain/names.py, and Lightning's other names tasktrain runs); their classes are imported
    when an entry is read, so that importing tasktrain imports no engine."""

    def register(self, name, strategy=None, description=None, override=False, **init_params):
        """Register `strategy` (a class, or any callable returning a Strategy) under `name`, built with
        `init_params`; as a decorator when `strategy` is left out. A name already there needs override=True."""
        if not (name is None or isinstance(name, str)):
            raise TypeError(f"`name` must be a str, found {name}")
        if name in self and not override:
            raise ValueError(f"'{name}' is already present in the registry. HINT: Use `override=True`.")
        data = {"description": description if description is not None else "", "init_params": init_params}

        def do_register(strategy):
            data["strategy"] = strategy
            data["strategy_name"] = name
            self[name] = data
            return strategy

        if strategy is not None:
            return do_register(strategy)
        return do_register

    def __getitem__(self, name):
        data = super().__getitem__(name)
        if isinstance(data.get("strategy"), _NamedClass):  # a built-in name's class, imported now
            data["strategy"] = data["strategy"].load()
        return data

    def get(self, name, default=None):
        """The strategy registered as `name`, built with its init_params; `default` where there is none (else a
        KeyError listing the names)."""
        if name in self:
            data = self[name]
            return data["strategy"](**data["init_params"])
        if default is not None:
            return default
        available_names = ", ".join(sorted(self.keys())) or "none"
        raise KeyError(f"'{name}' not found in registry. Available names: {available_names}")

    def remove(self, name):
        """Remove the strategy registered as `name`."""
        self.pop(name)

    def available_strategies(self):
        """The registered names."""
        return list(self.keys())

    def __str__(self):
        return "Registered Strategies: {}".format(", ".join(self.keys()))


class _NamedClass:
    """A built-in entry's class, by module and name until it is first read (or called)."""

    def __init__(self, module, cls):
        self.module, self.cls = module, cls

    def load(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.cls)

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)

    def __repr__(self):
        return f"<class '{self.module}.{self.cls}'>"


def _builtin_registry():
    registry = _StrategyRegistry()
    for name, entry in STRATEGIES.items():
        registry.register(name, _NamedClass(entry.module, entry.cls), description=f"tasktrain's {entry.cls}",
                          **entry.kwargs)
    for name, (base, added) in LIGHTNING_NAMES.items():
        entry = STRATEGIES[base]
        registry.register(name, _NamedClass(entry.module, entry.cls), description=f"tasktrain's {entry.cls}",
                          **{**entry.kwargs, **added})
    return registry


StrategyRegistry = _builtin_registry()


def strategy_from_name(name: str, **extra):
    """The strategy StrategyRegistry holds as `name`, built with its init_params and `extra` (which win). Names are
    case-insensitive, as Lightning's ("DDP"): a name not registered as given is looked up in lower case."""
    if name not in StrategyRegistry:
        name = name.lower()
    if name in StrategyRegistry:
        data = StrategyRegistry[name]
        return data["strategy"](**{**data["init_params"], **extra})
    if name in LIGHTNING_REFUSED:
        if name in _FORK_NAMES and "fork" not in torch.multiprocessing.get_all_start_methods():
            raise MisconfigurationException(  # (Lightning's words, where forking is not there at all)
                f"You selected `Trainer(strategy='{name}')` but process forking is not supported on this platform. "
                "We recommend `Trainer(strategy='ddp_spawn')` instead.")
        raise ValueError(f"strategy={name!r} (Lightning's) {LIGHTNING_REFUSED[name]}.")
    raise MisconfigurationException(  # (Lightning's words first)
        f"You selected an invalid strategy name: `strategy={name!r}`. It must be either a string or an instance "
        f"of a Strategy. Valid names: {', '.join([AUTO_STRATEGY, *StrategyRegistry])}, or pass a Strategy instance "
        "(e.g. DDP(...), DeepSpeed(stage=2)).")


def strategy_of_launch(launch):
    """The strategy a `tasktrain launch` config chose (environment.launch_config()): a registry name, or, for
    DeepSpeed (which the launcher names "deepspeed" with its arguments alongside) and FSDP with fsdp_config
    arguments, the configured instance."""
    if launch.strategy == "deepspeed" and launch.deepspeed:
        return strategy_from_name("deepspeed", **launch.deepspeed)
    if launch.strategy == "model_parallel" and os.environ.get("PARALLELISM_CONFIG_TP_SIZE"):  # issue 39
        if int(os.environ.get("PARALLELISM_CONFIG_CP_SIZE", "1")) > 1:
            raise ValueError("parallelism_config_cp_size > 1: context parallelism is the Accelerator's "
                             "(accelerator.maybe_context_parallel); a Trainer's ModelParallelStrategy has no "
                             "context-parallel dimension (Lightning's neither). Use cp_size 1 for a Trainer script.")
        return strategy_from_name("model_parallel", tensor_parallel_size=int(os.environ["PARALLELISM_CONFIG_TP_SIZE"]),
                                  data_parallel_replicate_size=int(
                                      os.environ.get("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "1")))
    if launch.fsdp and launch.strategy in STRATEGIES and STRATEGIES[launch.strategy].distributed_type == "FSDP":
        return strategy_from_name(launch.strategy, **launch.fsdp)  # wrap / activation_checkpointing by class name
    return launch.strategy


class AcceleratorUnavailable(MisconfigurationException, RuntimeError):
    """The accelerator asked for is not on this machine: Lightning's MisconfigurationException, and the RuntimeError
    tasktrain raised before."""


def resolve_accelerator(accelerator) -> str:
    if accelerator in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator not in ("cpu", "cuda", "gpu"):  # (Lightning's words first)
        other = (" tasktrain runs on CPUs and CUDA GPUs (accelerator='cpu' or 'cuda')."
                 if accelerator in ("mps", "tpu", "hpu", "xla") else "")
        raise MisconfigurationException(f"You selected an invalid accelerator name: `accelerator={accelerator!r}`. "
                                        f"Available names are: auto, cpu, cuda, gpu.{other}")
    available = torch.cuda.is_available()
    if accelerator == "gpu" and not available:
        raise AcceleratorUnavailable("No supported gpu backend found! (accelerator='gpu' asks for CUDA GPUs and none "
                                     "is visible; use accelerator='cpu'.)")
    if accelerator == "cuda" and not available:
        raise AcceleratorUnavailable(
            "`CUDAAccelerator` can not run on your system since the accelerator is not available. The following "
            "accelerator(s) is available and can be passed into `accelerator` argument of `Trainer`: ['cpu']. "
            "(accelerator='cuda' was asked for but no CUDA device is visible; use accelerator='cpu'.)")
    return "cuda" if accelerator == "gpu" else accelerator


_DEVICE_IDS = "Device IDs (GPU/TPU) must be an int, a string, a sequence of ints, but you passed"  # (Lightning's)


def refuse_no_devices(devices, accelerator):
    """devices=0, "0" or []: Lightning's refusal, its words (checked before the accelerator is, as Lightning's)."""
    if isinstance(devices, (list, tuple)) and not len(devices) or (type(devices) in (int, str) and devices in (0, "0")):
        if accelerator in (None, "auto"):
            accelerator = "cuda" if torch.cuda.is_available() else "cpu"
        raise MisconfigurationException(
            f"`Trainer(devices={devices!r})` value is not a valid input using {accelerator} accelerator. Use 'auto' "
            "or a positive number of devices (processes on CPU).")


def resolve_devices(devices, accelerator: str, env=None) -> int:
    env = env or detect_environment()
    refuse_no_devices(devices, accelerator)
    if isinstance(devices, (list, tuple)):
        for index in devices:
            if type(index) is not int:  # (a bool is not an index either, as in Lightning)
                raise TypeError(f"{_DEVICE_IDS} a sequence of {type(index).__name__}.")
    elif devices is not None and type(devices) not in (int, str):
        raise TypeError(f"{_DEVICE_IDS} {devices!r}.")
    if devices in (None, "auto", -1, "-1"):
        if env.launcher is not None:
            return env.local_world_size
        return torch.cuda.device_count() if accelerator == "cuda" and devices in (-1, "-1") else 1
    if isinstance(devices, str) and "," in devices:  # Lightning's "2," / "0, 2": a list of device indices
        try:
            devices = [int(d) for d in devices.split(",") if d.strip()]
        except ValueError:
            raise ValueError(f"devices={devices!r}: use 'auto', a positive number, or a list of device indices.") from None
    if isinstance(devices, (list, tuple)):
        # each process runs on the device of its local rank, so only the first N visible devices can be picked; other
        # indices are refused rather than silently moved to 0..N-1 (Lightning would use exactly those devices)
        if list(devices) != list(range(len(devices))):
            raise ValueError(f"devices={list(devices)!r}: tasktrain runs on the first N visible devices; pick these "
                             f"with CUDA_VISIBLE_DEVICES={','.join(map(str, devices))} and devices={len(devices)}.")
        return len(devices)
    try:
        count = int(devices)
    except (TypeError, ValueError):
        raise ValueError(f"devices={devices!r}: use 'auto', a positive number, or a list of device indices.") from None
    if count < 1:
        raise ValueError(f"devices={devices!r}: use 'auto' or a positive number of devices (processes on CPU).")
    return count


def resolve_strategy(strategy, accelerator: str, devices: int, num_nodes: int, env=None):
    """Turn the Trainer's `strategy` argument into a Strategy instance."""
    from tasktrain.strategies.base import Strategy

    env = env or detect_environment()
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a name or a Strategy instance, got {type(strategy).__name__}.")
    if strategy == AUTO_STRATEGY:  # (tasktrain's own class, whatever the registry holds under its name now)
        entry = STRATEGIES["ddp" if devices * num_nodes > 1 or env.world_size > 1 else "single_device"]
        return _NamedClass(entry.module, entry.cls)(**entry.kwargs)
    return strategy_from_name(strategy)
