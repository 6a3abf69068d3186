"""DDP: torch DistributedDataParallel, one process per device, gloo on CPU and nccl on CUDA.

The processes, the process group and the collectives are the ProcessWorld's (world.py: who starts the processes,
how the group lives and ends); this module is the wrapper: DistributedDataParallel around what the loop calls, its
gradient sync held back inside accumulation windows, and rebuilt when the trainable parameters change.
"""
import contextlib
import inspect
from datetime import timedelta

import torch
import torch.distributed as dist

from tasktrain.strategies.base import Strategy, _StepWrapper, step_arguments
from tasktrain.strategies.world import ProcessWorld

_DDP_OPTIONS = set(inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters) - {
    "self", "module", "device_ids", "output_device", "process_group"}


class _TrainingStepForward(_StepWrapper):
    """DDP syncs the gradients of what went through its forward: route training_step through it."""

    def forward(self, batch, batch_idx):
        step = self.module.training_step
        return step(*step_arguments(step, batch, batch_idx))


class DDP(ProcessWorld, Strategy):
    """Distributed data parallel: one process per device (per CPU "device" on a CPU machine).

    Args:
        process_group_backend: "gloo" or "nccl"; default nccl on CUDA, gloo on CPU.
        timeout: how long a collective may wait for the other ranks (a timedelta or seconds) before it fails.
            A rank that dies is noticed sooner: see the failure notes in docs/distributed.md.
        start_method: "popen" re-runs the command for the other ranks; "spawn" starts them with
            torch.multiprocessing (the module and loaders must then be picklable).
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm (CUDA only: torch runs SyncBatchNorm on GPUs).
        **ddp_kwargs: options of torch.nn.parallel.DistributedDataParallel (find_unused_parameters,
            static_graph, gradient_as_bucket_view, bucket_cap_mb, broadcast_buffers, ...).
    """

    name = "ddp"

    def __init__(self, accelerator=None, precision=None, process_group_backend=None, timeout=timedelta(minutes=30),
                 start_method="popen", sync_batchnorm=False, **ddp_kwargs):
        super().__init__(accelerator=accelerator, precision=precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method)
        unknown = sorted(set(ddp_kwargs) - _DDP_OPTIONS)
        if unknown:
            raise TypeError(f"DDP got unknown option(s) {unknown}. It takes the options of torch's "
                            f"DistributedDataParallel: {sorted(_DDP_OPTIONS)}.")
        if start_method == "spawn":
            self.name = "ddp_spawn"
        self.sync_batchnorm = sync_batchnorm
        self.ddp_kwargs = ddp_kwargs
        self._wrappers = []  # the DDP wrappers made by setup_module_and_optimizers, released at teardown
        self._target, self._calls_steps = None, True  # what the wrapper wraps (built again when it must be)

    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        if ddp_kwargs:
            unknown = sorted(set(ddp_kwargs) - _DDP_OPTIONS)
            if unknown:
                raise TypeError(f"DistributedDataParallel options {unknown} are not known; it takes "
                                f"{sorted(_DDP_OPTIONS)}.")
        super().configure_processes(process_group_backend, timeout)
        if ddp_kwargs:
            self.ddp_kwargs = {**self.ddp_kwargs, **ddp_kwargs}

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        if self.sync_batchnorm and self.accelerator == "cpu":
            raise ValueError(
                "sync_batchnorm=True needs CUDA devices: torch.nn.SyncBatchNorm runs on GPUs only. On CPU leave "
                "sync_batchnorm off (each process then normalises with its own batch statistics)."
            )

    def setup_module_and_optimizers(self, module, optimizers, plan):
        """DDP around what the loop calls: the module's training_step (the Trainer), or the module itself (the
        Accelerator: its own forward then syncs the gradients)."""
        super().setup_module_and_optimizers(module, optimizers, plan)
        if self.sync_batchnorm:
            convert_sync_batchnorm(module)
        target = _TrainingStepForward(module) if plan.calls_steps else module
        self._target, self._calls_steps = target, plan.calls_steps
        # manual optimisation: backward runs inside training_step, i.e. inside DDP's forward, before DDP has
        # readied its reducer (it does at the forward's end): backward() readies it first (Lightning's pre_backward)
        self._backward_in_forward = plan.calls_steps and plan.training and not plan.automatic_optimization
        self.model = self._wrap(target)
        return self.model, self.optimizers

    def _wrap(self, target):
        if not any(p.requires_grad for p in target.parameters()):
            # Nothing to synchronise (a frozen model in predict/validate): torch's DDP refuses such a module.
            return target
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        wrapper = torch.nn.parallel.DistributedDataParallel(target, device_ids=device_ids, **self.ddp_kwargs)
        self._wrappers.append(wrapper)
        return wrapper

    def trainable_parameters_changed(self, who: str):
        """torch's DDP syncs the gradients of the parameters that required them when it was built: one unfrozen
        later would train apart on each rank. So the wrapper is built again, on every rank together (its
        construction checks and broadcasts the module's state, which the ranks already share)."""
        if self._target is None:
            return
        if not self._calls_steps:
            raise ValueError(f"{who} changed which parameters require gradients after the model was prepared, and "
                             "the DDP wrapper the script holds syncs only those that required them then. Set "
                             "requires_grad before accelerator.prepare, or prepare the model again.")
        for name in ("reducer", "logger"):  # the old wrapper's hooks on the parameters go with it
            if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
                self.model.__dict__.pop(name, None)
        self.model = self._wrap(self._target)

    def teardown(self):
        # The script may still hold the wrappers (the Accelerator's prepared models live in its globals): what ties
        # them to the group (the reducer) goes now, before the world ends (ProcessWorld.teardown).
        for wrapper in self._wrappers:
            for name in ("reducer", "logger", "process_group"):
                wrapper.__dict__.pop(name, None)
        self._wrappers = []
        self._target = None
        super().teardown()

    # -- the step ------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        with self.forward_context():
            return self.model(batch, batch_idx)

    def backward(self, loss, *args, **kwargs):
        model = self.model
        wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        if wrapped and getattr(self, "_backward_in_forward", False):
            _prepare_for_backward(model, loss)
        super().backward(loss, *args, **kwargs)

    def no_backward_sync(self, enabled: bool, model=None):
        model = self.model if model is None else model
        if enabled and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def describe(self):
        backend = dist.get_backend() if dist.is_initialized() else "?"
        launcher = self.env.launcher if self.env and self.env.launcher else "none"
        return (f"strategy={self.name}, world_size={self.world_size} (devices={self.devices} x "
                f"num_nodes={self.num_nodes}), backend={backend}, device={self.root_device}, launcher={launcher}")


