"""Lightning 2.6's strategy classes under their names, with their constructor arguments, on tasktrain's engines.

`from tasktrain.strategies import DeepSpeedStrategy, FSDPStrategy` (the rename rule of docs/lightning.md): each takes
the arguments of Lightning's class of that name and maps them onto tasktrain's DeepSpeed and FSDP (FSDP2)
strategies. Every argument either does what it does under Lightning or is refused here, at construction, with an
error that names it and what to write instead; one that Lightning would silently ignore in a configuration (an NVMe
setting without offload to disk, a loss-scale setting without fp16, ZeRO settings beside a config of one's own) is
refused too, rather than ignored. DDPStrategy and SingleDeviceStrategy are tasktrain's DDP and SingleDevice under
Lightning's names (ddp.py, single_device.py: they take Lightning's arguments already).

The class tree answers isinstance as Lightning's: every one of these derives from ParallelStrategy (parallel.py), and
each counts the tasktrain strategy it stands for as its own (its __subclasshook__), so that the strategy a name builds
(Trainer(strategy="deepspeed") is tasktrain's DeepSpeed, "fsdp" its FSDP) is a DeepSpeedStrategy / FSDPStrategy, as
under Lightning; DeepSpeed is a DDPStrategy, ModelParallelStrategy is no FSDPStrategy (Lightning's derives from
ParallelStrategy), though tasktrain's derives from FSDP.

Importing this module imports neither deepspeed nor Lightning.
"""
import inspect
import logging
import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

import torch
from torch.nn import Module

from tasktrain.strategies.deepspeed.config import _read_config
from tasktrain.strategies.deepspeed.strategy import DeepSpeed
from tasktrain.strategies.fsdp.strategy import FSDP
from tasktrain.strategies.model_parallel import ModelParallelStrategy
from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.checkpoint_io import CheckpointIO
from tasktrain.plugins.environments import ClusterEnvironment
from tasktrain.plugins.precision import _PRECISION_PLUGIN
from tasktrain.strategies.precision import Precision

if TYPE_CHECKING:  # torch's FSDP1 classes that FSDPStrategy takes, as Lightning's annotations name them
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp.fully_sharded_data_parallel import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    _POLICY = Union[set[type[Module]], Callable[[Module, bool, int], bool], ModuleWrapPolicy]
    _SHARDING_STRATEGY = Union[ShardingStrategy, Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]]

_PG_TIMEOUT = timedelta(minutes=30)  # Lightning's default_pg_timeout


def _check_common(cls, accelerator, parallel_devices, cluster_environment, precision_plugin, checkpoint_io=None):
    """Lightning's arguments that every strategy takes, and what stands for them here. Returns (accelerator,
    precision, parallel_devices) for tasktrain's constructor (the devices as a list of torch.device, or None)."""
    parallel_devices = check_parallel_devices(cls, parallel_devices)
    check_cluster_environment(cls, cluster_environment)
    if checkpoint_io is not None:
        raise ValueError(f"{cls}(checkpoint_io=...): checkpoints are written by the strategy itself (atomic writes, "
                         "sharded directories); leave checkpoint_io out.")
    if accelerator is not None and accelerator not in ("cpu", "cuda", "gpu"):
        raise ValueError(f"{cls}(accelerator={accelerator!r}): give the accelerator to the Trainer "
                         "(Trainer(accelerator='cpu' | 'gpu')), or the name 'cpu' / 'cuda' here.")
    if precision_plugin is not None and not isinstance(precision_plugin, Precision):
        raise ValueError(f"{cls}(precision_plugin={type(precision_plugin).__name__}(...)): give the precision by "
                         "name, Trainer(precision='bf16-mixed'); the strategy builds its engine's plugin for it.")
    return ("cuda" if accelerator == "gpu" else accelerator), precision_plugin, parallel_devices


