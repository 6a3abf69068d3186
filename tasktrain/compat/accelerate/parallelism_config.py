"""Accelerate's ParallelismConfig (accelerate/parallelism_config.py, 1.15): the sizes of a device mesh of data
parallel replication, data parallel sharding (FSDP2), context parallelism and tensor parallelism, run by tasktrain's
ModelParallelStrategy with Accelerate's mesh names.

    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    mesh = accelerator.torch_device_mesh   # "dp_replicate", "dp_shard", "cp", "tp"; joint "dp", "dp_shard_cp", "dp_cp"
    parallelize_module(model, mesh["tp"], plan)   # the script parallelizes, as under Accelerate
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)   # fully_shard over dp; loaders over dp

The sizes default to Accelerate's environment variables (PARALLELISM_CONFIG_DP_REPLICATE_SIZE, ..._DP_SHARD_SIZE,
..._TP_SIZE, ..._CP_SIZE), then 1. Accelerate's checks and messages: sizes >= 1, tensor/context parallelism never
beside pure replication, the product equal to the number of processes, an fsdp_plugin only with a dimension to shard
over. Context parallelism (cp_size > 1) runs on CUDA only: torch's context_parallel shards attention over the
sequence with the GPU attention kernels, and on a CPU mesh aten._scaled_dot_product_flash_attention_for_cpu has no
sharding strategy, so it is refused on CPU when the Accelerator is made. Refused with the reason: DeepSpeed's
sequence parallelism, tensor-parallel handlers, and pure replication (dp_replicate_size > 1 alone: that is DDP, the
default strategy).

One difference from Accelerate: the mesh always has the four dimensions, size-1 ones included (Accelerate drops
those), so that `mesh["tp"]`, `mesh["cp"]`, `mesh["dp_cp"]`, ... exist whatever the sizes.
"""
import os
from dataclasses import dataclass
from typing import Optional

from tasktrain.strategies.model_parallel import ModelParallelStrategy

_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")  # Accelerate's order
CP_ON_CPU = ("context parallelism (cp_size > 1) needs CUDA: torch's context_parallel shards attention over the "
             "sequence with the GPU attention kernels, and on a CPU mesh "
             "aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy")


@dataclass
class TorchContextParallelConfig:
    """Accelerate's cp_handler: torch's rotate method for context parallelism ("allgather", the default, or
    "alltoall"; PARALLELISM_CONFIG_CP_COMM_STRATEGY when not given)."""
    cp_comm_strategy: Optional[str] = None

    def __post_init__(self):
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or "
                             "'alltoall'.")