def _prepare_for_backward(model, loss):
    """Ready DDP's reducer for a backward that runs inside its forward (each manual_backward of a training_step),
    as DDP's own forward does at its end: with find_unused_parameters, the parameters the loss does not reach are
    marked as ready, so that an optimizer's step over a part of the model (a GAN's generator) does not wait for
    gradients that never come."""
    if not (torch.is_grad_enabled() and model.require_backward_grad_sync):
        model.require_forward_param_sync = False
        return
    model.require_forward_param_sync = True
    outputs = [loss] if model.find_unused_parameters and not model.static_graph else []
    model.reducer._rebuild_buckets()  # what DDP's forward does first; without it the reducer's state is inconsistent
    model.reducer.prepare_for_backward(outputs)


def convert_sync_batchnorm(module):
    """Replace the BatchNorm layers inside `module` by SyncBatchNorm, in place.

    torch's converter returns a new object for a BatchNorm it meets, so the caller's module must be the
    container: its children are swapped, the module object (the one the user and the Trainer hold) stays. The
    new layers share the old parameters, so an optimizer built before the conversion still updates them.
    """
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        raise TypeError("convert_sync_batchnorm needs the module that holds the BatchNorm layers, not a BatchNorm.")
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    assert converted is module  # children are replaced in place for a non-BatchNorm container
    return module