def check_parallel_devices(cls, parallel_devices):
    """Lightning's `parallel_devices=` of a strategy: the devices of one node, one process each. Under Lightning they
    win over the Trainer's devices= and set its accelerator (the Trainer reads them: runtime.build_runtime). CPU
    devices (their count is what matters), or CUDA devices 0..N-1 in order: tasktrain's ranks run on the first N
    visible GPUs, so other indices are refused, naming CUDA_VISIBLE_DEVICES. Returns a list of torch.device, or None."""
    if parallel_devices is None:
        return None
    try:
        devices = [torch.device(device) for device in parallel_devices]
    except (TypeError, RuntimeError):
        raise ValueError(f"{cls}(parallel_devices={parallel_devices!r}): give a list of devices, e.g. "
                         "[torch.device('cpu')] * 2.") from None
    kinds = {device.type for device in devices}
    if not devices or len(kinds) > 1 or not kinds <= {"cpu", "cuda"}:
        raise ValueError(f"{cls}(parallel_devices={parallel_devices!r}): give a non-empty list of CPU devices or of "
                         "CUDA devices (one process each), not a mix.")
    if kinds == {"cuda"} and [device.index for device in devices] != list(range(len(devices))):
        raise ValueError(f"{cls}(parallel_devices={parallel_devices!r}): tasktrain runs its processes on the first "
                         f"{len(devices)} visible GPUs (cuda:0 .. cuda:{len(devices) - 1}); to use these ones, set "
                         "CUDA_VISIBLE_DEVICES to their indices and give "
                         f"{[f'cuda:{i}' for i in range(len(devices))]}.")
    return devices


def check_cluster_environment(cls, environment):
    """Lightning's `cluster_environment=` of a strategy: one of tasktrain.plugins.environments (the Trainer checks it
    against the launcher's variables, as it checks one in plugins=[...]), or None."""
    from tasktrain.plugins.environments import ClusterEnvironment

    if environment is not None and not isinstance(environment, ClusterEnvironment):
        raise ValueError(f"{cls}(cluster_environment={type(environment).__name__}(...)): give a ClusterEnvironment "
                        "(tasktrain.plugins.environments: LightningEnvironment, TorchElasticEnvironment, "
                        "SLURMEnvironment, KubeflowEnvironment, LSFEnvironment, MPIEnvironment, or a subclass of "
                        "ClusterEnvironment of your own), or leave it out: tasktrain reads the launcher's variables itself.")
    return environment


def _given(cls, args):
    """The arguments of `cls.__init__` in `args` that differ from their defaults."""
    params = inspect.signature(cls.__init__).parameters
    return [name for name, value in args.items()
            if name in params and params[name].default is not inspect.Parameter.empty
            and not _same(value, params[name].default)]


def _same(a, b):
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # an object whose == does not give a bool
        return a is b


# -- DeepSpeed ---------------------------------------------------------------------------------------------------
_NVME_PARAM_ARGS = ("params_buffer_count", "params_buffer_size", "max_in_cpu")
_NVME_OPTIMIZER_ARGS = ("optimizer_buffer_count",)
_AIO_ARGS = ("block_size", "queue_depth", "single_submit", "overlap_events", "thread_count")
_ZERO_ARGS = ("stage", "sub_group_size", "contiguous_gradients", "overlap_comm", "allgather_partitions",
              "reduce_scatter", "allgather_bucket_size", "reduce_bucket_size")
_LOSS_SCALE_ARGS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")
# what builds Lightning's default config, and so what a config of one's own replaces
_CONFIG_ARGS = ("zero_optimization", *_ZERO_ARGS, "offload_optimizer", "offload_parameters", "offload_params_device",
                "offload_optimizer_device", "nvme_path", *_NVME_PARAM_ARGS, *_NVME_OPTIMIZER_ARGS, *_AIO_ARGS,
                "pin_memory", "zero_allow_untested_optimizer", "logging_batch_size_per_gpu", "partition_activations",
                "cpu_checkpointing", "contiguous_memory_optimization", "synchronize_checkpoint_boundary")


