"""DDP: torch DistributedDataParallel, one process per device, gloo on CPU and nccl on CUDA."""
import contextlib
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from tasktrain.strategies.base import Strategy
from tasktrain.strategies.environment import detect_environment

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class _TrainingStepForward(torch.nn.Module):
    """DDP syncs the gradients of what went through its forward: route training_step through it."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, batch, batch_idx):
        return self.module.training_step(batch, batch_idx)


class DDP(Strategy):
    name = "ddp"
    is_distributed = True

    def __init__(self, accelerator=None, precision=None, process_group_backend=None, timeout=timedelta(minutes=30),
                 start_method="popen", sync_batchnorm=False, **ddp_kwargs):
        super().__init__(accelerator=accelerator, precision=precision)
        if start_method not in ("popen", "spawn"):
            raise ValueError(f"DDP start_method must be 'popen' (re-run the command) or 'spawn', got {start_method!r}.")
        self.process_group_backend = process_group_backend
        self.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
        self.start_method = start_method
        self.sync_batchnorm = sync_batchnorm
        self.ddp_kwargs = ddp_kwargs
        self.launcher = None
        self._owns_group = False
        self.env = None

    # -- who am I ------------------------------------------------------------------------------------------
    @property
    def global_rank(self):
        return self.env.global_rank if self.env else 0

    @property
    def local_rank(self):
        return self.env.local_rank if self.env else 0

    @property
    def node_rank(self):
        return self.env.node_rank if self.env else 0

    @property
    def world_size(self):
        return self.env.world_size if self.env else self.devices * self.num_nodes

    # -- lifecycle -----------------------------------------------------------------------------------------
    def needs_launch(self) -> bool:
        return detect_environment().launcher is None and self.devices * self.num_nodes > 1

    def setup_environment(self):
        if self.needs_launch() and self.start_method == "popen":
            from tasktrain.strategies.launcher import SubprocessLauncher

            self.launcher = SubprocessLauncher(self.devices, self.num_nodes)
            self.launcher.launch()
        self.env = detect_environment()
        self._root_device = None
        expected = self.devices * self.num_nodes
        if self.env.world_size != expected:
            raise RuntimeError(
                f"The launcher formed a world of {self.env.world_size} processes, but the Trainer asked for "
                f"devices={self.devices} x num_nodes={self.num_nodes} = {expected}. Make them agree: pass "
                f"devices={self.env.local_world_size}, num_nodes={max(1, self.env.world_size // max(1, self.env.local_world_size))} "
                "to the Trainer, or change --nproc_per_node / --nnodes of the launcher."
            )
        super().setup_environment()
        if not dist.is_initialized():
            backend = self.process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo")
            os.environ.setdefault("MASTER_ADDR", self.env.main_address)
            if self.env.main_port:
                os.environ.setdefault("MASTER_PORT", str(self.env.main_port))
            dist.init_process_group(backend, rank=self.env.global_rank, world_size=self.env.world_size,
                                    timeout=self.timeout)
            self._owns_group = True
        elif dist.get_world_size() != self.env.world_size:
            raise RuntimeError(
                f"A process group of size {dist.get_world_size()} already exists but the environment says "
                f"WORLD_SIZE={self.env.world_size}."
            )

    def setup(self, module, optimizers):
        super().setup(module, optimizers)
        if self.sync_batchnorm:
            self.module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.module)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self.model = torch.nn.parallel.DistributedDataParallel(
            _TrainingStepForward(self.module), device_ids=device_ids, **self.ddp_kwargs
        )
        return self.model, self.optimizers

    def teardown(self):
        # gloo can abort at interpreter exit if the wrapper outlives the group: drop it first, then the group.
        self.model = None
        self.optimizers = []
        gc.collect()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
        if self.launcher is not None:
            launcher, self.launcher = self.launcher, None
            launcher.join()

    # -- the step ------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        with self.precision.autocast():
            return self.model(batch, batch_idx)

    def no_backward_sync(self, enabled: bool):
        return self.model.no_sync() if enabled else contextlib.nullcontext()

    # -- collectives -----------------------------------------------------------------------------------------
    def reduce(self, tensor, op="mean"):
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.tensor(tensor, device=self.root_device)
        out = tensor.detach().clone().to(self.root_device)
        dist.all_reduce(out, op=_REDUCE_OPS[op])
        if op == "mean":
            out = out / self.world_size
        return out

    def all_gather(self, tensor):
        tensor = tensor.detach().contiguous().to(self.root_device)
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor)
        return torch.stack(out)

    def all_gather_object(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj, src=0):
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self, name=None):
        if dist.is_initialized():
            dist.barrier()

    def describe(self):
        backend = dist.get_backend() if dist.is_initialized() else "?"
        return f"strategy={self.name}, world_size={self.world_size}, backend={backend}, device={self.root_device}"
