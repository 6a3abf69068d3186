"""DDP: torch DistributedDataParallel, one process per device, gloo on CPU and nccl on CUDA.

The processes, the process group and the collectives are the ProcessWorld's (world.py: who starts the processes,
how the group lives and ends; DDP derives from ParallelStrategy, parallel.py, which is ProcessWorld + Strategy); this
module is the wrapper: DistributedDataParallel around what the loop calls, its gradient sync held back inside
accumulation windows, and rebuilt when the trainable parameters change. DDPStrategy (below) is Lightning's name of it.
"""
import contextlib
import inspect
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Literal, Optional

import torch
import torch.distributed as dist

from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.checkpoint_io import CheckpointIO
from tasktrain.plugins.precision import _PRECISION_PLUGIN
from tasktrain.strategies.base import _StepWrapper
from tasktrain.strategies.parallel import ParallelStrategy
from tasktrain.strategies.world import ProcessWorld

if TYPE_CHECKING:  # (plugins.environments imports the strategies package: named for the annotation only)
    from tasktrain.plugins.environments import ClusterEnvironment

_DDP_PARAMETERS = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
_DDP_OWNED = {"device_ids", "output_device", "process_group"}  # the strategy sets these itself
_DDP_OPTIONS = set(_DDP_PARAMETERS) - {"self", "module"} - _DDP_OWNED


def _given_ddp_options(ddp_kwargs):
    """The DistributedDataParallel options to pass on: a config parser that fills in every keyword a strategy
    forwards (jsonargparse under TaskCLI: `--trainer.strategy=DDP` passes all of DistributedDataParallel's, at torch's
    defaults, as Lightning's DDPStrategy receives them) gives the strategy-owned ones too, as None: left out (the
    strategy sets them). One of them given other than None is an error."""
    owned = sorted(name for name in _DDP_OWNED if ddp_kwargs.get(name) is not None)
    if owned:
        raise TypeError(f"DDP got {owned}: the strategy sets DistributedDataParallel's device_ids, output_device and "
                        "process_group itself (from devices= and the process group it forms). Leave them out.")
    return {name: value for name, value in ddp_kwargs.items() if name not in _DDP_OWNED}


# Lightning's DDPStrategy arguments for communication hooks (docs/distributed.md, "Communication hooks")
_COMM_OPTIONS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


class _TrainingStepForward(_StepWrapper):
    """DDP syncs the gradients of what went through its forward: route training_step through it."""

    def forward(self, *args, **kwargs):
        return self.module.training_step(*args, **kwargs)