class DeepSpeedStrategy(DeepSpeed):
    """Lightning's DeepSpeedStrategy: its arguments, its config (`strategy.config`, built at construction as
    Lightning builds it), on tasktrain's DeepSpeed strategy.

    The config is Lightning's: the ZeRO section from stage, the bucket sizes, overlap_comm, contiguous_gradients,
    sub_group_size, ...; the offload sections from offload_optimizer / offload_parameters and their devices (nvme_path
    and the buffer settings with "nvme"); aio; activation_checkpointing (configured into deepspeed.checkpointing
    after the engine starts, as Lightning does); zero_allow_untested_optimizer; train_micro_batch_size_per_gpu from
    logging_batch_size_per_gpu. `config=` (a dict or a JSON path; or the PL_DEEPSPEED_CONFIG_PATH variable) replaces
    it, as in Lightning. The run's values (micro batch, accumulation, clipping, precision, and the fp16 section from
    the loss-scale arguments) are filled in when the engine starts (tasktrain's DeepSpeed: a disagreement is an
    error, never a silent winner). DeepSpeed 0.19.8 reads aio's `intra_op_parallelism`, not Lightning's
    `thread_count`: both are written.

    Refused with an error naming the fix: parallel_devices, cluster_environment, a Lightning precision_plugin,
    remote_device, exclude_frozen_parameters=True, and any setting that would change nothing in this configuration
    (Lightning ignores those silently).
    """

    DEEPSPEED_ENV_VAR = "PL_DEEPSPEED_CONFIG_PATH"

    @classmethod
    def __subclasshook__(cls, subclass):
        # every DeepSpeed is a DeepSpeedStrategy (Trainer(strategy="deepspeed_stage_3") builds tasktrain's DeepSpeed)
        if cls is DeepSpeedStrategy and DeepSpeed in getattr(subclass, "__mro__", ()):
            return True
        return NotImplemented  # (a subclass of one's own: Python's rules)

    @classmethod
    def register_strategies(cls, strategy_registry):
        """Lightning's: register this class under Lightning's DeepSpeed names in `strategy_registry`
        (StrategyRegistry), with Lightning's arguments ("deepspeed_stage_3_offload_nvme" without remote_device, which
        tasktrain refuses: its parameters are offloaded to the disk by offload_params_device)."""
        register = strategy_registry.register
        register("deepspeed", cls, description="Default DeepSpeed Strategy")
        register("deepspeed_stage_1", cls, description="DeepSpeed with ZeRO Stage 1 enabled", stage=1)
        register("deepspeed_stage_2", cls, description="DeepSpeed with ZeRO Stage 2 enabled", stage=2)
        register("deepspeed_stage_2_offload", cls, description="DeepSpeed ZeRO Stage 2 and CPU Offload", stage=2,
                 offload_optimizer=True)
        register("deepspeed_stage_3", cls, description="DeepSpeed ZeRO Stage 3", stage=3)
        register("deepspeed_stage_3_offload", cls, description="DeepSpeed ZeRO Stage 3 and CPU Offload", stage=3,
                 offload_optimizer=True, offload_parameters=True)
        register("deepspeed_stage_3_offload_nvme", cls, description="DeepSpeed ZeRO Stage 3 and NVMe Offload",
                 stage=3, offload_optimizer=True, offload_parameters=True, offload_params_device="nvme",
                 offload_optimizer_device="nvme")

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: Optional[str] = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        nvme_path: str = "/local_nvme",
        params_buffer_count: int = 5,
        params_buffer_size: int = 100_000_000,
        max_in_cpu: int = 1_000_000_000,
        offload_optimizer_device: str = "cpu",
        optimizer_buffer_count: int = 4,
        block_size: int = 1048576,
        queue_depth: int = 8,
        single_submit: bool = False,
        overlap_events: bool = True,
        thread_count: int = 1,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: Union[str, int] = "auto",
        config: Optional[Union[str, Path, dict[str, Any]]] = None,
        logging_level: int = logging.WARN,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        load_full_weights: bool = False,
        precision_plugin: Optional[_PRECISION_PLUGIN] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = _PG_TIMEOUT,
        exclude_frozen_parameters: bool = False,
    ):
        args = dict(locals())
        args.pop("self")
        args.pop("__class__", None)
        given = set(_given(DeepSpeedStrategy, args))
        accelerator, precision, parallel_devices = _check_common("DeepSpeedStrategy", accelerator, parallel_devices,
                                                                 cluster_environment, precision_plugin)
        if remote_device is not None:
            raise ValueError(f"DeepSpeedStrategy(remote_device={remote_device!r}): tasktrain creates the parameters on "
                             "the run's device (partitioned under stage 3 with zero3_init) and offloads them after; "
                             "write offload_parameters=True, offload_params_device="
                             f"{remote_device!r} instead (stage 3), and leave remote_device out.")
        if exclude_frozen_parameters:
            raise ValueError("DeepSpeedStrategy(exclude_frozen_parameters=True): tasktrain's DeepSpeed checkpoints hold "
                             "every parameter, frozen ones included (a resume restores them all); leave it out, or "
                             "convert a checkpoint and drop the frozen weights from it afterwards.")
        if not isinstance(load_full_weights, bool):
            raise TypeError(f"DeepSpeedStrategy(load_full_weights={load_full_weights!r}): use True or False.")
        if logging_batch_size_per_gpu != "auto" and (isinstance(logging_batch_size_per_gpu, bool) or not isinstance(
                logging_batch_size_per_gpu, int) or logging_batch_size_per_gpu < 1):
            raise ValueError(f"DeepSpeedStrategy(logging_batch_size_per_gpu={logging_batch_size_per_gpu!r}): use "
                             "'auto' (the training loader's batch size) or a positive integer.")
        if config is None and os.environ.get(self.DEEPSPEED_ENV_VAR):
            config = os.environ[self.DEEPSPEED_ENV_VAR]  # Lightning reads its config from there too
        if config is not None:
            beside = sorted(given & set(_CONFIG_ARGS))
            if beside:
                raise ValueError(f"DeepSpeedStrategy(config=..., {', '.join(beside)}): with a config of your own, "
                                 "Lightning builds nothing from these arguments (they would be ignored); write them "
                                 "into the config's sections, or drop config=.")
            lightning_config = _read_config(config)
            zero = lightning_config.get("zero_optimization")
            # Lightning hands its config to DeepSpeed as is: without a ZeRO stage there, DeepSpeed runs stage 0.
            ds_stage = None if isinstance(zero, dict) and "stage" in zero else 0
            micro = lightning_config.get("train_micro_batch_size_per_gpu")
            micro = micro if isinstance(micro, int) and not isinstance(micro, bool) else None
        else:
            self._refuse_unused(given, zero_optimization, stage, offload_optimizer, offload_parameters,
                                offload_params_device, offload_optimizer_device)
            lightning_config = lightning_default_config(args)
            ds_stage = None if zero_optimization else 0
            micro = None if logging_batch_size_per_gpu == "auto" else logging_batch_size_per_gpu
        self._engine_config = None
        super().__init__(stage=ds_stage, config=lightning_config, micro_batch_size=micro, logging_level=logging_level,
                         accelerator=accelerator, precision=precision, process_group_backend=process_group_backend,
                         timeout=timeout if timeout is not None else _PG_TIMEOUT)
        self.cluster_environment = cluster_environment
        self.parallel_devices, self.parallel_devices_of = parallel_devices, "DeepSpeedStrategy"
        self.remote_device = remote_device
        self.load_full_weights = load_full_weights  # a single-file checkpoint's whole weights load at every stage
        self.exclude_frozen_parameters = exclude_frozen_parameters
        self.loss_scale = loss_scale
        self.initial_scale_power = initial_scale_power
        self.loss_scale_window = loss_scale_window
        self.hysteresis = hysteresis
        self.min_loss_scale = min_loss_scale
        self._loss_scale_given = sorted(given & set(_LOSS_SCALE_ARGS))

    @staticmethod
    def _refuse_unused(given, zero_optimization, stage, offload_optimizer, offload_parameters, params_device,
                       optimizer_device):
        """Settings Lightning would put in its config where DeepSpeed reads nothing of them: refused, not ignored."""
        unused = []
        if not zero_optimization:
            unused += [(n, "zero_optimization=False") for n in (*_ZERO_ARGS, "offload_optimizer", "offload_parameters")
                       if n in given]
            offload_optimizer = offload_parameters = False
        params_nvme = offload_parameters and params_device == "nvme"
        optimizer_nvme = offload_optimizer and optimizer_device == "nvme"
        for names, used, why in (
                (("offload_params_device",), offload_parameters, "offload_parameters=False"),
                (("offload_optimizer_device",), offload_optimizer, "offload_optimizer=False"),
                (("pin_memory",), offload_parameters or offload_optimizer, "nothing is offloaded"),
                (_NVME_PARAM_ARGS, params_nvme, "parameters are not offloaded to 'nvme'"),
                (_NVME_OPTIMIZER_ARGS, optimizer_nvme, "the optimizer is not offloaded to 'nvme'"),
                (("nvme_path", *_AIO_ARGS), params_nvme or optimizer_nvme, "nothing is offloaded to 'nvme'")):
            unused += [(n, why) for n in names if n in given and not used]
        if unused:
            said = "; ".join(f"{name} ({why})" for name, why in unused)
            raise ValueError(f"DeepSpeedStrategy: {said}: these settings change nothing in this configuration "
                             "(Lightning would ignore them). Drop them, or turn on what they configure.")
        for name, device in (("offload_params_device", params_device), ("offload_optimizer_device", optimizer_device)):
            if device not in ("cpu", "nvme"):
                raise ValueError(f"DeepSpeedStrategy({name}={device!r}): use 'cpu' or 'nvme'.")

    @property
    def deepspeed_engine(self):  # Lightning's name for the engine
        return self.engine

    @property
    def zero_stage_3(self) -> bool:
        return self.zero_stage() == 3

    # Lightning's `strategy.config`: its config from construction, the engine's (run values filled in) once it runs.
    @property
    def config(self):
        return self._engine_config if self._engine_config is not None else self.user_config

    @config.setter
    def config(self, value):
        self._engine_config = value

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        if self._loss_scale_given and self.precision.name != "16-mixed":
            raise ValueError(f"DeepSpeedStrategy({', '.join(self._loss_scale_given)}=...) configure fp16 loss scaling, "
                             f"and this run's precision is {self.precision.name!r}: drop them, or use "
                             "precision='16-mixed'.")

    def resolved_config(self, micro_batch_size=None, accumulate_grad_batches=None, gradient_clipping=None,
                        precision=None, world_size=None):
        config = super().resolved_config(micro_batch_size, accumulate_grad_batches, gradient_clipping, precision,
                                         world_size)
        if "fp16" not in (self.user_config or {}) and config.get("fp16", {}).get("enabled") is True:
            # Lightning's fp16 section, written when the config has none (_format_precision_config)
            config["fp16"].update(loss_scale=self.loss_scale, initial_scale_power=self.initial_scale_power,
                                  loss_scale_window=self.loss_scale_window, hysteresis=self.hysteresis,
                                  min_loss_scale=self.min_loss_scale)
        return config

    def _initialize(self, micro_batch_size, accumulate_grad_batches, gradient_clipping):
        super()._initialize(micro_batch_size, accumulate_grad_batches, gradient_clipping)
        section = self.config.get("activation_checkpointing")
        if section:
            # As Lightning after deepspeed.initialize: for the user's deepspeed.checkpointing.checkpoint calls.
            # (synchronize_checkpoint_boundary too, which Lightning writes into its config and never passes on.)
            import deepspeed

            deepspeed.checkpointing.configure(
                mpu_=None, partition_activations=section.get("partition_activations"),
                contiguous_checkpointing=section.get("contiguous_memory_optimization"),
                checkpoint_in_cpu=section.get("cpu_checkpointing"),
                synchronize=section.get("synchronize_checkpoint_boundary"), profile=section.get("profile"))


