"""ParallelStrategy: Lightning's base of the strategies whose ranks are processes of one world (its module path
`lightning.pytorch.strategies.parallel`, renamed).

Under Lightning, DDPStrategy, FSDPStrategy and ModelParallelStrategy derive from ParallelStrategy, and
DeepSpeedStrategy from DDPStrategy. Here ParallelStrategy is the plain base of tasktrain's multi-process engines:
`class DDP(ParallelStrategy)`, `class FSDP(Sharded, ParallelStrategy)`, `class DeepSpeed(ClipsInsideStep, Sharded,
ParallelStrategy)`, and so of their Lightning-named subclasses and of ModelParallelStrategy. It is
`ProcessWorld + Strategy` (the world of several processes beside the core contract, strategies/base.py and world.py)
plus Lightning's read-only view of that world (parallel_devices, num_processes, distributed_sampler_kwargs,
block_backward_sync); it changes nothing the engines do. A one-process strategy (SingleDevice, DataParallel) is not
one, as under Lightning.
"""
import abc
import contextlib

import torch

from tasktrain.strategies.base import Strategy
from tasktrain.strategies.world import ProcessWorld


class ParallelStrategy(ProcessWorld, Strategy):
    """A strategy of several processes (Lightning's ParallelStrategy): the ProcessWorld's ranks and collectives, the
    core Strategy's defaults, and Lightning's view of the world. Abstract, as Lightning's: a concrete one says how
    the module is wrapped for its processes (setup_module_and_optimizers), or its ranks would train apart."""

    _run_devices = None  # this node's devices once the run's choices are known (configure)
    # Lightning's attribute: the LayerSync the Trainer was given (sync_batchnorm=True: TorchSyncBatchNorm()), set by
    # the Trainer as Lightning's connector sets it; the Trainer applies it to a fit's module (trainer.py)
    _layer_sync = None

    @abc.abstractmethod
    def setup_module_and_optimizers(self, module, optimizers, plan):
        """The wrapper that makes the processes train one model (DDP's gradient all-reduce, an engine's shards).
        Its default (super()) is the core's one-device set-up: the precision's cast and the move to root_device."""
        return super().setup_module_and_optimizers(module, optimizers, plan)

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        kind = self._pick_device().type  # (cuda or cpu, as root_device will be; read without keeping it)
        self._run_devices = [torch.device(kind, index) for index in range(devices)] if kind == "cuda" else \
            [torch.device(kind)] * devices  # (Lightning's CPUAccelerator / CUDAAccelerator.get_parallel_devices)

    # -- Lightning's view of the world ----------------------------------------------------------------------------
    @property
    def parallel_devices(self):
        """The devices of this node, one a process (Lightning's): those given to the constructor
        (DDPStrategy(parallel_devices=...), which win over the Trainer's devices=), else the run's once a Trainer or
        an Accelerator chose them ([cpu] * devices, or cuda:0 .. cuda:devices-1); None before."""
        return self.given_parallel_devices if self.given_parallel_devices is not None else self._run_devices

    @parallel_devices.setter
    def parallel_devices(self, devices):
        self.given_parallel_devices = devices

    @property
    def num_processes(self) -> int:
        """The processes of this node: len(parallel_devices), 0 before they are known (Lightning's)."""
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def distributed_sampler_kwargs(self) -> dict:
        """What a DistributedSampler of this run takes (Lightning's): the data-parallel processes and this one's
        place among them, by which the Trainer shards its loaders (num_nodes x num_processes and the global rank,
        except under ModelParallelStrategy, whose tensor-parallel ranks share batches); before the run's choices,
        Lightning's count from parallel_devices (0 without them)."""
        if self._run_devices is None:
            return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    @contextlib.contextmanager
    def block_backward_sync(self):
        """Lightning's: hold back DistributedDataParallel's gradient all-reduce in the backwards inside (the
        wrapper's no_sync), where the model is one; elsewhere nothing. The loop does this itself inside accumulation
        windows (no_backward_sync); this is for a script of one's own."""
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            with self.model.no_sync():
                yield None
        else:
            yield None


def _is_distributed(strategy):
    """True, as Lightning's DDPStrategy / DeepSpeedStrategy / FSDPStrategy say (its legacy property), for a script
    that reads it. Set after the class body: a class body that sets is_distributed is refused (base._RETIRED), since
    tasktrain reads a strategy's processes from its capabilities (MultiProcess), never from this property."""
    return True


ParallelStrategy.is_distributed = property(_is_distributed)