@dataclass
class ParallelismConfig:
    dp_replicate_size: Optional[int] = None
    dp_shard_size: Optional[int] = None
    tp_size: Optional[int] = None
    cp_size: Optional[int] = None
    cp_backend: Optional[str] = None
    sp_size: Optional[int] = None
    sp_backend: Optional[str] = None
    tp_handler: object = None
    cp_handler: object = None
    sp_handler: object = None
    device_mesh = None

    def __post_init__(self):
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            if getattr(self, f"{name}_size") is None:
                setattr(self, f"{name}_size", int(os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}_SIZE", "1")))
            if getattr(self, f"{name}_size") < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {getattr(self, f'{name}_size')}")
        self.cp_backend = self.cp_backend or os.environ.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        self.sp_backend = self.sp_backend or os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.cp_backend != "torch":
            raise ValueError(f"cp_backend must be one of ['torch'], but got {self.cp_backend}")
        if self.sp_backend != "deepspeed":
            raise ValueError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend}")
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError("Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                             f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. "
                             "Please set either cp_size=1 or sp_size=1.")
        if (self.tp_size > 1 or self.cp_size > 1) and self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
                "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and "
                "dp_replicate_size == 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size == 1 and "
                "dp_shard_size > 1 to compose HSDP + TP/CP for 3D parallel.")
        # What tasktrain does not run, refused here, before any process starts (cp on CPU: by the Accelerator)
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            if not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise TypeError(f"ParallelismConfig(cp_handler=...): use tasktrain.utils.TorchContextParallelConfig("
                                f"cp_comm_strategy=...), got {type(self.cp_handler).__name__}.")
            self.cp_comm_strategy = self.cp_handler.cp_comm_strategy  # "allgather" or "alltoall", checked there
        if self.sp_size > 1:
            raise ValueError(f"ParallelismConfig(sp_size={self.sp_size}): DeepSpeed's sequence parallelism (ALST/"
                             "Ulysses) is not supported by tasktrain. Use sp_size=1.")
        for name in ("tp", "sp"):  # a handler whose size is 1 is ignored with Accelerate's warning (Accelerator)
            if getattr(self, f"{name}_handler") is not None and getattr(self, f"{name}_size") > 1:
                raise ValueError(f"ParallelismConfig({name}_handler=...): tasktrain takes no {name} handler (its "
                                 "options, such as async tensor parallelism, are not supported). Leave it None.")
        if self.dp_replicate_size > 1 and self.dp_shard_size == 1 and self.tp_size == 1:
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}) alone is pure data parallelism: "
                "leave parallelism_config out (the default strategy is DDP), and use DistributedDataParallelKwargs "
                "for its options, as Accelerate's documentation says.")
        self._sizes = {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                       "cp": self.cp_size, "sp": self.sp_size}

    # -- Accelerate's names for the sizes ------------------------------------------------------------------------
    @property
    def total_size(self):
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size

    @property
    def data_parallel_size(self):
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self):
        return self.tp_size * self.cp_size * self.sp_size

    @property
    def dp_replicate_enabled(self):
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self):
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self):
        return self.tp_size > 1

    @property
    def cp_enabled(self):
        return self.cp_size > 1

    @property
    def sp_enabled(self):
        return self.sp_size > 1

    @property
    def dp_dim_names(self):
        return [name for name, on in (("dp_replicate", self.dp_replicate_enabled),
                                      ("dp_shard", self.dp_shard_enabled)) if on]

    @property
    def non_dp_dim_names(self):
        return [name for name, on in (("tp", self.tp_enabled), ("cp", self.cp_enabled)) if on]

    @property
    def dp_shard_cp_dim_names(self):
        return [name for name, on in (("dp_shard", self.dp_shard_enabled), ("cp", self.cp_enabled)) if on]

    @property
    def dp_cp_dim_names(self):
        return self.dp_dim_names + (["cp"] if self.cp_enabled else [])

    @property
    def fsdp_dim_names(self):
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self):
        return self.dp_dim_names + self.non_dp_dim_names

    def strategy(self, fsdp_options=None):
        """The strategy that runs this configuration (the Accelerator calls it, with an fsdp_plugin's options)."""
        return AccelerateMeshStrategy(self, fsdp_options)

    def get_device_mesh(self, device_type=None):
        if self.device_mesh is None:
            raise ValueError("ParallelismConfig.get_device_mesh: the mesh is made by the Accelerator this "
                             "configuration was given to (accelerator.torch_device_mesh).")
        if device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(f"The device_mesh is already created with device type {self.device_mesh.device_type}. "
                             f"However, you are trying to get a device mesh with device_type {device_type}.")
        return self.device_mesh