def lightning_default_config(args):
    """The config Lightning 2.6's DeepSpeedStrategy builds from its arguments when none is given (its
    _create_default_config: same sections, same values), plus aio's intra_op_parallelism, which DeepSpeed 0.19.8
    reads in place of thread_count."""
    config = {
        "activation_checkpointing": {key: args[key] for key in (
            "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
            "synchronize_checkpoint_boundary")},
        "aio": {"block_size": args["block_size"], "queue_depth": args["queue_depth"],
                "single_submit": args["single_submit"], "overlap_events": args["overlap_events"],
                "thread_count": args["thread_count"], "intra_op_parallelism": args["thread_count"]},
    }
    if args["zero_optimization"]:
        zero = {key: args[key] for key in _ZERO_ARGS}
        if args["offload_optimizer"]:
            zero["offload_optimizer"] = {"device": args["offload_optimizer_device"], "nvme_path": args["nvme_path"],
                                         "buffer_count": args["optimizer_buffer_count"],
                                         "pin_memory": args["pin_memory"]}
        if args["offload_parameters"]:
            zero["offload_param"] = {"device": args["offload_params_device"], "nvme_path": args["nvme_path"],
                                     "buffer_count": args["params_buffer_count"],
                                     "buffer_size": args["params_buffer_size"], "max_in_cpu": args["max_in_cpu"],
                                     "pin_memory": args["pin_memory"]}
        config = {"zero_allow_untested_optimizer": args["zero_allow_untested_optimizer"], "zero_optimization": zero,
                  **config}
    if args["logging_batch_size_per_gpu"] != "auto":
        config = {"train_micro_batch_size_per_gpu": args["logging_batch_size_per_gpu"], **config}
    return config


