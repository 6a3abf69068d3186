"""Accelerate's ParallelismConfig (accelerate/parallelism_config.py, 1.15): the sizes of a device mesh of data
parallel replication, data parallel sharding (FSDP2) and tensor parallelism, run by tasktrain's
ModelParallelStrategy with Accelerate's mesh names.

    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    mesh = accelerator.torch_device_mesh          # names "dp_replicate", "dp_shard", "tp"; joint "dp", "dp_shard_cp"
    parallelize_module(model, mesh["tp"], plan)   # the script parallelizes, as under Accelerate
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)   # fully_shard over dp; loaders over dp

The sizes default to Accelerate's environment variables (PARALLELISM_CONFIG_DP_REPLICATE_SIZE, ..._DP_SHARD_SIZE,
..._TP_SIZE, ..._CP_SIZE), then 1. Accelerate's checks and messages: sizes >= 1, tensor parallelism never beside pure
replication, and the product equal to the number of processes. What tasktrain does not run is refused with the
reason: context parallelism (torch's context_parallel needs the GPU attention kernels; on a CPU mesh
aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy), DeepSpeed's sequence parallelism, and
pure replication (dp_replicate_size > 1 alone: that is DDP, the default strategy).

One difference from Accelerate: the mesh always has the three dimensions, size-1 ones included (Accelerate drops
those), so that `mesh["tp"]`, `mesh["dp_shard"]`, ... exist whatever the sizes.
"""
import os
from dataclasses import dataclass
from typing import Optional

from tasktrain.strategies.model_parallel import ModelParallelStrategy

_DIMS = ("dp_replicate", "dp_shard", "tp")


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
        # What tasktrain does not run, refused here, before any process starts
        if self.cp_size > 1:
            raise ValueError(
                f"ParallelismConfig(cp_size={self.cp_size}): context parallelism is not supported by tasktrain. "
                "torch's context_parallel shards attention over the sequence with the GPU attention kernels only "
                "(on a CPU mesh aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy), and "
                "tasktrain has no CUDA implementation of it yet. Use cp_size=1.")
        if self.sp_size > 1:
            raise ValueError(f"ParallelismConfig(sp_size={self.sp_size}): DeepSpeed's sequence parallelism (ALST/"
                             "Ulysses) is not supported by tasktrain. Use sp_size=1.")
        for name in ("tp", "cp", "sp"):
            if getattr(self, f"{name}_handler") is not None:
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
        return ["tp"] if self.tp_enabled else []

    @property
    def active_mesh_dims(self):
        return self.dp_dim_names + self.non_dp_dim_names

    def strategy(self):
        """The strategy that runs this configuration (the Accelerator calls it)."""
        return AccelerateMeshStrategy(self)

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

    def __init__(self, config):
        super().__init__(data_parallel_size=config.data_parallel_size, tensor_parallel_size=config.tp_size)
        self.name = "model_parallel"
        self.config = config

    def mesh_shape(self, world_size):
        config = self.config
        if config.total_size != world_size:
            raise ValueError(f"ParallelismConfig total_size ({config.total_size}) does not match num_processes "
                             f"({world_size}). Please adjust dp_replicate_size/dp_shard_size/tp_size/cp_size/sp_size.")
        return config.data_parallel_size, config.tp_size

    def _make_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        config = self.config
        self.mesh_shape(self.world_size)
        shape = (config.dp_replicate_size, config.dp_shard_size, config.tp_size)
        mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=_DIMS)
        dp = mesh[("dp_replicate", "dp_shard")]._flatten("dp")
        mesh["dp_shard"]._flatten("dp_shard_cp")
        config.device_mesh = mesh
        fsdp_mesh = mesh[("dp_replicate", "dp_shard")] if config.dp_replicate_enabled else mesh["dp_shard"]
        return mesh, fsdp_mesh, (dp.size(), dp.get_local_rank(), config.tp_size)

    def _layout(self):
        config = self.config
        return {"data_parallel": self.data_parallel_size, "tensor_parallel": self.tensor_parallel_size,
                "dp_replicate": config.dp_replicate_size, "dp_shard": config.dp_shard_size}

    def describe(self):
        config = self.config
        return (f"strategy={self.name} (ParallelismConfig: dp_replicate_size={config.dp_replicate_size}, "
                f"dp_shard_size={config.dp_shard_size}, tp_size={config.tp_size}), world_size={self.world_size}, "
                f"device={self.root_device}")