class DDP(ParallelStrategy):
    """Distributed data parallel: one process per device (per CPU "device" on a CPU machine).

    Args:
        process_group_backend: "gloo" or "nccl"; default nccl on CUDA, gloo on CPU.
        timeout: how long a collective may wait for the other ranks (a timedelta or seconds) before it fails.
            A rank that dies is noticed sooner: see the failure notes in docs/distributed.md.
        start_method: "popen" re-runs the command for the other ranks; "spawn" starts them with
            torch.multiprocessing (the module and loaders must then be picklable).
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm (CUDA only: torch runs SyncBatchNorm on GPUs).
        ddp_comm_hook, ddp_comm_state, ddp_comm_wrapper: a DDP communication hook registered on the wrapper
            (`model.register_comm_hook(ddp_comm_state, ddp_comm_wrapper(ddp_comm_hook))`), as Lightning's
            DDPStrategy: fp16 compression, PowerSGD, post-local SGD (torch.distributed.algorithms.ddp_comm_hooks).
            Hooks that cannot run on this backend are refused before the first step.
        model_averaging_period: with a PostLocalSGDState as ddp_comm_state, average the parameters over the
            processes every that many optimizer steps after the state's start_localSGD_iter (torch's
            PeriodicModelAverager), as Lightning does.
        checkpoint_io: a CheckpointIO (tasktrain.plugins.io) for the checkpoint files, as Lightning's DDPStrategy.
        precision_plugin, cluster_environment: Lightning's DDPStrategy arguments: a precision plugin
            (tasktrain.plugins.precision; or precision= by name) and a ClusterEnvironment
            (tasktrain.plugins.environments), as in Trainer(plugins=[...]); parallel_devices, the devices of
            one node (one process each), as Lightning's: they win over the Trainer's devices= and accelerator=
            (CPU devices, or cuda:0 .. cuda:N-1).
        **ddp_kwargs: options of torch.nn.parallel.DistributedDataParallel (find_unused_parameters,
            static_graph, gradient_as_bucket_view, bucket_cap_mb, broadcast_buffers, ...).
    """

    name = "ddp"

    @classmethod
    def __subclasshook__(cls, subclass):
        # A DDP is an instance of DDP or of a subclass of its own, nothing else. (DDPStrategy below counts DeepSpeed
        # in, as Lightning's DeepSpeedStrategy derives from its DDPStrategy; Python's ABCs would pass that on to DDP,
        # DDPStrategy's base, which tasktrain's DeepSpeed is not.)
        if cls is DDP:
            return DDP in getattr(subclass, "__mro__", ())
        return NotImplemented

    barrier = ProcessWorld.lightning_barrier  # (Lightning's DDPStrategy.barrier(*args, **kwargs))

    def __init__(
        self,
        accelerator: Optional[Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional["ClusterEnvironment"] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[_PRECISION_PLUGIN] = None,
        ddp_comm_state: Optional[object] = None,
        ddp_comm_hook: Optional[Callable] = None,
        ddp_comm_wrapper: Optional[Callable] = None,
        model_averaging_period: Optional[int] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = timedelta(minutes=30),
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        precision=None,
        sync_batchnorm=False,
        **ddp_kwargs,
    ):
        # Lightning's DDPStrategy parameters in Lightning's order (a script may pass them by position);
        # tasktrain's own precision= (a name) and sync_batchnorm= come by keyword only, after them
        lightning_args = {name: value for name, value in (("precision_plugin", precision_plugin),
                                                          ("cluster_environment", cluster_environment),
                                                          ("parallel_devices", parallel_devices))
                          if value is not None}
        if lightning_args:
            from tasktrain.strategies.lightning import _check_common

            if lightning_args.get("precision_plugin") is not None and precision is not None:
                raise ValueError("DDP(precision=..., precision_plugin=...): give the precision once.")
            _, _, parallel_devices = _check_common("DDPStrategy", None, lightning_args.get("parallel_devices"),
                                                   lightning_args.get("cluster_environment"),
                                                   lightning_args.get("precision_plugin"))
            precision = lightning_args.get("precision_plugin") or precision
        super().__init__(accelerator=accelerator, precision=precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method)
        self.cluster_environment = lightning_args.get("cluster_environment")
        if lightning_args.get("parallel_devices") is not None:
            self.parallel_devices, self.parallel_devices_of = parallel_devices, "DDPStrategy"
        self.comm = _check_comm({"ddp_comm_state": ddp_comm_state, "ddp_comm_hook": ddp_comm_hook,
                                 "ddp_comm_wrapper": ddp_comm_wrapper,
                                 "model_averaging_period": model_averaging_period})
        self._model_averager = None  # torch's PeriodicModelAverager, with model_averaging_period
        unknown = sorted(set(ddp_kwargs) - _DDP_OPTIONS - _DDP_OWNED)
        if unknown:
            raise TypeError(f"DDP got unknown option(s) {unknown}. It takes the options of torch's "
                            f"DistributedDataParallel: {sorted(_DDP_OPTIONS)}.")
        ddp_kwargs = _given_ddp_options(ddp_kwargs)
        if start_method == "spawn":
            self.name = "ddp_spawn"
        self.sync_batchnorm = sync_batchnorm
        self.ddp_kwargs = ddp_kwargs
        self._wrappers = []  # the DDP wrappers made by setup_module_and_optimizers, released at teardown
        self._target, self._calls_steps = None, True  # what the wrapper wraps (built again when it must be)
        if checkpoint_io is not None:
            self.checkpoint_io = checkpoint_io

    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        """(Accelerate's DistributedDataParallelKwargs: its comm_hook / comm_wrapper / comm_state_option come as
        Lightning's ddp_comm_* names, tasktrain/compat/accelerate/accelerator.py.)"""
        ddp_kwargs = dict(ddp_kwargs or {})
        comm = {name: ddp_kwargs.pop(name) for name in _COMM_OPTIONS if name in ddp_kwargs}
        if comm:
            self.comm = _check_comm({**self.comm, **comm})
        if ddp_kwargs:
            unknown = sorted(set(ddp_kwargs) - _DDP_OPTIONS)
            if unknown:
                raise TypeError(f"DistributedDataParallel options {unknown} are not known; it takes "
                                f"{sorted(_DDP_OPTIONS)}.")
        super().configure_processes(process_group_backend, timeout)
        if ddp_kwargs:
            self.ddp_kwargs = {**self.ddp_kwargs, **ddp_kwargs}

    def setup_environment(self):
        super().setup_environment()
        if self.comm["ddp_comm_hook"] is not None:  # before the first step, on every rank alike
            _check_hook_runs_here(self.comm["ddp_comm_hook"], self.comm["ddp_comm_wrapper"], dist.get_backend())

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        if self.sync_batchnorm and self.accelerator_name == "cpu":
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
        # validate / test / predict: nothing to synchronise, so no DDP (Lightning's: trainer.model is the module)
        self.model = self._wrap(target) if plan.training or not plan.calls_steps else module
        return self.model, self.optimizers

    def _wrap(self, target):
        if not any(p.requires_grad for p in target.parameters()):
            # Nothing to synchronise (a frozen model in predict/validate): torch's DDP refuses such a module.
            return target
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        wrapper = torch.nn.parallel.DistributedDataParallel(target, device_ids=device_ids, **self.ddp_kwargs)
        self._wrappers.append(wrapper)
        self._register_comm_hook(wrapper)
        return wrapper

    def _register_comm_hook(self, wrapper):
        hook, state = self.comm["ddp_comm_hook"], self.comm["ddp_comm_state"]
        if hook is None:
            return
        if self.comm["ddp_comm_wrapper"] is not None:
            hook = self.comm["ddp_comm_wrapper"](hook)
        wrapper.register_comm_hook(state, hook)
        if self.comm["model_averaging_period"] is not None and self._model_averager is None:
            from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

            self._model_averager = PeriodicModelAverager(period=self.comm["model_averaging_period"],
                                                         warmup_steps=state.start_localSGD_iter)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs) -> bool:
        stepped = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._model_averager is not None and stepped:
            # post-local SGD: after its warm-up each process steps on its own gradients; every period steps the
            # parameters the optimizer moved are averaged over the processes (Lightning's rule)
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self._model_averager.average_parameters(iter(params))
        return stepped

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
    def training_step(self, *args, **kwargs):
        if not isinstance(self.model, torch.nn.parallel.DistributedDataParallel):  # (after the run: no wrapper, the
            return super().training_step(*args, **kwargs)  # module's own step, as Lightning's unwrapped model)
        with self.forward_context("training_step"):
            return self.model(*args, **kwargs)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        model = self.model
        wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        if wrapped and getattr(self, "_backward_in_forward", False):
            _prepare_for_backward(model, closure_loss)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

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