class AccelerateMeshStrategy(ModelParallelStrategy):
    """ModelParallelStrategy on Accelerate's mesh: ("dp_replicate", "dp_shard", "tp"), with the joint dimensions
    "dp" (data parallel: the loaders are sharded over it) and "dp_shard_cp" (what FSDP shards over). fully_shard runs
    over ("dp_replicate", "dp_shard"): HSDP when both are larger than 1."""

    def __init__(self, config, fsdp_options=None):
        """fsdp_options: an fsdp_plugin's FSDP(...) arguments (wrap, reshard_after_forward, cpu_offload,
        mixed_precision, activation_checkpointing, state_dict_type) for the units prepare shards."""
        options = dict(fsdp_options or {})
        state_dict_type = options.pop("state_dict_type", "sharded")
        if options.pop("cpu_ram_efficient_loading", False):
            raise ValueError("FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True) beside parallelism_config "
                             "is not supported: rank 0's whole weights are not broadcast onto tensor-parallel "
                             "shards. Build the model on every rank (the same seed), or leave it off.")
        super().__init__(data_parallel_size=config.data_parallel_size,
                         tensor_parallel_size=config.tp_size * config.cp_size,
                         save_distributed_checkpoint=state_dict_type == "sharded", **options)
        self.name = "model_parallel"
        self.config = config

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        if self.config.cp_enabled:  # first: the reason, before any count of processes
            import torch

            kind = accelerator if accelerator not in (None, "auto") else \
                ("cuda" if torch.cuda.is_available() else "cpu")
            if kind != "cuda":
                raise ValueError(f"ParallelismConfig(cp_size={self.config.cp_size}): {CP_ON_CPU}. Use cp_size=1 "
                                 "on CPU.")
        super().configure(accelerator, devices, num_nodes, precision)

    def mesh_shape(self, world_size):
        config = self.config
        if config.total_size != world_size:
            raise ValueError(f"ParallelismConfig total_size ({config.total_size}) does not match num_processes "
                             f"({world_size}). Please adjust dp_replicate_size/dp_shard_size/tp_size/cp_size/sp_size.")
        return config.data_parallel_size, config.tp_size * config.cp_size

    def _make_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        config = self.config
        self.mesh_shape(self.world_size)
        shape = (config.dp_replicate_size, config.dp_shard_size, config.cp_size, config.tp_size)
        mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=_DIMS)
        dp = mesh[("dp_replicate", "dp_shard")]._flatten("dp")  # the data is cut by it: cp and tp ranks read alike
        shard_cp = mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")  # what FSDP shards over (cp ranks hold shards)
        mesh[("dp_replicate", "dp_shard", "cp")]._flatten("dp_cp")  # what a loss is averaged over
        config.device_mesh = mesh
        # (the flattened meshes as _flatten returned them: slicing one from the root is deprecated in torch)
        if not config.dp_replicate_enabled:
            fsdp_mesh = shard_cp
        elif not config.cp_enabled:
            fsdp_mesh = mesh[("dp_replicate", "dp_shard")]
        else:
            fsdp_mesh = mesh[("dp_replicate", "dp_shard_cp")]  # HSDP over replicas of (dp_shard x cp) shards
        # (tensor_parallel_size: the processes that read the same batch, tp x cp; see reduce)
        return mesh, fsdp_mesh, (dp.size(), dp.get_local_rank(), config.tp_size * config.cp_size)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        if self.config.tp_enabled:  # loss_parallel: only where the logits may be sharded over the vocabulary
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        return super(ModelParallelStrategy, self).backward(closure_loss, optimizer, *args, **kwargs)

    def context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        """torch's context_parallel over the "cp" dimension (CUDA only: configure refused it on CPU)."""
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(self.config.cp_comm_strategy)
        return context_parallel(self.device_mesh["cp"], buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                no_restore_buffers=no_restore_buffers)

    def _layout(self):
        config = self.config
        return {"data_parallel": self.data_parallel_size, "tensor_parallel": config.tp_size,
                "dp_replicate": config.dp_replicate_size, "dp_shard": config.dp_shard_size, "cp": config.cp_size}

    def describe(self):
        config = self.config
        return (f"strategy={self.name} (ParallelismConfig: dp_replicate_size={config.dp_replicate_size}, "
                f"dp_shard_size={config.dp_shard_size}, cp_size={config.cp_size}, tp_size={config.tp_size}), "
                f"world_size={self.world_size}, device={self.root_device}")