# -- FSDP --------------------------------------------------------------------------------------------------------
# FSDP1 options that FSDP2 does by itself (said aloud, changing nothing), and those mapped onto FSDP's arguments
_FSDP1_SELF_MANAGED = {"limit_all_gathers": "FSDP2 limits its all-gathers itself",
                       "forward_prefetch": "FSDP2 prefetches itself",
                       "backward_prefetch": "FSDP2 prefetches itself"}
_HSDP_FIX = ("tasktrain's FSDP shards over all processes; hybrid sharding (replicas of shards) is "
             "ModelParallelStrategy(data_parallel_replicate_size=R, tensor_parallel_size=1) (docs/model_parallel.md)")


class _FSDP1Policy:
    """An FSDP1 auto-wrap policy (a torch.distributed.fsdp.wrap._Policy such as CustomPolicy, or a callable
    `(module, recurse, nonwrapped_numel) -> bool` such as functools.partial(size_based_auto_wrap_policy, ...)),
    applied to pick FSDP2 units / checkpointed blocks by torch's own FSDP1 traversal. FSDPStrategy's _select reads
    it; called as a per-module choice it would be wrong, so it refuses."""

    def __init__(self, policy, argument):
        self.policy, self.argument = policy, argument

    def __call__(self, module):
        raise TypeError(f"{self.argument}: an FSDP1 policy picks modules over the whole tree; FSDPStrategy applies it.")

    def select(self, root):
        from torch.distributed.fsdp.wrap import _Policy, _recursive_wrap

        if isinstance(self.policy, _Policy):
            chosen = self.policy._run_policy(root, ignored_modules=set(), root_kwargs={})
            for module, kwargs in chosen.items():
                if module is not root and kwargs:
                    raise ValueError(f"FSDPStrategy({self.argument}=...): the policy gives {type(module).__name__} "
                                     f"FSDP1 arguments of its own ({sorted(kwargs)}), which FSDP2 units do not take. "
                                     "Return True/False from the policy.")
            chosen = set(chosen)
        else:
            chosen = set()

            def record(module, **kwargs):
                chosen.add(module)
                return module

            _recursive_wrap(root, auto_wrap_policy=self.policy, wrapper_cls=record, ignored_modules=set(),
                            ignored_params=set(), only_wrap_children=True)
        return [name for name, module in root.named_modules() if name and module in chosen]


