"""Accelerate's configuration objects under the rename rule (`accelerate.utils.X` -> `tasktrain.utils.X`).

Each is a plain dataclass with Accelerate's field names and defaults. The Accelerator reads every field: a value
it can honour maps onto a tasktrain choice (a strategy option, the precision's GradScaler, the prepared loaders),
any other is a ValueError at construction naming the field and what to do (docs/accelerator.md has the table).
"""
import enum
import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Callable, Optional

from tasktrain.loggers.trackers import LoggerType  # noqa: F401 (re-exported: tasktrain.utils.LoggerType)
# the core Accelerator's own record, under Accelerate's path (tasktrain.utils.ProjectConfiguration)
from tasktrain.trainer.accelerator import ProjectConfiguration  # noqa: F401


class DistributedType(str, enum.Enum):
    """What runs the processes, in Accelerate's words (every member of Accelerate 1.15, so that scripts comparing
    against any of them run). tasktrain's processes are NO, MULTI_CPU, MULTI_GPU, DEEPSPEED or FSDP; the other
    members name hardware or engines tasktrain does not run on, and never describe a tasktrain process."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"

    def __str__(self):
        return self.value


class PrecisionType(str, enum.Enum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"

    def __str__(self):
        return self.value

    @classmethod
    def list(cls):
        return [member.value for member in cls]


class RNGType(str, enum.Enum):
    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    GENERATOR = "generator"

    def __str__(self):
        return self.value


class KwargsHandler:
    """The base of the `kwargs_handlers=[...]` objects: `to_kwargs()` is the fields that differ from the defaults."""

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_kwargs(self):
        default = type(self)().to_dict()
        return {name: value for name, value in self.to_dict().items() if value != default[name]}


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments of the precision's autocast: enabled=False turns it off, cache_enabled is torch.autocast's."""

    enabled: bool = True
    cache_enabled: Optional[bool] = None