class DDPStrategy(DDP):
    """Lightning's DDPStrategy: tasktrain's DDP under Lightning's name (the same arguments and behaviour), a class of
    its own so that TaskCLI finds it by that short name (`--trainer.strategy=DDPStrategy`), as LightningCLI does.

    isinstance(strategy, DDPStrategy) answers as under Lightning: True for every DDP (Trainer(strategy="ddp") builds
    tasktrain's DDP) and for DeepSpeed (Lightning's DeepSpeedStrategy derives from its DDPStrategy: DeepSpeed is
    registered with it, deepspeed/strategy.py); FSDP and ModelParallelStrategy are not DDPStrategy, as Lightning's
    are not."""

    @classmethod
    def __subclasshook__(cls, subclass):
        if cls is DDPStrategy and DDP in getattr(subclass, "__mro__", ()):
            return True
        return NotImplemented  # (then the classes registered with it, DeepSpeed's, and a subclass's own rules)

    @classmethod
    def register_strategies(cls, strategy_registry):
        """Lightning's: register this class under Lightning's DDP names in `strategy_registry` (StrategyRegistry):
        "ddp", "ddp_spawn" and their find_unused_parameters variants (Lightning's "ddp_fork" / "ddp_notebook" names are
        refused by tasktrain: strategies/registry.py)."""
        for name, start_method in (("ddp", "popen"), ("ddp_spawn", "spawn")):
            strategy_registry.register(name, cls, description=f"DDP strategy with `start_method` '{start_method}'",
                                       start_method=start_method)
            for unused in (False, True):
                strategy_registry.register(
                    f"{name}_find_unused_parameters_{str(unused).lower()}", cls,
                    description=f"DDP strategy with `find_unused_parameters` as {unused} and `start_method` "
                                f"'{start_method}'", find_unused_parameters=unused, start_method=start_method)