def _class_policy(policy):
    """A set of layer classes (or torch's ModuleWrapPolicy of them) as FSDP's class set; None if it is not one."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if isinstance(policy, ModuleWrapPolicy):
        return set(policy._module_classes)
    if isinstance(policy, (set, frozenset, list, tuple)) and all(
            isinstance(c, type) and issubclass(c, torch.nn.Module) for c in policy):
        return set(policy)
    return None


def _policy_choice(policy, argument):
    classes = _class_policy(policy)
    if classes is not None:
        return classes
    from torch.distributed.fsdp.wrap import _Policy

    if callable(policy) or isinstance(policy, _Policy):
        return _FSDP1Policy(policy, argument)
    raise TypeError(f"FSDPStrategy({argument}={policy!r}): use a set of layer classes (e.g. {{Block}}), "
                    "ModuleWrapPolicy, CustomPolicy, or a callable policy (module, recurse, nonwrapped_numel) -> bool.")


def _mixed_precision_policy(mixed_precision):
    """Lightning hands FSDP1 a torch.distributed.fsdp.MixedPrecision; FSDP2 takes a MixedPrecisionPolicy. The fields
    that mean the same are carried over; those FSDP2 has no counterpart for are refused when set."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if mixed_precision is None or isinstance(mixed_precision, MixedPrecisionPolicy):
        return mixed_precision
    if not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"FSDPStrategy(mixed_precision={mixed_precision!r}): use torch.distributed.fsdp."
                        "MixedPrecision(...) (Lightning's) or MixedPrecisionPolicy(...) (FSDP2's).")
    if mixed_precision.buffer_dtype not in (None, torch.float32):
        raise ValueError(f"FSDPStrategy(mixed_precision=MixedPrecision(buffer_dtype={mixed_precision.buffer_dtype})):"
                         " FSDP2 leaves buffers in the dtype the module gives them; cast them in the module, or "
                         "leave buffer_dtype None.")
    if mixed_precision.keep_low_precision_grads:
        raise ValueError("FSDPStrategy(mixed_precision=MixedPrecision(keep_low_precision_grads=True)): FSDP2 hands "
                         "the optimizer gradients in the shards' dtype; use precision='bf16-true' for half "
                         "gradients, or leave it False.")
    return MixedPrecisionPolicy(param_dtype=mixed_precision.param_dtype, reduce_dtype=mixed_precision.reduce_dtype,
                                cast_forward_inputs=bool(mixed_precision.cast_forward_inputs or
                                                         mixed_precision.cast_root_forward_inputs))