class DDPCommunicationHookType(str, enum.Enum):
    """DistributedDataParallelKwargs(comm_hook=..., comm_wrapper=...): torch's DDP communication hooks by name.
    FP16 and BF16 compress the gradients for the all-reduce (BF16 needs NCCL), POWER_SGD and BATCHED_POWER_SGD
    send a low-rank approximation (comm_state_option: PowerSGDState's arguments)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self):
        return self.value


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options of torch's DistributedDataParallel, given to the DDP strategy; comm_hook / comm_wrapper /
    comm_state_option register a communication hook on the DDP wrapper (as the DDP strategy's ddp_comm_hook,
    ddp_comm_wrapper, ddp_comm_state)."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: Any = DDPCommunicationHookType.NO
    comm_wrapper: Any = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)


    def comm_options(self):
        """comm_hook / comm_wrapper / comm_state_option as the DDP strategy's ddp_comm_hook / ddp_comm_wrapper /
        ddp_comm_state (torch's functions and PowerSGDState); a combination Accelerate would drop silently is an
        error here."""
        hook, wrapper = _hook_type("comm_hook", self.comm_hook), _hook_type("comm_wrapper", self.comm_wrapper)
        power_sgd = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
        if wrapper not in (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16):
            raise ValueError(f"DistributedDataParallelKwargs(comm_wrapper={wrapper}): a wrapper compresses what a "
                             "hook sends; use DDPCommunicationHookType.FP16 or BF16.")
        if hook == DDPCommunicationHookType.NO:
            if wrapper != DDPCommunicationHookType.NO or self.comm_state_option:
                raise ValueError("DistributedDataParallelKwargs(comm_wrapper=... / comm_state_option=...) without "
                                 "comm_hook: they act through a hook; pass comm_hook too (e.g. POWER_SGD).")
            return {}
        if self.comm_state_option and hook not in power_sgd:
            raise ValueError(f"DistributedDataParallelKwargs(comm_state_option=...) holds PowerSGD's options; "
                             f"comm_hook={hook} takes none. Drop comm_state_option or use POWER_SGD.")
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
                 DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
                 DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
                 DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook}
        wrappers = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                    DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}
        options = {"ddp_comm_hook": hooks[hook]}
        if wrapper != DDPCommunicationHookType.NO:
            options["ddp_comm_wrapper"] = wrappers[wrapper]
        if hook in power_sgd:
            try:
                options["ddp_comm_state"] = powerSGD_hook.PowerSGDState(None, **self.comm_state_option)
            except TypeError as error:
                raise TypeError(f"DistributedDataParallelKwargs(comm_state_option={self.comm_state_option!r}): "
                                f"the keys are torch's PowerSGDState arguments ({error}).") from error
        return options


def _hook_type(name, value):
    try:
        return DDPCommunicationHookType(value)
    except ValueError:
        names = [member.value for member in DDPCommunicationHookType]
        raise ValueError(f"DistributedDataParallelKwargs({name}={value!r}): use one of {names} "
                         "(DDPCommunicationHookType).") from None


@dataclass
class GradScalerKwargs(KwargsHandler):
    """torch.amp.GradScaler's arguments, for mixed_precision="fp16"."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """torch.distributed.init_process_group's backend and timeout (init_method comes from the launcher)."""

    backend: Optional[str] = "nccl"
    init_method: Optional[str] = None
    timeout: Optional[timedelta] = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """torch.profiler.profile's arguments for `accelerator.profile()`; output_trace_dir: where each process writes
    its Chrome trace (profile_{i}.json, as Accelerate names it)."""

    activities: Optional[list] = None
    schedule_option: Optional[dict] = None
    on_trace_ready: Optional[Callable] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None


@dataclass
class DataLoaderConfiguration:
    """How prepared loaders shard. tasktrain shards per sample, with even batches on every process (the repeats
    are dropped by gather_for_metrics), and a sampler order that is a function of (seed, epoch): the defaults
    below, data_seed and use_stateful_dataloader (torchdata's StatefulDataLoader, docs/data.md) work;
    dispatch_batches=True (rank 0 reads, the others receive their slices; None: an IterableDataset is dispatched)
    and split_batches with it or with an IterableDataset work as Accelerate's (tasktrain/trainer/dispatch.py), as
    split_batches and even_batches do for map-style loaders (tasktrain/trainer/shard.py; docs/accelerator.md)."""

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """num_steps micro-batches per optimizer step, with Accelerate's rules (docs/accelerator.md): the loss is
    divided by num_steps; sync_with_dataloader=True ends a window at a prepared loader's last batch (False:
    windows run on across epochs); sync_each_batch=True all-reduces every micro-batch. adjust_scheduler is
    accepted and, as in Accelerate 1.15 whose GradientState reads it only when it differs from its default (then
    False), changes nothing: a prepared scheduler never moves on a micro-batch that does not step."""

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


class DynamoBackend(str, enum.Enum):
    """torch.compile's backends in Accelerate's names (`Accelerator(dynamo_backend=...)`); NO: no compiling."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"

    def __str__(self):
        return self.value


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How the Accelerator compiles each prepared model: torch.compile(model, backend=..., mode=..., fullgraph=...,
    dynamic=..., options=..., disable=...), the fields that differ from the defaults, as Accelerate passes them.
    use_regional_compilation=True is refused by the Accelerator (compile the repeated blocks yourself). The
    ACCELERATE_DYNAMO_* variables `accelerate launch` sets are not read: give the fields here."""

    backend: Any = "no"
    mode: Optional[str] = "default"
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool = False

    def __post_init__(self):
        name = getattr(self.backend, "value", self.backend)
        try:
            self.backend = DynamoBackend(str(name).upper())
        except ValueError:
            raise ValueError(f"TorchDynamoPlugin(backend={self.backend!r}): use one of "
                             f"{[b.value.lower() for b in DynamoBackend]}.") from None

    def to_kwargs(self):
        """torch.compile's keyword arguments: the backend in torch's (lower-case) name, then the other fields that
        differ from the defaults."""
        kwargs = {"backend": self.backend.value.lower()}
        default = TorchDynamoPlugin()
        for name in ("mode", "fullgraph", "dynamic", "options", "disable"):
            if getattr(self, name) != getattr(default, name):
                kwargs[name] = getattr(self, name)
        return kwargs


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed's options in Accelerate's names, mapped onto tasktrain's DeepSpeed strategy (hf_ds_config: a
    config dict or JSON file path; the other fields fill it)."""

    hf_ds_config: Any = None
    gradient_accumulation_steps: Optional[int] = None
    gradient_clipping: Optional[float] = None
    zero_stage: Optional[int] = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Optional[str] = None
    offload_param_device: Optional[str] = None
    offload_optimizer_nvme_path: Optional[str] = None
    offload_param_nvme_path: Optional[str] = None
    zero3_init_flag: Optional[bool] = None
    zero3_save_16bit_model: Optional[bool] = None

    def strategy(self):
        """The tasktrain DeepSpeed strategy these options describe (a ValueError for one it cannot run)."""
        from tasktrain.strategies.deepspeed import DeepSpeed

        if not self.is_train_batch_min:
            raise ValueError("DeepSpeedPlugin(is_train_batch_min=False) is not supported: the micro-batch size is "
                             "the prepared loader's batch size.")
        for device in ("offload_optimizer", "offload_param"):
            value = getattr(self, f"{device}_device")
            if value not in (None, "none", "cpu", "nvme"):
                raise ValueError(f"DeepSpeedPlugin({device}_device={value!r}): use 'none', 'cpu' or 'nvme'.")
            if getattr(self, f"{device}_nvme_path") is not None and value != "nvme":
                raise ValueError(f"DeepSpeedPlugin({device}_nvme_path=...) is the folder of an offload to disk, and "
                                 f"{device}_device is {value!r}: set {device}_device='nvme', or drop the path.")
        return DeepSpeed(stage=self.zero_stage, config=self.hf_ds_config,
                         offload_optimizer=_offload_device(self.offload_optimizer_device),
                         offload_parameters=_offload_device(self.offload_param_device),
                         nvme_path=one_nvme_path(self.offload_optimizer_nvme_path, self.offload_param_nvme_path,
                                                 "DeepSpeedPlugin(offload_optimizer_nvme_path=..., "
                                                 "offload_param_nvme_path=...)"),
                         zero3_init=bool(self.zero3_init_flag), save_16bit_model=bool(self.zero3_save_16bit_model),
                         gradient_clipping=self.gradient_clipping,
                         accumulate_grad_batches=self.gradient_accumulation_steps)


def _offload_device(device):
    """Accelerate's device name -> DeepSpeed(offload_...=): None (the config decides), False, "cpu" or "nvme"."""
    if device is None:
        return None
    return False if device == "none" else device


def one_nvme_path(optimizer_path, param_path, where):
    """Accelerate names a folder per offload; tasktrain swaps both into one (DeepSpeed keeps them apart inside it:
    zero_stage_3/optimizer and zero_stage_3/<dtype>params)."""
    paths = {os.path.abspath(os.path.expanduser(str(p))) for p in (optimizer_path, param_path) if p not in (None, "")}
    if len(paths) > 1:
        raise ValueError(f"{where} name two folders ({', '.join(sorted(paths))}); tasktrain swaps both offloads into "
                         "one folder (DeepSpeed keeps their files apart inside it): give the same folder to both, or "
                         "write both sections with their nvme_path into a DeepSpeed config file.")
    return paths.pop() if paths else None


@dataclass
class FullyShardedDataParallelPlugin:
    """Accelerate's FSDP options, mapped onto tasktrain's FSDP strategy (FSDP2, torch's fully_shard) by the table
    tasktrain launch's fsdp_config uses too (tasktrain/fsdp_options.py): reshard_after_forward /
    sharding_strategy, cpu_offload, state_dict_type, auto_wrap_policy + transformer_cls_names_to_wrap -> FSDP(wrap=).
    Fields that change nothing under FSDP2 are reported as ignored (a warning); a value tasktrain cannot run is a
    ValueError naming what to do."""

    fsdp_version: Optional[int] = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: Any = None
    use_orig_params: Any = None
    param_init_fn: Any = None
    sync_module_states: Any = None
    forward_prefetch: Any = None
    activation_checkpointing: Any = None
    cpu_ram_efficient_loading: Any = None
    transformer_cls_names_to_wrap: Any = None
    min_num_params: Any = None

    def __post_init__(self):
        self.options()  # a value tasktrain cannot run fails here, where the plugin is written

    def options(self):
        """(FSDP keyword arguments, {field: why it is ignored})."""
        from tasktrain.fsdp_options import fsdp_options

        values = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        return fsdp_options(values, "FullyShardedDataParallelPlugin")

    def strategy(self):
        """The tasktrain FSDP strategy these options describe."""
        import warnings

        from tasktrain.strategies.fsdp import FSDP

        kwargs, ignored = self.options()
        if ignored:
            warnings.warn("FullyShardedDataParallelPlugin: " + "; ".join(f"{k} is ignored ({why})"
                                                                         for k, why in ignored.items()) + ".")
        return FSDP(**kwargs)


def _plain(value):
    """Accelerate's enums (ShardingStrategy.FULL_SHARD, ...) by their names, strings and bools as they are."""
    if isinstance(value, enum.Enum):
        return value.name
    return value