def _check_comm(comm):
    """Lightning's DDPStrategy rules for the hook arguments, checked when they are given (before anything starts)."""
    hook, state = comm.get("ddp_comm_hook"), comm.get("ddp_comm_state")
    wrapper, period = comm.get("ddp_comm_wrapper"), comm.get("model_averaging_period")
    for name, value in (("ddp_comm_hook", hook), ("ddp_comm_wrapper", wrapper)):
        if value is not None and not callable(value):
            raise TypeError(f"DDP({name}={value!r}): pass a function such as torch.distributed.algorithms."
                            "ddp_comm_hooks.default_hooks.fp16_compress_hook (hook) or fp16_compress_wrapper.")
    if hook is None and (wrapper is not None or state is not None):
        raise ValueError("DDP(ddp_comm_wrapper=... / ddp_comm_state=...) without ddp_comm_hook: a wrapper and a "
                         "state act through a hook; pass ddp_comm_hook too.")
    if state is None and period is None:
        return {"ddp_comm_state": None, "ddp_comm_hook": hook, "ddp_comm_wrapper": wrapper,
                "model_averaging_period": None}
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState

    if isinstance(state, PostLocalSGDState) and period is None:
        raise ValueError("DDP(ddp_comm_state=PostLocalSGDState(...)) needs model_averaging_period (the optimizer "
                         "steps between two parameter averages), as in Lightning.")
    if period is not None:
        if not isinstance(state, PostLocalSGDState):
            raise ValueError("DDP(model_averaging_period=...) averages the parameters of post-local SGD: pass "
                             "ddp_comm_state=PostLocalSGDState(...) and ddp_comm_hook=post_localSGD_hook too.")
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"DDP(model_averaging_period={period!r}): use a positive integer.")
    return {"ddp_comm_state": state, "ddp_comm_hook": hook, "ddp_comm_wrapper": wrapper,
            "model_averaging_period": period}


def _check_hook_runs_here(hook, wrapper, backend):
    """The hooks torch cannot run on this backend, refused when DDP is set up (before the first step) with what to
    use instead. torch refuses bf16 compression outside NCCL itself, with a message naming CUDA; torch 2.13's
    batched PowerSGD fails at the first backward on every backend (its orthogonalisation asserts a batch of
    matrices and is handed one), which a probe of that function tells."""
    names = {getattr(hook, "__name__", ""), getattr(wrapper, "__name__", "")}
    if backend != "nccl" and names & {"bf16_compress_hook", "bf16_compress_wrapper", "bf16_compress_wrapper_hook"}:
        raise ValueError(f"The DDP communication hook compresses gradients to bf16, which torch runs on NCCL (CUDA) "
                         f"only, and this process group is {backend}. On CPU use fp16 compression "
                         "(DDPCommunicationHookType.FP16 / default_hooks.fp16_compress_hook).")
    if getattr(hook, "__name__", "") == "batched_powerSGD_hook" and not _batched_power_sgd_works():
        raise ValueError(f"torch {torch.__version__}'s batched_powerSGD_hook fails at the first backward (its "
                         "_orthogonalize raises on the matrix it is given). Use PowerSGD per layer "
                         "(DDPCommunicationHookType.POWER_SGD / powerSGD_hook.powerSGD_hook) instead.")


def _batched_power_sgd_works():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    try:  # what batched_powerSGD_hook hands it: one square_side x rank matrix
        powerSGD_hook._orthogonalize(torch.ones(4, 1))
    except AssertionError:
        return False
    return True


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