def _sharding(sharding_strategy):
    """FULL_SHARD / SHARD_GRAD_OP (a name in any case, or torch's ShardingStrategy) -> reshard_after_forward."""
    name = sharding_strategy.upper() if isinstance(sharding_strategy, str) else getattr(sharding_strategy, "name", None)
    if name == "FULL_SHARD":
        return True
    if name == "SHARD_GRAD_OP":
        return False
    if name == "NO_SHARD":
        raise ValueError("FSDPStrategy(sharding_strategy='NO_SHARD') replicates everything, which is DDP: use "
                         "strategy='ddp' (DDPStrategy).")
    if name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        raise ValueError(f"FSDPStrategy(sharding_strategy={name!r}): {_HSDP_FIX}.")
    raise ValueError(f"FSDPStrategy(sharding_strategy={sharding_strategy!r}): use 'FULL_SHARD' or 'SHARD_GRAD_OP' "
                     "(or torch's ShardingStrategy of those names).")


class FSDPStrategy(FSDP):
    """Lightning's FSDPStrategy: its arguments on tasktrain's FSDP (FSDP2, torch's fully_shard).

    - sharding_strategy: "FULL_SHARD" (default) frees gathered parameters after each unit's forward, "SHARD_GRAD_OP"
      keeps them to the backward (FSDP2's reshard_after_forward); strings in any case or torch's ShardingStrategy.
      NO_SHARD (that is DDP) and the HYBRID ones, like device_mesh, are refused with the strategy that does them.
    - auto_wrap_policy: which submodules get their own unit. None (default): the root alone, as Lightning's FSDP1;
      a set of layer classes or ModuleWrapPolicy: every instance; CustomPolicy or an FSDP1 callable policy
      (size_based_auto_wrap_policy, transformer_auto_wrap_policy partials): the modules torch's FSDP1 traversal
      picks with it.
    - activation_checkpointing_policy (or the older activation_checkpointing, a class or list of classes): the
      submodules recomputed in the backward, chosen as auto_wrap_policy's modules are.
    - cpu_offload: True/False or torch's CPUOffload(offload_params=...); mixed_precision: torch's FSDP1
      MixedPrecision (param_dtype, reduce_dtype, cast_forward_inputs carried over; buffer_dtype other than fp32
      and keep_low_precision_grads refused) or an FSDP2 MixedPrecisionPolicy; state_dict_type: "full" (default, one
      file) or "sharded" (a DCP directory).
    - **kwargs (FSDP1's own options): use_orig_params=True (FSDP2 always is), sync_module_states=True (every rank
      starts from rank 0's weights: FSDP's cpu_ram_efficient_loading); limit_all_gathers, forward_prefetch,
      backward_prefetch are accepted with a warning (FSDP2 does these itself); any other is refused.
    """

    @classmethod
    def __subclasshook__(cls, subclass):
        # every FSDP is an FSDPStrategy (Trainer(strategy="fsdp") builds tasktrain's FSDP), but ModelParallelStrategy,
        # an FSDP here, is not one under Lightning, where it derives from ParallelStrategy
        mro = getattr(subclass, "__mro__", ())
        if cls is FSDPStrategy and FSDP in mro and ModelParallelStrategy not in mro:
            return True
        return NotImplemented  # (a subclass of one's own: Python's rules)

    @classmethod
    def register_strategies(cls, strategy_registry):
        """Lightning's: register this class as "fsdp" and "fsdp_cpu_offload" in `strategy_registry`."""
        strategy_registry.register("fsdp", cls, description="Fully Sharded Data Parallel (FSDP) training")
        strategy_registry.register("fsdp_cpu_offload", cls, description="Fully Sharded Data Parallel (FSDP) training "
                                   "with Full Sharding and CPU Offloading", cpu_offload=True)

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[_PRECISION_PLUGIN] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = _PG_TIMEOUT,
        cpu_offload: Union[bool, "CPUOffload", None] = None,
        mixed_precision: Optional["MixedPrecision"] = None,
        auto_wrap_policy: Optional["_POLICY"] = None,
        activation_checkpointing: Optional[Union[type[Module], list[type[Module]]]] = None,
        activation_checkpointing_policy: Optional["_POLICY"] = None,
        sharding_strategy: "_SHARDING_STRATEGY" = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        device_mesh: Optional[Union[tuple[int, int], "DeviceMesh"]] = None,
        **kwargs,
    ):
        accelerator, precision, parallel_devices = _check_common(
            "FSDPStrategy", accelerator, parallel_devices, cluster_environment, precision_plugin, checkpoint_io)
        if device_mesh is not None:
            raise ValueError(f"FSDPStrategy(device_mesh={device_mesh!r}): {_HSDP_FIX}.")
        reshard_after_forward = _sharding(sharding_strategy)
        from_rank0 = False
        for key, value in kwargs.items():
            if key == "use_orig_params" and value is False:
                raise ValueError("FSDPStrategy(use_orig_params=False): FSDP2 keeps the original parameters (what "
                                 "use_orig_params=True means); leave it out.")
            if key == "sync_module_states":
                from_rank0 = bool(value)
            elif key in _FSDP1_SELF_MANAGED:
                warnings.warn(f"FSDPStrategy({key}={value!r}) changes nothing here: {_FSDP1_SELF_MANAGED[key]}.")
            elif key != "use_orig_params":
                raise TypeError(f"FSDPStrategy got the FSDP1 option {key}={value!r}, which tasktrain's FSDP (FSDP2) "
                                "does not have. Its FSDP1 options taken: use_orig_params, sync_module_states, "
                                f"{', '.join(_FSDP1_SELF_MANAGED)}; see docs/fsdp.md for FSDP's own arguments.")
        if activation_checkpointing is not None and activation_checkpointing_policy is not None:
            raise ValueError("You cannot set both `activation_checkpointing` and `activation_checkpointing_policy`. "
                             "Use the latter.")  # Lightning's words
        if activation_checkpointing is not None:
            classes = activation_checkpointing if isinstance(activation_checkpointing, list) else [
                activation_checkpointing]
            warnings.warn(f"`FSDPStrategy(activation_checkpointing={activation_checkpointing})` is deprecated, use "
                          f"`FSDPStrategy(activation_checkpointing_policy={set(classes)})` instead.",
                          DeprecationWarning)
            checkpointed = _policy_choice(set(classes), "activation_checkpointing")
        else:
            checkpointed = None if activation_checkpointing_policy is None else _policy_choice(
                activation_checkpointing_policy, "activation_checkpointing_policy")
        wrap = set() if auto_wrap_policy is None else _policy_choice(auto_wrap_policy, "auto_wrap_policy")
        if cpu_offload is not None and not isinstance(cpu_offload, bool):
            offload_params = getattr(cpu_offload, "offload_params", None)
            if not isinstance(offload_params, bool):
                raise TypeError(f"FSDPStrategy(cpu_offload={cpu_offload!r}): use True/False or torch's "
                                "CPUOffload(offload_params=...).")
            cpu_offload = offload_params
        super().__init__(accelerator=accelerator, precision=precision, wrap=wrap,
                         reshard_after_forward=reshard_after_forward, cpu_offload=bool(cpu_offload),
                         state_dict_type=state_dict_type, mixed_precision=_mixed_precision_policy(mixed_precision),
                         activation_checkpointing=checkpointed, cpu_ram_efficient_loading=from_rank0,
                         process_group_backend=process_group_backend,
                         timeout=timeout if timeout is not None else _PG_TIMEOUT)
        self.sharding_strategy = sharding_strategy
        self.cluster_environment = cluster_environment
        self.parallel_devices, self.parallel_devices_of = parallel_devices, "FSDPStrategy"

    def _select(self, module, choice, argument):
        if isinstance(choice, _FSDP1Policy):
            return choice.select(module)
        try:
            return super()._select(module, choice, argument)
        except ValueError:  # a class set that matches nothing (Lightning's FSDP1 would silently wrap the root alone)
            name = {"wrap": "auto_wrap_policy"}.get(argument, "activation_checkpointing_policy")
            shown = sorted(c.__name__ for c in choice)
            raise ValueError(f"FSDPStrategy({name}={shown}): {type(module).__name__} has no submodule of these "
                             f"classes. Name the classes of its repeated blocks, or leave {name}=None.") from None
